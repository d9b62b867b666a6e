#include "core/reorderer.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/radix_tree.h"

namespace kvtier {

Reorderer::Reorderer(double history_weight, int min_accesses)
    : history_weight_(history_weight), min_accesses_(min_accesses) {}

void Reorderer::Record(std::uint32_t segment, std::int64_t segment_tokens, std::int64_t offset,
                       std::span<const float> importance) {
  Stats& s = stats_[segment];
  if (s.mean.empty()) {
    s.mean.assign(static_cast<std::size_t>(segment_tokens), 0.0f);
    s.seen.assign(static_cast<std::size_t>(segment_tokens), 0);
  }
  KVTIER_DCHECK(offset + std::int64_t(importance.size()) <= segment_tokens,
                "reorderer: access past the segment end");
  const float w = static_cast<float>(history_weight_);
  for (std::size_t i = 0; i < importance.size(); ++i) {
    std::size_t o = static_cast<std::size_t>(offset) + i;
    s.mean[o] = s.seen[o] ? w * s.mean[o] + (1 - w) * importance[i] : importance[i];
    s.seen[o] = 1;
  }
  ++s.accesses;
}

std::vector<std::uint32_t> Reorderer::Due(const RadixTree& tree) const {
  std::vector<std::uint32_t> due;
  for (const auto& [id, s] : stats_) {
    if (s.accesses < min_accesses_) continue;
    const Segment* seg = tree.FindSegment(id);
    if (seg == nullptr) continue;
    // Worth repacking only if some node range's importance order differs from its stored order.
    bool differs = false;
    for (const auto& [begin, end] : tree.NodeRanges(id)) {
      std::vector<std::int64_t> by_stored(static_cast<std::size_t>(end - begin));
      std::iota(by_stored.begin(), by_stored.end(), begin);
      std::sort(by_stored.begin(), by_stored.end(), [&](std::int64_t a, std::int64_t b) {
        return seg->StoredPosition(a) < seg->StoredPosition(b);
      });
      for (std::size_t i = 1; i < by_stored.size() && !differs; ++i) {
        differs = s.mean[static_cast<std::size_t>(by_stored[i])] >
                  s.mean[static_cast<std::size_t>(by_stored[i - 1])];
      }
      if (differs) break;
    }
    if (differs) due.push_back(id);
  }
  std::sort(due.begin(), due.end());
  return due;
}

std::span<const float> Reorderer::MeanImportance(std::uint32_t segment) const {
  auto it = stats_.find(segment);
  if (it == stats_.end()) return {};
  return it->second.mean;
}

void Reorderer::Repacked(std::uint32_t old_id, std::uint32_t new_id) {
  auto it = stats_.find(old_id);
  if (it == stats_.end()) return;
  Stats s = std::move(it->second);
  stats_.erase(it);
  s.accesses = 0;
  stats_[new_id] = std::move(s);
}

}  // namespace kvtier
