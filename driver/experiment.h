#pragma once
// Experiment: the one experiment driver of both modes. It replays one trace through one system
// (one resolved configuration) and writes it as one run into a results database; `kvtier sim`
// (sim/simulate.cc) and `kvtier hw` (hw/run_hw.cc) call it with their own ExperimentBackend,
// which supplies the executor and what the mode does differently. What the driver does, in
// order, the same for both modes:
//
//   1. Experiment(): the typed options (BuildOptions).         errors: ConfigError (exit 2)
//   2. CheckTrace(): opens and checks the trace (PrepareReplay), before anything is written.
//   3. Run(backend):
//      - the run row (RunInfo, complete = 0) and its run log in the results database;
//      - the trace's score source, then backend.BeginRun (the simulator's selection memo);
//      - the Pipeline on backend.executor();
//      - run.prewarm: every prefix of the trace (up to run.max_requests) stored and the caches
//        filled (SPEC §VI-B), then backend.BeforeServing (hw copies the chunks to its store);
//      - backend.Serve: requests taken in trace (arrival) order, each started at its arrival;
//        the first run.warmup_requests are served but excluded from statistics; progress
//        after each; the first failure stops taking requests (those in flight finish);
//      - Pipeline::Finish (background work), then the metrics: the end time under the mode's
//        name (simulated_s, measured_s), wall_s, and backend.LogMetrics;
//      - the end of the run: the last batch written, then the run marked complete (status
//        'ok'), or, after a run-time failure, failed (complete = 0, status 'failed', the error)
//        and RunFailed thrown (exit 3). Bad input met only while serving (a trace record
//        corrupted past CheckTrace's checks) also marks the run failed, with its error, and
//        is rethrown as it was (exit 2): a resumed sweep reports the point, as any failed one,
//        instead of taking it for a killed point and running it into the same error again.
//
// Which backends exist and what they differ in: sim/simulate.cc (SimGrid executor, concurrent
// prefills as actors, the selection memo) and hw/run_hw.cc (the hardware executor and its chunk
// store, the store filled at prewarm, environment metrics). The driver depends on core, traces
// and analysis only, so neither mode links the other's libraries (docs/architecture.md).
//
// Not thread-safe; one Experiment per run, one Run per Experiment.

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "core/config.h"
#include "core/executor.h"
#include "core/options.h"
#include "core/pipeline.h"
#include "core/request.h"
#include "core/run_log.h"
#include "core/status.h"
#include "traces/score_source.h"

namespace kvtier {

class ResultsDb;
struct RunInfo;

// One request handed to a backend to serve.
struct ReplayItem {
  Request request;
  bool warmup = false;  // excluded from statistics (run.warmup_requests)
};

// What a backend's Serve reports.
struct ServeOutcome {
  long long requests = 0;  // requests served
  Seconds end_s = 0;       // executor time when the last request and the background work ended
  Status finish;           // Pipeline::Finish's status (a background failure)
};

// Progress of a run: requests done, requests in total (0 if unknown), executor seconds.
using ReplayProgressFn = std::function<void(long long, long long, double)>;

// What a mode supplies to the driver. The driver calls, in order: BeginRun, ConfigurePipeline,
// executor() (to build the Pipeline), BeforeServing, Serve, EndServing, LogMetrics. The
// backend outlives Run. Methods may throw (InputError before serving, std::exception for
// internal errors); the run then stays incomplete.
class ExperimentBackend {
 public:
  virtual ~ExperimentBackend() = default;

  // runs.mode: "sim" or "hw".
  virtual const char* mode() const = 0;
  // The metric the run's end time is logged under ("simulated_s", "measured_s").
  virtual const char* end_time_metric() const = 0;
  // The executor the Pipeline drives. Valid while the backend lives.
  virtual Executor& executor() = 0;

  // Sets what the mode decides of the pipeline's options (chunk_detail, max_in_flight); the
  // driver has set system and log_chunk_decisions from the configuration.
  virtual void ConfigurePipeline(PipelineOptions* options) = 0;
  // The run row exists (`info`: its trace hash, its configuration); `scores` is the run's
  // score source, before any request is added to it.
  virtual void BeginRun(const RunInfo& info, TraceScoreSource* scores) {}
  // Before the first request; `prewarmed`: run.prewarm stored every prefix in `pipeline`. A
  // failure (e.g. the hardware's store refused a chunk) stops the run before it serves any
  // request and fails it like a request's failure.
  virtual Status BeforeServing(const Pipeline& pipeline, bool prewarmed) { return Status::OK(); }

  // Serves requests through `pipeline`: calls next(&item) for the next request in arrival
  // order until it returns false, starts each no earlier than its arrival_s, calls
  // done(item, status) when Pipeline::Run returned for it; after the last one, Pipeline::Finish
  // and waits until the executor has nothing running. May serve several requests at once
  // (the simulator's gpu.concurrent_prefills); next and done are then called in turn, never
  // concurrently.
  using NextFn = std::function<bool(ReplayItem*)>;
  using DoneFn = std::function<void(const ReplayItem&, const Status&)>;
  virtual ServeOutcome Serve(Pipeline& pipeline, const NextFn& next, const DoneFn& done) = 0;

  // After serving, before wall_s is measured (the simulator writes its selection memo here).
  virtual void EndServing() {}
  // Logs the mode's own metrics (the driver has logged the end time and wall_s).
  virtual void LogMetrics(RunLog& log) = 0;
};

// What Run reports of a run that ended (a failed run throws RunFailed instead).
struct ExperimentResult {
  long long run_id = 0;
  long long requests = 0;  // requests served
  Seconds end_s = 0;       // executor time at the end (simulated or measured)
  double wall_s = 0;       // wall time since the Experiment was built
};

class Experiment {
 public:
  // Builds the typed options of `config` (a resolved, one-system configuration) for a run of
  // `trace_path` written to `out_path`. Throws ConfigError. The wall time of the run is
  // counted from here.
  Experiment(const Config& config, std::string trace_path, std::string out_path);

  const Config& config() const { return config_; }
  const ExperimentOptions& options() const { return opts_; }
  const std::string& trace_path() const { return trace_path_; }
  const std::string& out_path() const { return out_path_; }

  // Opens the trace and checks that the configuration can replay it (PrepareReplay). Call it
  // before building anything that writes (the backend's store, the results file). Throws
  // TraceError or ConfigError.
  void CheckTrace();

  // Runs the experiment on `backend` (see above) and returns what it did. Throws InputError
  // when the results file cannot be opened or the run not begun in it, RunFailed after
  // recording a run-time failure -- a write to the results file that fails once the run has
  // begun (the disk filled) included: the run is then marked failed if the file still takes
  // that, else it stays incomplete. Any other exception (bad input found while serving, a
  // broken invariant) marks the run failed with its message and is rethrown unchanged.
  // REQUIRES: CheckTrace() returned; Run not called before.
  ExperimentResult Run(ExperimentBackend& backend, const ReplayProgressFn& progress);

 private:
  // Run's body once run `run_id` is begun in `db`.
  ExperimentResult Serve(ResultsDb& db, long long run_id, const RunInfo& info,
                         ExperimentBackend& backend, const ReplayProgressFn& progress);

  const Config& config_;
  ExperimentOptions opts_;
  std::string trace_path_, out_path_;
  std::optional<ReplaySetup> replay_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace kvtier
