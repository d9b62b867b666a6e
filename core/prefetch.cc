#include "core/prefetch.h"

namespace kvtier {

// SPEC §IV-C (Observation III): layer l's important set predicts layer l+1's.
TokenSet PredictNextLayer(const TokenSet& shared, const std::vector<TokenSet>& per_head) {
  if (!shared.empty()) return shared;
  return Union(per_head);
}

}  // namespace kvtier
