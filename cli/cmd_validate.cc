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

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "cli/hw_common.h"
#include "cli/sim_common.h"
#include "core/errors.h"

namespace kvtier::cli {
namespace {

std::string Ids(const std::vector<long long>& ids) {
  std::string s;
  for (long long id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s.empty() ? "-1" : s;
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  std::size_t rank = std::size_t(std::ceil(p * double(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

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

  sqlite3* db = nullptr;
  if (sqlite3_open_v2(a.out().c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    throw InputError(a.out() + ": cannot open for reading");
  }
  const std::string where = " WHERE sim_run_id IN (" + Ids(sim_ids) + ") AND hw_run_id IN (" +
                            Ids(hw_ids) + ")";
  std::map<std::string, std::vector<double>> errors, signed_errors;
  {
    sqlite3_stmt* st = nullptr;
    const std::string sql = "SELECT system, abs_rel_error, rel_error FROM sim_vs_hw" + where;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      std::string e = sqlite3_errmsg(db);
      sqlite3_close(db);
      throw InputError(a.out() + ": " + e);
    }
    while (sqlite3_step(st) == SQLITE_ROW) {
      const std::string sys = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
      errors[sys].push_back(sqlite3_column_double(st, 1));
      signed_errors[sys].push_back(sqlite3_column_double(st, 2));
    }
    sqlite3_finalize(st);
  }
  std::printf("\nper-request TTFT error |sim - hw| / hw (measured requests)\n");
  std::printf("%-12s %8s %9s %9s %9s %12s %8s\n", "system", "requests", "median", "p90", "max",
              "median sign", "target");
  bool all_met = true;
  for (const auto& [sys, v] : errors) {
    const double med = Pct(v, 0.5);
    const bool met = med <= 0.10;
    all_met = all_met && met;
    std::printf("%-12s %8zu %8.1f%% %8.1f%% %8.1f%% %11.1f%% %8s\n", sys.c_str(), v.size(),
                100 * med, 100 * Pct(v, 0.9), 100 * Pct(v, 1.0), 100 * Pct(signed_errors[sys], 0.5),
                met ? "met" : "MISSED");
  }
  {
    sqlite3_stmt* st = nullptr;
    const std::string sql =
        "SELECT system, stage, sim_busy_s, hw_busy_s, rel_error FROM sim_vs_hw_stages" + where +
        " ORDER BY system, stage";
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
      std::printf("\nper-stage busy time, whole run (sim vs hw; (sim - hw) / hw)\n");
      std::printf("%-12s %-12s %12s %12s %9s\n", "system", "stage", "sim", "hw", "error");
      while (sqlite3_step(st) == SQLITE_ROW) {
        std::printf("%-12s %-12s %11.2fms %11.2fms %8.1f%%\n",
                    reinterpret_cast<const char*>(sqlite3_column_text(st, 0)),
                    reinterpret_cast<const char*>(sqlite3_column_text(st, 1)),
                    1e3 * sqlite3_column_double(st, 2), 1e3 * sqlite3_column_double(st, 3),
                    100 * sqlite3_column_double(st, 4));
      }
      sqlite3_finalize(st);
    }
  }
  sqlite3_close(db);
  std::printf("\ntarget median |error| <= 10%% per system: %s (query the sim_vs_hw and "
              "sim_vs_hw_stages views in %s)\n",
              errors.empty() ? "no paired requests" : all_met ? "met" : "missed", a.out().c_str());
  return std::max(worst_hw, worst_sim);
}

}  // namespace kvtier::cli
