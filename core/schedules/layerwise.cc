// schedule.policy = layerwise: one layer after the other (SPEC §IV-A's dataflow and the
// layer-wise baselines). For layer l the selector loads what the layer keeps of R (through a
// LayerStep); with prefetch.mode = layer it then submits what layer l+1 is predicted to need
// (after layer l's own loads: demand has priority over speculation, as the io engine's
// classes give it on hardware; a fluid simulator would otherwise share the SSD and PCIe
// equally); then layer l computes NR + Q attending to the kept rows, NR and Q. With
// prefetch.mode = none a layer's loads wait for the previous layer's compute.

#include <cmath>

#include "core/options.h"
#include "core/request_run.h"
#include "core/schedule.h"
#include "core/selector.h"

namespace kvtier {

// Not in an anonymous namespace: LayerStep names it as the one class that reads what a layer
// submitted.
class LayerwiseSchedule final : public Schedule {
 public:
  LayerwiseSchedule(const SystemOptions& system, TokenSelector* selector)
      : selector_(selector), overlap_(system.prefetch == PrefetchMode::kLayer) {}

  Status Prefill(RequestRun& run) override {
    const int layers = run.model().layers;
    const std::int64_t new_tokens = run.nr + run.q;
    OpId prev_compute = kNoOp;
    for (int l = 0; l < layers; ++l) {
      LayerStep step(run, l, prev_compute, overlap_);
      if (Status st = selector_->Select(step); !st.ok()) return st;
      // Layer-aware prefetch for l+1, submitted before layer l's compute (SPEC §IV-C).
      if (overlap_ && l + 1 < layers) selector_->Prefetch(step);
      // Importance of each reused token for the reorderer: the share of this layer's kept sets.
      run.Keep(step.kept);

      LayerRecord& lr = step.record_;
      const std::int64_t kept = std::llround(step.kept.Kept());
      lr.selected_tokens = kept;
      run.rec.important_tokens += kept;
      ComputeOp op;
      op.kind = ComputeKind::kLayerPrefill;
      op.layer = l;
      op.new_tokens = new_tokens;
      op.context_tokens = kept + new_tokens;
      step.deps_.push_back(prev_compute);
      prev_compute = run.SubmitCompute(op, std::move(step.deps_));
      step.gpu_ops_.push_back(prev_compute);
      run.layer_compute[std::size_t(l)] = prev_compute;
      run.layer_gpu_ops[std::size_t(l)] = std::move(step.gpu_ops_);
      run.layers.push_back(lr);
    }
    return Status::OK();
  }

 private:
  TokenSelector* selector_;
  bool overlap_;
};

std::unique_ptr<Schedule> NewLayerwiseSchedule(const ModelSpec&, const SystemOptions& system,
                                               TokenSelector* selector) {
  return std::make_unique<LayerwiseSchedule>(system, selector);
}

}  // namespace kvtier
