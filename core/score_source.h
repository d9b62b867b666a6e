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

#include "core/itf.h"
#include "core/request.h"
#include "core/selection.h"

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

  // SPEC's ITF decision for `layer` (core/itf.h SelectItf on the probe heads' scores). The
  // default asks Scores() for the probe heads and runs SelectItf without the per-head sets
  // (ItfDecisionOnly: `probe_sets` is left empty, the Pipeline does not use them). A source
  // that already knows the answer (traces/ TraceScoreSource with a selection memo) overrides
  // it; its answer must be the default's.
  // REQUIRES: as Scores(); reused_tokens >= 1.
  virtual ItfDecision Itf(const Request& request, int layer, std::int64_t reused_tokens,
                          std::span<const int> probe_heads, const ItfOptions& options) {
    Scores(request, layer, reused_tokens, probe_heads, &probe_scores_);
    return ItfDecisionOnly(probe_scores_, static_cast<int>(probe_heads.size()), reused_tokens,
                           options, /*always_vote=*/false);
  }

  // H2O's selection for `layer`: each of `heads` keeps its top `k` tokens (core/itf.h
  // SelectPerHead on Scores() of those heads, counted by CountTopKPerHead), as a kCounted
  // selection (core/selection.h). A source that already knows the answer (TraceScoreSource with
  // an H2O selection memo) overrides it; its answer must be the default's.
  // REQUIRES: as Scores(); 1 <= k <= reused_tokens.
  virtual Selection TopKPerHead(const Request& request, int layer, std::int64_t reused_tokens,
                                std::span<const int> heads, std::int64_t k) {
    Scores(request, layer, reused_tokens, heads, &head_scores_);
    CountTopKPerHead(head_scores_, static_cast<int>(heads.size()), reused_tokens, k,
                     &head_counts_);
    return Selection::FromCounts(head_counts_, static_cast<int>(heads.size()));
  }

 private:
  std::vector<float> probe_scores_;         // Itf()'s scratch
  std::vector<float> head_scores_;          // TopKPerHead()'s scratch
  std::vector<std::uint16_t> head_counts_;  // TopKPerHead()'s scratch
};

}  // namespace kvtier
