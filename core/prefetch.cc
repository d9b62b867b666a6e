#include "core/prefetch.h"

#include "core/check.h"

namespace kvtier {

// SPEC §IV-C (Observation III): layer l's important set predicts layer l+1's.
TokenSet PredictNextLayer(const TokenSet& shared, const std::vector<TokenSet>& per_head) {
  if (!shared.empty()) return shared;
  return Union(per_head);
}

void PrefetchLedger::Prefetched(int layer, ChunkId chunk) {
  KVTIER_CHECK(layer >= 0 && static_cast<std::uint32_t>(layer) < kMaxLayers,
               "PrefetchLedger: layer out of range");
  if (by_layer_.size() <= static_cast<std::size_t>(layer)) by_layer_.resize(layer + 1);
  by_layer_[layer].insert(chunk);
}

bool PrefetchLedger::WasPrefetched(int layer, ChunkId chunk) const {
  if (layer < 0 || static_cast<std::size_t>(layer) >= by_layer_.size()) return false;
  return by_layer_[layer].count(chunk) != 0;
}

PrefetchLedger::Settlement PrefetchLedger::Settle(int layer, const std::vector<ChunkId>& needed) {
  Settlement s;
  if (layer < 0 || static_cast<std::size_t>(layer) >= by_layer_.size()) return s;
  std::unordered_set<ChunkId>& fetched = by_layer_[layer];
  s.prefetched = static_cast<std::int64_t>(fetched.size());
  // Erasing as we go counts a chunk listed twice in `needed` once.
  for (ChunkId c : needed) s.used += static_cast<std::int64_t>(fetched.erase(c));
  fetched.clear();
  total_prefetched_ += s.prefetched;
  total_used_ += s.used;
  return s;
}

void PrefetchLedger::Clear() {
  by_layer_.clear();
  total_prefetched_ = 0;
  total_used_ = 0;
}

}  // namespace kvtier
