#include "sim/simulate.h"

#include <cstdio>
#include <memory>
#include <optional>

#include "analysis/results_db.h"
#include "core/errors.h"
#include "core/options.h"
#include "core/selector.h"
#include "driver/experiment.h"
#include "sim/serve.h"
#include "sim/sim_executor.h"
#include "traces/selection_memo.h"

namespace kvtier::sim {
namespace {

// What the simulator does differently around the experiment driver (driver/experiment.h): the
// SimGrid executor, gpu.concurrent_prefills requests served at once (sim/serve.h), and the ITF
// decisions and H2O's selections remembered per trace across runs (traces/selection_memo.h).
class SimBackend : public ExperimentBackend {
 public:
  SimBackend(const ExperimentOptions& opts, ComputeTimer timer)
      : opts_(opts), executor_(opts.model, opts.hardware, std::move(timer)) {}

  const char* mode() const override { return "sim"; }
  const char* end_time_metric() const override { return "simulated_s"; }
  Executor& executor() override { return executor_; }

  void ConfigurePipeline(PipelineOptions* options) override {
    options->chunk_detail = false;  // the simulator needs byte totals only
    options->max_in_flight = opts_.hardware.gpu_concurrent_prefills;
  }

  void BeginRun(const RunInfo& info, TraceScoreSource* scores) override {
    const std::string dir = SelectionMemo::DefaultDir();
    if (dir.empty()) return;
    if (FindSelector(opts_.system.select).probe_keys) {
      memo_ = SelectionMemo::Open(
          dir,
          SelectionMemo::MakeKey(info.trace_sha256, opts_.model, opts_.importance,
                                 opts_.system.itf_options.retention,
                                 opts_.system.itf_options.probe_heads),
          opts_.model.layers);
      scores->UseMemo(memo_.get());
    }
    // A sampled H2O selection (workload.h2o_selection) is O(n) a layer: nothing to remember.
    if (UsesPerHeadTopK(opts_.system) && opts_.model.kv_heads <= 255 && !opts_.h2o_sampled) {
      h2o_memo_ = SelectionMemo::Open(
          dir,
          SelectionMemo::MakeH2oKey(info.trace_sha256, opts_.model, opts_.importance,
                                    opts_.system.retention),
          opts_.model.layers);
      scores->UseH2oMemo(h2o_memo_.get());
    }
  }

  ServeOutcome Serve(Pipeline& pipeline, const NextFn& next, const DoneFn& done) override {
    const ServeResult served =
        ServeRequests(executor_, pipeline, opts_.hardware.gpu_concurrent_prefills, next, done);
    return {served.requests, served.simulated_s, served.finish};
  }

  void EndServing() override {
    if (memo_) memo_->Finish();
    if (h2o_memo_) h2o_memo_->Finish();
  }

  void LogMetrics(RunLog& log) override {
    if (memo_) {
      log.LogMetric("selection_memo_reused_layers", double(memo_->stats().reused));
      log.LogMetric("selection_memo_computed_layers", double(memo_->stats().computed));
    }
    if (h2o_memo_) {
      log.LogMetric("h2o_memo_reused_layers", double(h2o_memo_->stats().reused));
      log.LogMetric("h2o_memo_computed_layers", double(h2o_memo_->stats().computed));
    }
    log.LogMetric("activities", double(executor_.activities_started()));
  }

  const SimExecutor& sim_executor() const { return executor_; }
  const SelectionMemo* memo() const { return memo_.get(); }
  const SelectionMemo* h2o_memo() const { return h2o_memo_.get(); }

 private:
  const ExperimentOptions& opts_;
  SimExecutor executor_;
  std::unique_ptr<SelectionMemo> memo_;
  std::unique_ptr<SelectionMemo> h2o_memo_;
};

}  // namespace

SimulationResult RunSimulation(const Config& config, const std::string& trace_path,
                               const std::string& out_path, const ProgressFn& progress) {
  Experiment experiment(config, trace_path, out_path);
  const ExperimentOptions& opts = experiment.options();
  // gpu.concurrent_prefills <= TieredCache::kMaxHolders was checked by BuildOptions.
  // Read the measured layer table (if any) before touching the output: a bad one is exit 2.
  std::optional<ComputeTimer> timer;
  try {
    timer.emplace(ComputeTimer::FromOptions(opts.model, opts.hardware));
  } catch (const ConfigError& e) {
    throw ConfigError(config.Where("gpu.layer_table") + ": " + e.what());
  }
  if (const std::string note = timer->MissingKindsNote(); !note.empty()) {
    std::fprintf(stderr, "kvtier sim: %s\n", note.c_str());
  }
  experiment.CheckTrace();

  SimBackend backend(opts, std::move(*timer));
  const ExperimentResult r = experiment.Run(backend, progress);
  SimulationResult result;
  result.run_id = r.run_id;
  result.requests = r.requests;
  result.simulated_s = r.end_s;
  result.wall_s = r.wall_s;
  result.activities = backend.sim_executor().activities_started();
  if (const SelectionMemo* memo = backend.memo()) {
    result.memo_reused_layers = memo->stats().reused;
    result.memo_computed_layers = memo->stats().computed;
  }
  if (const SelectionMemo* memo = backend.h2o_memo()) {
    result.h2o_memo_reused_layers = memo->stats().reused;
    result.h2o_memo_computed_layers = memo->stats().computed;
  }
  return result;
}

}  // namespace kvtier::sim
