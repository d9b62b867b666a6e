#include "core/reorderer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/radix_tree.h"

namespace kvtier {

Reorderer::Reorderer(double history_weight, int min_accesses, int chunk_tokens, double retention,
                     double min_gain)
    : history_weight_(history_weight), min_accesses_(min_accesses), chunk_tokens_(chunk_tokens),
      retention_(retention), min_gain_(min_gain) {}

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
  std::vector<std::int64_t> order;
  std::vector<std::uint32_t> touched;
  for (const auto& [id, s] : stats_) {
    if (s.accesses < min_accesses_) continue;
    const Segment* seg = tree.FindSegment(id);
    if (seg == nullptr) continue;
    // Chunks the important tokens (top retention share of each node range, by mean importance)
    // touch in the current layout, against a repack that packs them first (SPEC §IV-D1).
    std::int64_t now = 0, packed = 0;
    for (const auto& [begin, end] : tree.NodeRanges(id)) {
      order.resize(static_cast<std::size_t>(end - begin));
      std::iota(order.begin(), order.end(), begin);
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        return s.mean[static_cast<std::size_t>(a)] > s.mean[static_cast<std::size_t>(b)];
      });
      const std::int64_t k = std::max<std::int64_t>(
          1, static_cast<std::int64_t>(std::ceil(retention_ * double(end - begin))));
      touched.clear();
      for (std::int64_t i = 0; i < k; ++i) touched.push_back(seg->ChunkOf(order[std::size_t(i)], chunk_tokens_));
      std::sort(touched.begin(), touched.end());
      now += std::unique(touched.begin(), touched.end()) - touched.begin();
      packed += (k + chunk_tokens_ - 1) / chunk_tokens_;
    }
    if (now == 0) continue;
    const double gain = 1.0 - double(packed) / double(now);
    if (packed < now && gain >= min_gain_) due.push_back(id);
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
