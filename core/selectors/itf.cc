// select.policy = itf: SPEC's similarity-guided important-token identification (§IV-B,
// core/itf.h). Each layer loads the probe heads' keys of R (stored redundantly, so they are
// few bytes), scores them against the new tokens' queries on the GPU and compares the probe
// heads' top-k sets: when they agree (mean Jaccard >= t = j^alpha) the layer keeps one voted
// set and loads K and V of only those rows; otherwise it falls back to the `itf.fallback`
// selector for that layer (h2o in SPEC).

#include <numeric>

#include "core/options.h"
#include "core/prefetch.h"
#include "core/selector.h"

namespace kvtier {
namespace {

class ItfSelector final : public TokenSelector {
 public:
  ItfSelector(const ModelSpec& model, const SystemOptions& system)
      : options_(system.itf_options),
        probe_heads_(system.itf_options.probe_heads),
        fallback_(NewSelector(system.itf_fallback, model, system, "itf.fallback")) {
    std::iota(probe_heads_.begin(), probe_heads_.end(), 0);
  }

  Status Select(LayerStep& step) override {
    const std::vector<OpId> probes =
        step.Load(KvKind::kProbeKey, step.AllTokens(), Purpose::kProbe);
    const OpId score = step.Score(ComputeKind::kProbeScores, options_.probe_heads, probes);
    if (Status st = step.Wait(score); !st.ok()) return st;
    ItfDecision d = step.scores().Itf(step.request(), step.layer(), step.reused_tokens(),
                                      probe_heads_, options_);
    step.RecordItf(d);
    if (d.fallback) return fallback_->Select(step);
    step.kept.kind = Selection::Kind::kShared;
    step.kept.shared = std::move(d.voted);
    step.Load(KvKind::kKey, step.kept, Purpose::kDemand);
    step.Load(KvKind::kValue, step.kept, Purpose::kDemand);
    return Status::OK();
  }

  // SPEC §IV-C: the next layer's probe keys first (they gate its ITF decision: io classes
  // probe > prefetch), then K and V of the tokens this layer kept (Observation III: adjacent
  // layers keep similar tokens; a fallback layer's per-head sets predict their union).
  void Prefetch(LayerStep& step) override {
    const std::vector<OpId> loaded = step.submitted();
    std::vector<OpId> probes_done =
        step.Prefetch(KvKind::kProbeKey, step.AllTokens(), Purpose::kProbe, loaded);
    probes_done.insert(probes_done.end(), loaded.begin(), loaded.end());
    Selection predicted;
    if (step.kept.kind == Selection::Kind::kAll) {
      predicted = step.kept;  // a fallback that keeps everything predicts everything
    } else {
      predicted.kind = Selection::Kind::kShared;
      predicted.shared = PredictNextLayer(step.kept.shared, step.kept.per_head);
    }
    step.Prefetch(KvKind::kKey, predicted, Purpose::kPrefetch, probes_done);
    step.Prefetch(KvKind::kValue, predicted, Purpose::kPrefetch, probes_done);
  }

 private:
  ItfOptions options_;
  std::vector<int> probe_heads_;  // the first probe_heads KV heads
  std::unique_ptr<TokenSelector> fallback_;
};

}  // namespace

std::unique_ptr<TokenSelector> NewItfSelector(const ModelSpec& model, const SystemOptions& system) {
  return std::make_unique<ItfSelector>(model, system);
}

}  // namespace kvtier
