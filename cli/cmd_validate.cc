// kvtier validate: run the same trace and configuration through the simulator and the
// hardware, then report how far the simulator is from the hardware, per system:
//   per request  |sim TTFT - hw TTFT| / hw TTFT: median, p90, max (view sim_vs_hw)
//   per stage    busy time of SSD reads, H2D copies, CPU gathers and layer compute, sim vs hw
//                (view sim_vs_hw_stages, from io_breakdown and layers)
//
//   kvtier validate --config X.ini --out R.sqlite [--systems a,b] [--section.key=value ...]
//   (the flags every experiment command shares: cli/experiment_args.h)
//
// The simulator uses the configuration's hardware profile: calibrate it first (`kvtier
// calibrate --out configs/hardware/NAME.ini`, then --include.hardware=NAME). Both modes write
// into the same database; the hw runs go first, one system at a time. If a hw run fails (an
// I/O or CUDA error) nothing is simulated or compared and validate exits 3.

#include <algorithm>
#include <cstdio>

#include "analysis/queries.h"
#include "cli/commands.h"
#include "cli/hw_common.h"
#include "cli/sim_common.h"
#include "core/errors.h"

namespace kvtier::cli {

int RunValidate(const Args& args) {
  ExperimentArgs a(HwCommand(
      "validate",
      "Runs the experiment's trace through each system on this machine (kvtier hw), then in the\n"
      "simulator (kvtier sim) with the experiment's hardware profile, into one results file, and\n"
      "reports the simulator's TTFT error per request and its busy-time error per stage.\n"
      "Calibrate the profile first: kvtier calibrate --out configs/hardware/NAME.ini, then\n"
      "--include.hardware=NAME.",
      "(validate exits 3 when one of its hw runs failed, without simulating or comparing "
      "anything.)\n"));
  bool quiet = false;
  AddQuietFlag(&a, &quiet);
  if (!a.Parse(args)) return 0;
  const Config base = a.Base();
  const std::vector<std::pair<std::string, Config>> runs = a.Runs();
  a.CreateOut();
  if (!quiet) {
    std::fprintf(stderr, "kvtier validate: %zu system(s), hardware profile '%s', trace %s -> %s\n",
                 runs.size(), runs.front().second.GetString("hardware.name").c_str(),
                 runs.front().second.GetString("workload.trace").c_str(), a.out().c_str());
    std::fprintf(stderr, "hw:\n");
  }
  int worst_hw = 0, worst_sim = 0;
  const ProgressOptions progress = HwProgressOptions(base, quiet);
  const std::vector<long long> hw_ids = RunInChildren(runs, 1, progress.interval_s, "hw",
                                                      HwChild(a.out()), &worst_hw, nullptr,
                                                      &progress);
  if (worst_hw != 0) {
    // A failed hardware run measured nothing trustworthy: there is nothing to validate against.
    std::fprintf(stderr, "kvtier validate: %zu of %zu hw run(s) did not complete; nothing is "
                 "compared (failed runs are in %s with runs.status = 'failed')\n",
                 runs.size() - hw_ids.size(), runs.size(), a.out().c_str());
    return worst_hw;
  }
  if (!quiet) std::fprintf(stderr, "sim:\n");
  const std::vector<long long> sim_ids = RunInChildren(runs, 1, progress.interval_s, "sim",
                                                       SimChild(a.out()), &worst_sim, nullptr,
                                                       &progress);
  std::vector<long long> all = hw_ids;
  all.insert(all.end(), sim_ids.begin(), sim_ids.end());
  PrintComparison(a.out(), all);

  std::printf("\nper-request TTFT error |sim - hw| / hw (measured requests)\n");
  std::printf("%-12s %8s %9s %9s %9s %12s %8s\n", "system", "requests", "median", "p90", "max",
              "median sign", "target");
  const std::vector<TtftErrorSummary> errors = SimVsHwTtftErrors(a.out(), sim_ids, hw_ids);
  bool all_met = true;
  for (const TtftErrorSummary& e : errors) {
    const bool met = e.median_abs <= 0.10;
    all_met = all_met && met;
    std::printf("%-12s %8zu %8.1f%% %8.1f%% %8.1f%% %11.1f%% %8s\n", e.system.c_str(), e.requests,
                100 * e.median_abs, 100 * e.p90_abs, 100 * e.max_abs, 100 * e.median_signed,
                met ? "met" : "MISSED");
  }
  std::printf("\nper-stage busy time, whole run (sim vs hw; (sim - hw) / hw)\n");
  std::printf("%-12s %-12s %12s %12s %9s\n", "system", "stage", "sim", "hw", "error");
  for (const StageErrorRow& s : SimVsHwStages(a.out(), sim_ids, hw_ids)) {
    std::printf("%-12s %-12s %11.2fms %11.2fms %8.1f%%\n", s.system.c_str(), s.stage.c_str(),
                1e3 * s.sim_busy_s, 1e3 * s.hw_busy_s, 100 * s.rel_error);
  }
  std::printf("\ntarget median |error| <= 10%% per system: %s (query the sim_vs_hw and "
              "sim_vs_hw_stages views in %s)\n",
              errors.empty() ? "no paired requests" : all_met ? "met" : "missed", a.out().c_str());
  return std::max(worst_hw, worst_sim);
}

}  // namespace kvtier::cli
