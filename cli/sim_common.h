#pragma once
// Running experiment commands' systems in child processes: shared by `kvtier sim`, `sweep`,
// `hw` and `validate` (their command line: cli/experiment_args.h).

#include <functional>
#include <stdexcept>
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

// Thrown by a child run that a stop signal ended between two requests (StopSignals below);
// the child prints it and exits 128 + signal, its run left incomplete.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signal);
  int signal() const { return signal_; }

 private:
  int signal_;
};

// In a child run that must clean up when stopped (kvtier hw: its chunk store): while alive,
// SIGTERM, SIGINT and SIGHUP only set a flag that Check() turns into Interrupted, and arm a
// 10 s alarm so a run stuck inside one request still ends (SIGALRM, uncaught).
// One per process.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // Throws Interrupted once a stop signal has arrived.
  void Check() const;
};

// Runs each (label, config) in its own child process (SimGrid's engine is one per process;
// hardware runs must not share the machine), at most `jobs` at once, printing progress every
// `progress_s` and errors prefixed by `kvtier <command>`. With `rate_eta` (hw, validate) a
// run's progress is a Progress line (cli/progress.h: rate, ETA, one updating line on a
// terminal, --quiet) instead, for one child at a time (jobs = 1). Returns the run ids of the
// runs that finished; *worst_exit receives the largest child exit code.
// Children die with the parent, whatever kills it (PR_SET_PDEATHSIG). When the parent gets
// SIGTERM, SIGINT or SIGHUP it sends SIGTERM to its children, waits up to 10 s for them (then
// SIGKILL), and ends by the same signal: no run it started is marked complete afterwards.
std::vector<long long> RunInChildren(const std::vector<std::pair<std::string, Config>>& runs,
                                     int jobs, double progress_s, const char* command,
                                     const ChildFn& child, int* worst_exit,
                                     const DoneFn& on_done,
                                     const ProgressOptions* rate_eta = nullptr);
// The simulator as a ChildFn: RunSimulation on the config's resolved workload.trace into `out`.
ChildFn SimChild(const std::string& out);

// `kvtier sim` and `sweep`'s progress flags: --progress (a rate-and-ETA line per run even when
// stderr is not a terminal) and --quiet (no progress on stderr at all).
class ExperimentArgs;
void AddSimProgressFlags(ExperimentArgs* a, bool* progress, bool* quiet);
// The rate-and-ETA progress of sim and sweep runs (RunInChildren's `rate_eta`): where stderr is
// a terminal, or with --progress, a Progress per run (`[sim spec] 120/12031 requests (1%)
// 9.8 requests/s  eta 20 min 18 s ...`), lines every `interval_s` (log.progress) when stderr is
// not a terminal or when `jobs` > 1 runs share it (one rewritten line each would overwrite the
// others'); with --quiet none (quiet set). Returns false when neither applies: the plain lines
// every log.progress, as before.
bool SimProgressOptions(double interval_s, int jobs, bool asked, bool quiet, ProgressOptions* o);
void PrintComparison(const std::string& out, const std::vector<long long>& run_ids);

}  // namespace kvtier::cli
