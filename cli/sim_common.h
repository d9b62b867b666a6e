#pragma once
// Running experiment commands' systems in child processes: shared by `kvtier sim`, `sweep`,
// `hw` and `validate` (their command line: cli/experiment_args.h).

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli/progress.h"
#include "core/config.h"

namespace kvtier::cli {

// Called in the parent when a child ends: its label and exit code.
using DoneFn = std::function<void(const std::string& label, int exit_code)>;
// Progress of a run: requests done, requests in total (0 if unknown), executor seconds.
using ProgressFn = std::function<void(long long, long long, double)>;
// What one child process does for one run: run it, return its run id and a one-line summary.
// Throws InputError for bad input (the child exits 2).
struct ChildRun {
  long long run_id = 0;
  std::string summary;
};
using ChildFn = std::function<ChildRun(const Config&, const ProgressFn&)>;

// Runs each (label, config) in its own child process (SimGrid's engine is one per process;
// hardware runs must not share the machine), at most `jobs` at once, printing progress every
// `progress_s` and errors prefixed by `kvtier <command>`. With `rate_eta` (hw, validate) a
// run's progress is a Progress line (cli/progress.h: rate, ETA, one updating line on a
// terminal, --quiet) instead, for one child at a time (jobs = 1). Returns the run ids of the
// runs that finished; *worst_exit receives the largest child exit code.
std::vector<long long> RunInChildren(const std::vector<std::pair<std::string, Config>>& runs,
                                     int jobs, double progress_s, const char* command,
                                     const ChildFn& child, int* worst_exit,
                                     const DoneFn& on_done,
                                     const ProgressOptions* rate_eta = nullptr);
// The simulator as a ChildFn: RunSimulation on the config's resolved workload.trace into `out`.
ChildFn SimChild(const std::string& out);
void PrintComparison(const std::string& out, const std::vector<long long>& run_ids);

}  // namespace kvtier::cli
