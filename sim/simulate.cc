#include "sim/simulate.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>

#include "analysis/results_db.h"
#include "core/errors.h"
#include "core/options.h"
#include "core/pipeline.h"
#include "sim/serve.h"
#include "sim/sim_executor.h"
#include "traces/score_source.h"
#include "traces/selection_memo.h"
#include "traces/trace_io.h"

namespace kvtier::sim {

SimulationResult RunSimulation(const Config& config, const std::string& trace_path,
                               const std::string& out_path, const ProgressFn& progress) {
  const auto wall_start = std::chrono::steady_clock::now();
  const ExperimentOptions opts = BuildOptions(config);
  // Each concurrent prefill is an in-flight request holding a pin slot of the caches.
  if (opts.hardware.gpu_concurrent_prefills > TieredCache::kMaxHolders) {
    throw ConfigError(config.Where("gpu.concurrent_prefills") + ": at most " +
                      std::to_string(TieredCache::kMaxHolders) + " concurrent prefills, got " +
                      std::to_string(opts.hardware.gpu_concurrent_prefills));
  }
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

  // Open and check the trace before touching the output.
  const ReplaySetup replay = PrepareReplay(trace_path, config, opts);
  const TraceHeader& header = replay.header;
  const std::optional<ProceduralParams>& none_model = replay.none_model;

  ResultsDb db(out_path);
  const RunInfo info = MakeRunInfo("sim", config, opts, trace_path);
  const long long run_id = db.BeginRun(info);
  std::unique_ptr<RunLog> db_log = db.NewRunLog(run_id, config.GetBool("log.transfers"));
  RunLog& log = *db_log;

  SimExecutor executor(opts.model, opts.hardware, std::move(*timer));
  TraceScoreSource scores(header, opts.model, none_model);
  // ITF decisions are remembered per trace across runs (traces/selection_memo.h).
  std::unique_ptr<SelectionMemo> memo;
  if (const std::string dir = SelectionMemo::DefaultDir(); opts.system.itf && !dir.empty()) {
    memo = SelectionMemo::Open(
        dir,
        SelectionMemo::MakeKey(info.trace_sha256, opts.model, opts.importance,
                               opts.system.itf_options.retention,
                               opts.system.itf_options.probe_heads),
        opts.model.layers);
    scores.UseMemo(memo.get());
  }
  PipelineOptions popts;
  popts.system = opts.system;
  popts.log_chunk_decisions = config.GetBool("log.chunk_decisions");
  popts.chunk_detail = false;  // the simulator needs byte totals only
  popts.max_in_flight = opts.hardware.gpu_concurrent_prefills;
  Pipeline pipeline(opts.model, popts, &executor, &scores, &log);

  long long total = 0;  // for progress only; 0 when the trace does not say
  try {
    total = std::stoll(header.Meta("requests", "0"));
  } catch (const std::logic_error&) {
  }
  if (opts.run.max_requests > 0 && (total == 0 || total > opts.run.max_requests)) {
    total = opts.run.max_requests;
  }
  SimulationResult result;
  result.run_id = run_id;
  // The first run-time failure stops the run (none is expected: the simulator's operations
  // never fail, but the pipeline's own checks are honoured the same way as in hw).
  Status failure;
  const long long max = opts.run.max_requests;
  if (opts.run.prewarm) {  // no simulated time passes: before the actors start
    TraceReader warm(trace_path);
    TraceRecord rec;
    for (long long i = 0; warm.Next(&rec) && (max == 0 || i < max); ++i) {
      pipeline.Prewarm(rec.request);
    }
  }
  // Requests are taken in trace (arrival) order by gpu.concurrent_prefills workers
  // (sim/serve.h); their importance is registered when taken, so in trace order.
  TraceReader reader(trace_path);
  long long taken = 0, done = 0;
  const ServeResult served = ServeRequests(
      executor, pipeline, opts.hardware.gpu_concurrent_prefills,
      [&](ServeItem* item) {
        TraceRecord rec;
        if (!failure.ok() || (max != 0 && taken >= max) || !reader.Next(&rec)) return false;
        item->request = rec.request;
        item->warmup = taken < opts.run.warmup_requests;
        ++taken;
        scores.Add(std::move(rec));
        return true;
      },
      [&](const ServeItem& item, const Status& st) {
        scores.Release(item.request.id);
        if (!st.ok() && failure.ok()) failure = st;
        ++done;
        if (progress) progress(done, total, executor.Now());
      });
  if (failure.ok()) failure = served.finish;
  result.requests = served.requests;
  result.simulated_s = served.simulated_s;
  result.activities = executor.activities_started();
  if (memo) {
    memo->Finish();
    result.memo_reused_layers = memo->stats().reused;
    result.memo_computed_layers = memo->stats().computed;
    log.LogMetric("selection_memo_reused_layers", double(memo->stats().reused));
    log.LogMetric("selection_memo_computed_layers", double(memo->stats().computed));
  }
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  log.LogMetric("simulated_s", result.simulated_s);
  log.LogMetric("wall_s", result.wall_s);
  log.LogMetric("activities", double(result.activities));
  log.Close();  // writes the last batch; throws (run stays incomplete) if it cannot
  db_log.reset();
  if (!failure.ok()) {
    db.FailRun(run_id, result.wall_s, failure.ToString());
    throw RunFailed("system " + opts.system.name + ", run " + std::to_string(run_id) + ": " +
                    failure.ToString());
  }
  db.EndRun(run_id, result.wall_s);
  return result;
}

}  // namespace kvtier::sim
