#pragma once
// Selection: what one layer keeps of the reusable prefix R (tokens 0..n-1 in prefix order):
// every token of a range, one set shared by every KV head (an ITF pass, a prediction, a choice
// from the importance history), or one set per KV head (H2O) -- as the sets themselves or, what
// the loads and the importance history read of them, their union with the number of heads
// keeping each token (kCounted: a selection memo stores that, traces/selection_memo.h).
// Selectors (core/selector.h) produce them, the LoadPlanner (core/load_planner.h) turns them
// into loads. A plain value.

#include <cstdint>
#include <vector>

#include "core/itf.h"

namespace kvtier {

struct Selection {
  enum class Kind { kAll, kShared, kPerHead, kCounted } kind = Kind::kAll;
  std::int64_t begin = 0, end = 0;  // kAll: token range [begin, end)
  TokenSet shared;                  // kShared: sorted, unique; kCounted: the heads' union
  std::vector<TokenSet> per_head;   // kPerHead: one sorted, unique set per KV head
  std::vector<std::uint16_t> counts;  // kCounted: heads keeping shared[i], each >= 1
  int heads = 0;                      // kCounted: the KV heads counted

  // The kCounted form of per-head sets over n tokens: what every use of a kPerHead selection
  // reads (the union's rows, the sum of the heads' rows per chunk, each token's share of heads)
  // gives the same values from it.
  static Selection Counted(const std::vector<TokenSet>& per_head, std::int64_t n) {
    std::vector<std::uint16_t> of(static_cast<std::size_t>(n), 0);
    for (const TokenSet& head : per_head) {
      for (std::int32_t t : head) ++of[static_cast<std::size_t>(t)];
    }
    return FromCounts(of, static_cast<int>(per_head.size()));
  }
  // The kCounted selection of `heads` heads where of[t] heads keep token t.
  static Selection FromCounts(const std::vector<std::uint16_t>& of, int heads) {
    Selection s;
    s.kind = Kind::kCounted;
    s.heads = heads;
    CollectCounted(of, &s.shared, &s.counts);
    return s;
  }

  // Every token of [begin, end).
  static Selection All(std::int64_t begin, std::int64_t end) {
    Selection s;
    s.begin = begin;
    s.end = end;
    return s;
  }

  // Tokens kept per head, averaged over heads for kPerHead.
  double Kept() const {
    switch (kind) {
      case Kind::kAll: return double(end - begin);
      case Kind::kShared: return double(shared.size());
      case Kind::kPerHead: {
        double sum = 0;
        for (const auto& s : per_head) sum += double(s.size());
        return per_head.empty() ? 0 : sum / double(per_head.size());
      }
      case Kind::kCounted: {
        std::int64_t sum = 0;  // an integer: the same double as kPerHead's sum of sizes
        for (std::uint16_t c : counts) sum += c;
        return heads == 0 ? 0 : double(sum) / double(heads);
      }
    }
    return 0;
  }
};

}  // namespace kvtier
