#pragma once
// Selection: what one layer keeps of the reusable prefix R (tokens 0..n-1 in prefix order):
// every token of a range, one set shared by every KV head (an ITF pass, a prediction, a choice
// from the importance history), or one set per KV head (H2O). Selectors (core/selector.h)
// produce them, the LoadPlanner (core/load_planner.h) turns them into loads. A plain value.

#include <cstdint>
#include <vector>

#include "core/itf.h"

namespace kvtier {

struct Selection {
  enum class Kind { kAll, kShared, kPerHead } kind = Kind::kAll;
  std::int64_t begin = 0, end = 0;  // kAll: token range [begin, end)
  TokenSet shared;                  // kShared: sorted, unique
  std::vector<TokenSet> per_head;   // kPerHead: one sorted, unique set per KV head

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
    }
    return 0;
  }
};

}  // namespace kvtier
