// kvtier sweep: the simulator over a grid of configurations, in parallel processes, into one
// results database; resumable (grid points with a complete run are skipped on rerun).
//
//   kvtier sweep --config X.ini --set cache.gpu_capacity=2GiB,4GiB,8GiB --set itf.alpha=0,0.6,1
//                [--systems a,b] --out R.sqlite [-j N] [--section.key=value ...]
//
// A grid point is one value per --set key, times each system. A point is identified by the
// SHA-256 of its resolved configuration and the trace, as stored in runs.config_sha256.

#include <boost/program_options.hpp>
#include <chrono>
#include <map>
#include <cstdio>
#include <sstream>

#include "analysis/results_db.h"
#include "cli/commands.h"
#include "cli/sim_common.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"

namespace kvtier::cli {

namespace po = boost::program_options;

int RunSweep(const Args& args) {
  po::options_description desc("kvtier sweep options");
  std::string config_path, systems_arg, out;
  std::vector<std::string> sets;
  int jobs = 2;
  desc.add_options()("help,h", "show this help")(
      "config", po::value(&config_path)->required(), "experiment INI file")(
      "set", po::value(&sets)->composing(), "key=v1,v2,... (repeatable): one grid axis")(
      "systems", po::value(&systems_arg), "systems, comma-separated (default: "
                                           "experiment.systems, else include.system)")(
      "out", po::value(&out)->required(), "results SQLite file (created or appended)")(
      "jobs,j", po::value(&jobs)->default_value(2), "grid points simulated in parallel");
  po::variables_map vm;
  std::vector<std::string> overrides;
  try {
    po::parsed_options parsed =
        po::command_line_parser(args).options(desc).allow_unregistered().run();
    overrides = po::collect_unrecognized(parsed.options, po::include_positional);
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::ostringstream s;
      s << desc;
      std::printf("usage: kvtier sweep --config X.ini --set key=v1,v2 [--set ...] --out R.sqlite "
                  "[-j N]\n%s\n%s(A failed point stays incomplete and is run again by the next "
                  "sweep.)\n", s.str().c_str(), kExitStatusHelp);
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(std::string("command line: ") + e.what() + " (kvtier sweep --help)");
  }
  if (jobs < 1) throw InputError("command line: --jobs must be >= 1");

  // Grid axes.
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  for (const std::string& set : sets) {
    auto eq = set.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw InputError("command line: --set '" + set + "': expected key=v1,v2,...");
    }
    std::string key = set.substr(0, eq);
    if (FindKey(key) == nullptr) {
      throw ConfigError("command line: --set: unknown key '" + key +
                        "' (kvtier config --keys lists every key)");
    }
    std::vector<std::string> values = SplitList(set.substr(eq + 1));
    if (values.empty()) throw InputError("command line: --set " + key + ": no values");
    axes.emplace_back(key, values);
  }
  Config base = Config::Load(config_path, overrides);
  std::vector<std::string> systems =
      SplitList(!systems_arg.empty() ? systems_arg : base.GetString("experiment.systems"));
  if (systems.empty() && base.Has("include.system")) systems = {base.GetString("include.system")};
  if (systems.empty()) {
    throw ConfigError(config_path + ": no system: pass --systems or set experiment.systems");
  }

  // Expand the grid; validate every point before running any.
  std::vector<std::pair<std::string, Config>> todo;
  std::size_t total = 0, skipped = 0;
  ResultsDb db(out);
  std::vector<std::size_t> index(axes.size(), 0);
  std::map<std::string, std::string> trace_sha;  // trace path -> SHA-256 of its bytes
  while (true) {
    for (const std::string& system : systems) {
      std::vector<std::string> point = overrides;
      point.push_back("--include.system=" + system);
      std::string label = system;
      for (std::size_t a = 0; a < axes.size(); ++a) {
        point.push_back("--" + axes[a].first + "=" + axes[a].second[index[a]]);
        label += " " + axes[a].first + "=" + axes[a].second[index[a]];
      }
      point.push_back("--log.progress=1h");
      Config c = Config::Load(config_path, point);
      BuildOptions(c);
      // Each point resolves its own trace (workload.trace may be a grid axis).
      const std::string trace = ResolveTrace(c, config_path);
      c.Set("workload.trace", trace, c.Get("workload.trace").origin);
      auto known = trace_sha.find(trace);
      if (known == trace_sha.end()) known = trace_sha.emplace(trace, Sha256File(trace)).first;
      ++total;
      const std::string sha = ConfigSha256(c, known->second);
      if (db.HasCompleteRun(sha, "sim")) {
        ++skipped;
        continue;
      }
      db.DeleteIncompleteRuns(sha, "sim");
      todo.emplace_back(label, std::move(c));
    }
    std::size_t a = 0;
    while (a < axes.size() && ++index[a] == axes[a].second.size()) index[a++] = 0;
    if (a == axes.size()) break;
  }
  std::fprintf(stderr, "kvtier sweep: %zu points (%zu done before, %zu to run) -> %s\n", total,
               skipped, todo.size(), out.c_str());
  const auto start = std::chrono::steady_clock::now();
  std::size_t done = 0;
  int worst = 0;
  std::vector<long long> ids =
      RunInChildren(todo, jobs, 3600, "sweep", SimChild(out), &worst,
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
