#pragma once
// Layer-aware speculative prefetch (SPEC §IV-C): important-token sets of adjacent layers are
// similar (Observation III), so while layer l computes, the tokens selected for layer l are
// prefetched for layer l+1. Once layer l+1's own set is known, the misses are loaded on
// demand. PrefetchLedger keeps the accounting: which prefetched chunks were used by the layer
// they were fetched for and which were wasted. Pure bookkeeping; no I/O, no clock.

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "core/itf.h"
#include "core/types.h"

namespace kvtier {

// The prediction for layer l+1 from layer l's selection: the shared set when ITF passed, else
// the union of the per-head sets (every head's tokens are worth having). ITF passed iff
// `shared` is non-empty (a passing ItfDecision always votes k >= 1 tokens): pass an empty
// `shared` for fallback layers and for the per-head baselines.
TokenSet PredictNextLayer(const TokenSet& shared, const std::vector<TokenSet>& per_head);

class PrefetchLedger {
 public:
  // Records that `chunk` was prefetched for `layer` (twice counts once). REQUIRES: 0 <= layer <
  // kMaxLayers.
  void Prefetched(int layer, ChunkId chunk);
  // True if `chunk` was prefetched for `layer` (and not yet settled).
  bool WasPrefetched(int layer, ChunkId chunk) const;
  // Settles `layer`: `needed` are the chunks the layer actually used. Returns {prefetched,
  // used}; prefetched - used were wasted. Forgets the layer. A chunk listed twice in `needed`
  // counts once; needed chunks that were not prefetched are misses and count in neither.
  struct Settlement {
    std::int64_t prefetched = 0;
    std::int64_t used = 0;
  };
  Settlement Settle(int layer, const std::vector<ChunkId>& needed);
  // Totals over all settled layers.
  std::int64_t total_prefetched() const { return total_prefetched_; }
  std::int64_t total_used() const { return total_used_; }
  // Back to the initial state: forgets unsettled layers and zeroes the totals.
  void Clear();

 private:
  std::vector<std::unordered_set<ChunkId>> by_layer_;
  std::int64_t total_prefetched_ = 0;
  std::int64_t total_used_ = 0;
};

}  // namespace kvtier
