#pragma once
// One simulation: one system, one trace, one hardware profile, written as one run into a
// results database. This is what `kvtier sim` runs in a child process per system (SimGrid's
// Engine can be created once per process: notes/simgrid-3.32 P3) and `kvtier sweep` per grid
// point.
//
// Requests arrive at their trace times; the GPU serves gpu.concurrent_prefills prefills at
// once, taken in arrival order (sim/serve.h; queueing shows in ttft_arrival_s - ttft_s). With
// run.prewarm, every prefix of the trace is stored and the caches filled before the first
// request (SPEC §VI-B); the first run.warmup_requests requests are simulated but excluded from
// statistics. The run itself is the experiment driver's, shared with `kvtier hw`
// (driver/experiment.h); sim/simulate.cc adds only what the simulator does differently.

#include <functional>
#include <string>

#include "core/config.h"

namespace kvtier::sim {

struct SimulationResult {
  long long run_id = 0;
  long long requests = 0;
  double simulated_s = 0;
  double wall_s = 0;
  std::uint64_t activities = 0;
  std::uint64_t memo_reused_layers = 0;    // ITF layers answered from the selection memo
  std::uint64_t memo_computed_layers = 0;  // ITF layers computed (and remembered)
  std::uint64_t h2o_memo_reused_layers = 0;    // H2O selections from the selection memo
  std::uint64_t h2o_memo_computed_layers = 0;  // H2O selections computed (and remembered)
};

// Progress callback: requests done, requests total (0 if unknown), simulated seconds.
using ProgressFn = std::function<void(long long, long long, double)>;

// Runs the configuration `config` (fully resolved, one system) and writes it to `out_path`.
// `trace_path` is the resolved trace file. Throws InputError (bad config, trace, or output
// path) before anything is written, ConfigError for unsupported settings. A run-time failure
// (a Status from the pipeline) stops the run, records it failed (runs.status 'failed',
// runs.error) and throws RunFailed.
// REQUIRES: called at most once per process.
SimulationResult RunSimulation(const Config& config, const std::string& trace_path,
                               const std::string& out_path, const ProgressFn& progress);

}  // namespace kvtier::sim
