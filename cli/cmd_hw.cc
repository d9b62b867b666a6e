// kvtier hw: replay a trace through one or more systems on this machine's real disk, memory
// and device (hw/run_hw.h), and compare them like `kvtier sim`.
//
//   kvtier hw --config configs/experiments/X.ini [--systems a,b,c] --out R.sqlite
//             [--section.key=value ...]      (flags: cli/experiment_args.h)
//
// Each system runs in its own child process, one after another (measured systems never share
// the machine), and writes one run with mode = 'hw' into the same SQLite file; the parent
// prints the comparison table from the run_summary view.

#include <cstdio>

#include "analysis/results_db.h"
#include "cli/commands.h"
#include "cli/experiment_args.h"
#include "cli/hw_common.h"
#include "cli/sim_common.h"
#include "core/errors.h"
#include "core/options.h"
#include "hw/run_hw.h"

namespace kvtier::cli {

ExperimentCommand HwCommand(const char* name, const char* about, const char* notes) {
  return {.name = name,
          .about = about,
          .synopsis = "[--quiet]",
          .notes = notes,
          .jobs_help = "systems measured at once: 1",
          .max_jobs = 1,
          .max_jobs_why = "measured runs never share the disk or the cores"};
}

void AddQuietFlag(ExperimentArgs* a, bool* quiet) {
  a->AddOptions()("quiet", boost::program_options::bool_switch(quiet),
                  "no progress lines (rate and ETA on stderr)");
}

ProgressOptions HwProgressOptions(const Config& base, bool quiet) {
  ProgressOptions o;
  o.interval_s = base.GetDuration("log.progress");
  o.quiet = quiet;
  return o;
}

ChildFn HwChild(const std::string& out) {
  return [out](const Config& config, const ProgressFn& progress) {
    const std::string trace = config.GetString("workload.trace");  // resolved by the caller
    // Stopped between requests, so RunHardware unwinds and removes its chunk store.
    const StopSignals stop;
    const ProgressFn checked = [&](long long done, long long total, double t) {
      stop.Check();
      if (progress) progress(done, total, t);
    };
    hw::HwRunResult r = hw::RunHardware(config, trace, out, checked);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%lld requests, %.2f s measured, %.2f s wall", r.requests,
                  r.measured_s, r.wall_s);
    return ChildRun{r.run_id, buf};
  };
}

int RunHw(const Args& args) {
  ExperimentArgs a(HwCommand("hw",
                             "Replays the experiment's trace through each system on this machine's "
                             "disk, memory and\ndevice (hw.backend), one system after another, "
                             "into one results file (mode 'hw'),\nand prints their comparison "
                             "(the run_summary view)."));
  bool quiet = false;
  AddQuietFlag(&a, &quiet);
  if (!a.Parse(args)) return 0;
  const Config base = a.Base();
  const std::vector<std::pair<std::string, Config>> runs = a.Runs();
  a.CreateOut();
  if (!quiet) {
    std::fprintf(stderr, "kvtier hw: %zu system(s) on %s, trace %s -> %s\n", runs.size(),
                 runs.front().second.GetString("model.name").c_str(),
                 runs.front().second.GetString("workload.trace").c_str(), a.out().c_str());
  }
  int worst = 0;
  // One system at a time: measured runs never share the disk or the cores.
  const ProgressOptions progress = HwProgressOptions(base, quiet);
  std::vector<long long> ids = RunInChildren(runs, 1, progress.interval_s, "hw",
                                             HwChild(a.out()), &worst, nullptr, &progress);
  PrintComparison(a.out(), ids);
  return worst;
}

}  // namespace kvtier::cli
