#pragma once
// One hardware run: one system, one trace, on this machine's real disk, memory and device,
// written as one run (mode = 'hw') into a results database. What `kvtier hw` runs in a child
// process per system. The run itself is the experiment driver's (driver/experiment.h), the one
// `kvtier sim` runs too, so both modes serve the same requests the same way: requests arrive at
// their trace times (the executor sleeps until then), the Pipeline serves one at a time,
// run.prewarm stores every prefix first (and pre-populates the chunk store), and the first
// run.warmup_requests requests are served but excluded from statistics.
//
// The run's metrics also hold its environment, one row per fact ("env.backend.host" = 1,
// "env.io_backend.io_uring" = 1, "env.direct_io" = 1, "env.dio_mem_align" = 512,
// "env.kernel.6.18.44" = 1, "env.fs.ext4" = 1, ...), since the metrics table holds numbers.
// Never links SimGrid.

#include <functional>
#include <string>

#include "core/config.h"
#include "core/options.h"
#include "hw/hw_executor.h"

namespace kvtier::hw {

struct HwRunResult {
  long long run_id = 0;
  long long requests = 0;
  double measured_s = 0;  // executor time at the end (since the run started)
  double wall_s = 0;
};

// Progress callback: requests done, requests total (0 if unknown), executor seconds.
using HwProgressFn = std::function<void(long long, long long, double)>;

// The executor options a configuration asks for (hw.* keys, cache and ssd keys).
// `store_dir` is used when hw.store_dir is empty. Throws ConfigError.
HwExecutorOptions BuildHwExecutorOptions(const Config& config, const ExperimentOptions& opts,
                                         const std::string& store_dir);

// Runs `config` (fully resolved, one system) on this machine and writes it to `out_path`.
// Throws InputError (bad config, trace, or output path) before anything is written,
// ConfigError for unsupported settings (e.g. an hw.store_capacity too small for one chunk),
// std::runtime_error when the executor cannot start (e.g. O_DIRECT refused without
// hw.allow_buffered). A failure at run time (prewarm writes, a request's transfer or compute,
// background stores and repacks; core/pipeline.h) stops the run: its rows so far are written,
// the run is recorded with complete = 0, status 'failed' and the error, and RunFailed is
// thrown.
HwRunResult RunHardware(const Config& config, const std::string& trace_path,
                        const std::string& out_path, const HwProgressFn& progress);

}  // namespace kvtier::hw
