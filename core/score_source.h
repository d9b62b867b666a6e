#pragma once
// ScoreSource: where importance comes from. Importance of a reusable prefix token for a KV
// head is the H2O metric — the column sum of the attention weights of the query rows over that
// token, summed over the query heads that share the KV head (SPEC §IV-A, "Importance metric").
//   - traces/ TraceScoreSource: scores recorded in a trace or regenerated from its seed (sim,
//     and hw replay);
//   - hw with a real model: computed by the kernels from the real keys.
// The Pipeline asks for a layer's scores only after the inputs that the real computation would
// need are in place (probe keys loaded, previous layer computed), so a source backed by real
// computation can compute them on demand.

#include <span>
#include <vector>

#include "core/request.h"

namespace kvtier {

class ScoreSource {
 public:
  virtual ~ScoreSource() = default;

  // Fills `out` (resized to kv_heads.size() * reused_tokens) with the importance of the first
  // `reused_tokens` prefix tokens of `request` (original order) in `layer`, one row of
  // `reused_tokens` scores per entry of `kv_heads`. Scores are finite and >= 0.
  // REQUIRES: 0 <= layer < model layers; every head < model kv_heads;
  //           reused_tokens <= request.prefix_tokens().
  virtual void Scores(const Request& request, int layer, std::int64_t reused_tokens,
                      std::span<const int> kv_heads, std::vector<float>* out) = 0;
};

}  // namespace kvtier
