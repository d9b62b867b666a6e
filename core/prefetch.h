#pragma once
// Layer-aware speculative prefetch (SPEC §IV-C): important-token sets of adjacent layers are
// similar (Observation III), so while layer l computes, the tokens selected for layer l are
// prefetched for layer l+1. Once layer l+1's own set is known, the misses are loaded on
// demand (the Pipeline's per-request prefetch table settles what was used).

#include <vector>

#include "core/itf.h"

namespace kvtier {

// The prediction for layer l+1 from layer l's selection: the shared set when ITF passed, else
// the union of the per-head sets (every head's tokens are worth having). ITF passed iff
// `shared` is non-empty (a passing ItfDecision always votes k >= 1 tokens): pass an empty
// `shared` for fallback layers and for the per-head baselines.
TokenSet PredictNextLayer(const TokenSet& shared, const std::vector<TokenSet>& per_head);

}  // namespace kvtier
