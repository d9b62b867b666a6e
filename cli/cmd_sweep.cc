// kvtier sweep: the simulator over a grid of configurations, in parallel processes, into one
// results database; resumable: on a rerun, points with a complete run are skipped, points a
// kill interrupted are run again, and points whose run ended with an error are reported and
// run again only with --rerun-failed.
//
//   kvtier sweep --config X.ini --set cache.gpu_capacity=2GiB,4GiB,8GiB --set itf.alpha=0,0.6,1
//                [--systems a,b] --out R.sqlite [-j N] [--rerun-failed] [--section.key=value ...]
//   (the flags every experiment command shares: cli/experiment_args.h)
//
// A grid point is one value per --set key, times each system. A point is identified by the
// SHA-256 of its resolved configuration and the trace, as stored in runs.config_sha256.

#include <boost/program_options.hpp>
#include <chrono>
#include <map>
#include <cstdio>

#include "analysis/results_db.h"
#include "cli/commands.h"
#include "cli/experiment_args.h"
#include "cli/sim_common.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"

namespace kvtier::cli {

namespace po = boost::program_options;

int RunSweep(const Args& args) {
  std::vector<std::string> sets;
  bool rerun_failed = false;
  ExperimentArgs a({.name = "sweep",
                    .about = "Simulates every point of a grid (one value per --set key, times each "
                             "system) into one\nresults file, in parallel processes. Resumable: a "
                             "point with a complete run in --out\n(same resolved configuration and "
                             "trace) is skipped.",
                    .synopsis = "--set key=v1,v2 [--set ...] [--rerun-failed]",
                    .notes = "(A point a kill interrupted is run again by the next sweep; a point "
                             "whose run failed is\nreported and run again only with "
                             "--rerun-failed.)\n",
                    .default_jobs = 2,
                    .jobs_help = "grid points simulated at once"});
  a.AddOptions()("set", po::value(&sets)->composing()->value_name("key=v1,v2"),
                 "one grid axis: a configuration key and its values (repeatable)")(
      "rerun-failed", po::bool_switch(&rerun_failed),
      "rerun points whose run ended with an error (they are reported and skipped otherwise)");
  if (!a.Parse(args)) return 0;
  const std::string& config_path = a.config_path();
  const std::string& out = a.out();

  // Grid axes.
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  for (const std::string& set : sets) {
    auto eq = set.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw InputError("command line: --set '" + set + "': expected key=v1,v2,...");
    }
    std::string key = set.substr(0, eq);
    CheckKnownKey(key, "command line: --set");
    std::vector<std::string> values = SplitList(set.substr(eq + 1));
    if (values.empty()) throw InputError("command line: --set " + key + ": no values");
    axes.emplace_back(key, values);
  }
  const std::vector<std::string> systems = a.Systems();

  // Expand the grid; validate every point before running any.
  std::vector<std::pair<std::string, Config>> todo;
  std::size_t total = 0, skipped = 0;
  std::vector<std::string> failed;  // labels of points whose run ended with an error
  ResultsDb db(out);
  std::vector<std::size_t> index(axes.size(), 0);
  std::map<std::string, std::string> trace_sha;  // trace path -> SHA-256 of its bytes
  while (true) {
    for (const std::string& system : systems) {
      std::vector<std::string> point;
      std::string label = system;
      for (std::size_t i = 0; i < axes.size(); ++i) {
        point.push_back("--" + axes[i].first + "=" + axes[i].second[index[i]]);
        label += " " + axes[i].first + "=" + axes[i].second[index[i]];
      }
      point.push_back("--log.progress=1h");
      Config c = a.SystemConfig(system, point);
      // Each point resolves its own trace (workload.trace may be a grid axis).
      const std::string trace = ResolveTrace(c, config_path);
      c.Set("workload.trace", trace, c.Get("workload.trace").origin);
      auto known = trace_sha.find(trace);
      if (known == trace_sha.end()) known = trace_sha.emplace(trace, Sha256File(trace)).first;
      ++total;
      const std::string sha = ConfigSha256(c, known->second);
      // Done points are skipped; failed ones are reported and rerun only when asked; a point a
      // kill interrupted (complete = 0) is run again, its partial run deleted first.
      const ResultsDb::PointState state = db.GetPointState(sha, "sim");
      if (state == ResultsDb::PointState::kDone) {
        ++skipped;
        continue;
      }
      if (state == ResultsDb::PointState::kFailed) {
        if (!rerun_failed) {
          failed.push_back(label);
          continue;
        }
        db.DeleteFailedRuns(sha, "sim");
      }
      db.DeleteIncompleteRuns(sha, "sim");
      todo.emplace_back(label, std::move(c));
    }
    std::size_t i = 0;
    while (i < axes.size() && ++index[i] == axes[i].second.size()) index[i++] = 0;
    if (i == axes.size()) break;
  }
  std::fprintf(stderr, "kvtier sweep: %zu points (%zu done before, %zu to run) -> %s\n", total,
               skipped, todo.size(), out.c_str());
  if (!failed.empty()) {
    std::fprintf(stderr, "kvtier sweep: %zu point(s) failed before and are not rerun (pass "
                 "--rerun-failed to rerun them):\n", failed.size());
    for (const std::string& label : failed) std::fprintf(stderr, "  failed: %s\n", label.c_str());
  }
  const auto start = std::chrono::steady_clock::now();
  std::size_t done = 0;
  int worst = 0;
  std::vector<long long> ids =
      RunInChildren(todo, a.jobs(), 3600, "sweep", SimChild(out), &worst,
                    [&](const std::string& label, int code) {
        ++done;
        const double el =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double eta = el / double(done) * double(todo.size() - done);
        std::fprintf(stderr, "[%zu/%zu] %s %s  (%.0f s elapsed, ~%.0f s left)\n", done,
                     todo.size(), code == 0 ? "done" : "FAILED", label.c_str(), el, eta);
      });
  std::fprintf(stderr, "kvtier sweep: %zu of %zu points ran; query run_summary in %s\n",
               ids.size(), todo.size(), out.c_str());
  return worst;
}

}  // namespace kvtier::cli
