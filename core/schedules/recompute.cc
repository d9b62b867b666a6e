// schedule.policy = recompute: no reuse (ReComp). Every layer computes the whole prefix and
// the query; nothing is looked up, loaded or stored. Pipeline::Run also uses it for a request
// with nothing reusable.

#include "core/options.h"
#include "core/request_run.h"
#include "core/schedule.h"

namespace kvtier {
namespace {

class RecomputeSchedule final : public Schedule {
 public:
  Status Prefill(RequestRun& run) override {
    OpId prev = kNoOp;
    const std::int64_t all = run.request().prefix_tokens() + run.q;
    for (int l = 0; l < run.model().layers; ++l) {
      ComputeOp op;
      op.kind = ComputeKind::kLayerPrefill;
      op.layer = l;
      op.new_tokens = all;
      op.context_tokens = all;
      prev = run.SubmitCompute(op, {prev});
      run.layer_compute[std::size_t(l)] = prev;
      run.layer_gpu_ops[std::size_t(l)] = {prev};
      LayerRecord lr;
      lr.request_id = run.id();
      lr.layer = l;
      run.layers.push_back(lr);
    }
    return Status::OK();
  }
};

}  // namespace

std::unique_ptr<Schedule> NewRecomputeSchedule(const ModelSpec&, const SystemOptions&,
                                               TokenSelector*) {
  return std::make_unique<RecomputeSchedule>();
}

}  // namespace kvtier
