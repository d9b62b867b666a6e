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
//
// On a Slurm cluster (cli/sweep_slurm.h, docs/scale-out.md):
//   kvtier sweep ... --slurm DIR [--partition P] [--time T] [--cpus-per-task N]
//                [--points-per-task K] [--submit]     a job directory (and sbatch it)
//   kvtier sweep ... --points A-B --grid DIR/grid.tsv --out SHARD   what one array task runs
//   kvtier sweep --status DIR                         done, killed, failed, missing points

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "analysis/results_db.h"
#include "cli/commands.h"
#include "cli/command_line.h"
#include "cli/experiment_args.h"
#include "cli/sim_common.h"
#include "cli/sweep_slurm.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"

namespace kvtier::cli {

namespace po = boost::program_options;

namespace {

// kvtier sweep --status DIR: the only flag besides --help.
int RunStatus(const Args& args) {
  std::string dir;
  po::options_description desc("kvtier sweep --status options");
  desc.add_options()("help,h", "show this help")(
      "status", po::value(&dir)->required()->value_name("DIR"),
      "a job directory written by kvtier sweep --slurm");
  po::variables_map vm;
  StoreArgs("sweep", args, desc, desc, &vm);
  if (vm.count("help")) {
    std::ostringstream s;
    s << desc;
    std::printf("usage: kvtier sweep --status DIR\n\nThe points of a Slurm sweep's job directory "
                "that are not done -- killed (a run with\ncomplete = 0 and no error: its task was "
                "killed mid-point), failed (runs.status = 'failed'),\nmissing (no run), queued or "
                "running (squeue) -- from its shards and Slurm's output files,\nand the sbatch "
                "command that resubmits the tasks of the missing and killed points.\n\n%s",
                s.str().c_str());
    return 0;
  }
  NotifyArgs("sweep", &vm);
  return PrintSweepStatus(dir);
}

// "A-B" or "A" (grid indices, 0-based, inclusive).
std::pair<std::size_t, std::size_t> ParsePoints(const std::string& text) {
  const auto dash = text.find('-');
  try {
    std::size_t used = 0;
    const std::size_t first = std::stoul(text.substr(0, dash), &used);
    if (used != text.substr(0, dash).size()) throw std::invalid_argument(text);
    std::size_t last = first;
    if (dash != std::string::npos) {
      last = std::stoul(text.substr(dash + 1), &used);
      if (used != text.size() - dash - 1) throw std::invalid_argument(text);
    }
    if (last < first || text[0] == '-') throw std::invalid_argument(text);
    return {first, last};
  } catch (const std::exception&) {
    throw InputError("command line: --points '" + text + "': expected FIRST-LAST (0-based grid "
                     "indices, FIRST <= LAST) or one index");
  }
}

}  // namespace

int RunSweep(const Args& args) {
  for (const std::string& word : args) {
    if (word == "--status" || word.rfind("--status=", 0) == 0) return RunStatus(args);
  }
  std::vector<std::string> sets;
  bool rerun_failed = false;
  bool progress = false, quiet = false;
  SlurmJobOptions slurm;
  bool submit = false;
  std::string points_arg, grid_file;
  ExperimentArgs a({.name = "sweep",
                    .about = "Simulates every point of a grid (one value per --set key, times each "
                             "system) into one\nresults file, in parallel processes. Resumable: a "
                             "point with a complete run in --out\n(same resolved configuration and "
                             "trace) is skipped. With --slurm DIR, a Slurm job array of the "
                             "grid instead:\none results file per array task, joined by kvtier "
                             "merge (docs/scale-out.md).",
                    .synopsis = "--set key=v1,v2 [--set ...] [--rerun-failed]",
                    .notes = "(A point a kill interrupted is run again by the next sweep; a point "
                             "whose run failed is\nreported and run again only with "
                             "--rerun-failed.)\n",
                    .default_jobs = 2,
                    .jobs_help = "grid points simulated at once",
                    .out_optional_with = "slurm"});
  a.AddOptions()("set", po::value(&sets)->composing()->value_name("key=v1,v2"),
                 "one grid axis: a configuration key and its values (repeatable)")(
      "rerun-failed", po::bool_switch(&rerun_failed),
      "rerun points whose run ended with an error (they are reported and skipped otherwise)")(
      "slurm", po::value(&slurm.dir)->value_name("DIR"),
      "write a Slurm job directory (grid, sbatch array script, README) instead of running; "
      "no --out: each task writes DIR/shards/task-<t>.sqlite")(
      "partition", po::value(&slurm.partition)->value_name("P"), "--slurm: sbatch partition")(
      "time", po::value(&slurm.time)->value_name("T"),
      "--slurm: time limit of one task (sbatch --time, e.g. 2:00:00)")(
      "cpus-per-task", po::value(&slurm.cpus_per_task)->default_value(1)->value_name("N"),
      "--slurm: CPUs of a task, its points simulated at once")(
      "points-per-task", po::value(&slurm.points_per_task)->default_value(1)->value_name("K"),
      "--slurm: grid points one array task runs (docs/scale-out.md sizes it)")(
      "submit", po::bool_switch(&submit), "--slurm: submit with sbatch and print the job id")(
      "points", po::value(&points_arg)->value_name("A-B"),
      "run only grid points A..B (0-based, grid order; what an array task runs)")(
      "grid", po::value(&grid_file)->value_name("FILE"),
      "with --points: stop (exit 2) unless the points still have the configuration hashes "
      "of this grid.tsv")(
      "status", po::value<std::string>()->value_name("DIR"),
      "instead of running: which points of a --slurm job directory are done, killed, failed "
      "or missing, and the command that resubmits the missing ones");
  AddSimProgressFlags(&a, &progress, &quiet);
  if (!a.Parse(args)) return 0;
  const po::variables_map& vm = a.vm();
  const bool to_slurm = vm.count("slurm") > 0;
  if (!to_slurm) {
    for (const char* flag : {"partition", "time", "cpus-per-task", "points-per-task"}) {
      if (vm.count(flag) && !vm[flag].defaulted()) {
        throw InputError(std::string("command line: --") + flag + " needs --slurm DIR");
      }
    }
    if (submit) throw InputError("command line: --submit needs --slurm DIR");
  } else {
    if (!a.out().empty()) {
      throw InputError("command line: --slurm writes one results file per task "
                       "(DIR/shards); --out is for a local sweep, and kvtier merge joins shards");
    }
    if (!vm["jobs"].defaulted()) {
      throw InputError("command line: with --slurm, a task's points run at once on its "
                       "--cpus-per-task, not -j");
    }
    if (rerun_failed) {
      throw InputError("command line: --rerun-failed is for the tasks: resubmit them with "
                       "sbatch --export=ALL,KVTIER_SWEEP_FLAGS=--rerun-failed (kvtier sweep "
                       "--status DIR prints the command)");
    }
    if (!points_arg.empty() || !grid_file.empty()) {
      throw InputError("command line: --points and --grid are what a --slurm task runs, not "
                       "flags of --slurm");
    }
  }
  if (!grid_file.empty() && points_arg.empty()) {
    throw InputError("command line: --grid checks the points of --points A-B; give both");
  }
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
    // Each point runs one system of --systems (or experiment.systems) through include.system:
    // sweeping experiment.systems changed nothing a point ran, and system.name only relabelled
    // it (`--set system.name=spec,as --systems as` stored as's policies under the name spec).
    if (key == "experiment.systems" || key == "include.system" || key == "system.name") {
      throw InputError("command line: --set " + key + ": a point's system comes from --systems "
                       "(or experiment.systems); give the systems to sweep there");
    }
    std::vector<std::string> values = SplitList(set.substr(eq + 1));
    if (values.empty()) throw InputError("command line: --set " + key + ": no values");
    // A key swept twice, or a value listed twice, made points that claim one value and ran
    // another (`--set k=1GiB --set k=2GiB`: one point, labelled with both, ran 2GiB).
    for (const auto& [other, unused] : axes) {
      if (other == key) throw InputError("command line: --set " + key + ": set twice");
    }
    // The same value written two ways (`select.retention=0.5,0.50`) ran the point twice under
    // two configuration hashes.
    const KeySpec& spec = *FindKey(key);
    for (std::size_t i = 0; i < values.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (values[i] == values[j]) {
          throw InputError("command line: --set " + key + ": value '" + values[i] +
                           "' listed twice");
        }
        if (SameValue(spec, values[i], values[j])) {
          throw InputError("command line: --set " + key + ": value '" + values[i] + "' is '" +
                           values[j] + "' again (one value listed twice)");
        }
      }
    }
    axes.emplace_back(key, values);
  }
  const std::vector<std::string> systems = a.Systems();

  // Expand the grid; validate every point before running any.
  std::vector<GridPoint> grid;
  std::vector<Config> configs;
  std::vector<std::size_t> index(axes.size(), 0);
  std::map<std::string, std::string> trace_sha;  // trace path -> SHA-256 of its bytes
  while (true) {
    for (const std::string& system : systems) {
      GridPoint p;
      p.words.push_back("--include.system=" + system);
      p.label = system;
      for (std::size_t i = 0; i < axes.size(); ++i) {
        p.words.push_back("--" + axes[i].first + "=" + axes[i].second[index[i]]);
        p.label += " " + axes[i].first + "=" + axes[i].second[index[i]];
      }
      std::vector<std::string> point(p.words.begin() + 1, p.words.end());
      point.push_back("--log.progress=1h");
      Config c = a.SystemConfig(system, point);
      // Each point resolves its own trace (workload.trace may be a grid axis).
      p.trace = ResolveTrace(c, config_path);
      c.Set("workload.trace", p.trace, c.Get("workload.trace").origin);
      auto known = trace_sha.find(p.trace);
      if (known == trace_sha.end()) known = trace_sha.emplace(p.trace, Sha256File(p.trace)).first;
      p.trace_sha256 = known->second;
      p.config_sha256 = ConfigSha256(c, known->second);
      grid.push_back(std::move(p));
      configs.push_back(std::move(c));
    }
    std::size_t i = 0;
    while (i < axes.size() && ++index[i] == axes[i].second.size()) index[i++] = 0;
    if (i == axes.size()) break;
  }

  if (to_slurm) {
    // The words that define the grid, for every task to expand it again the same way.
    std::vector<std::string> words = {"--config", config_path};
    std::string system_list;
    for (const std::string& system : systems) system_list += (system_list.empty() ? "" : ",") + system;
    words.insert(words.end(), {"--systems", system_list});
    for (const std::string& set : sets) words.insert(words.end(), {"--set", set});
    words.insert(words.end(), a.overrides().begin(), a.overrides().end());
    const int tasks = WriteSlurmJob(slurm, words, grid);
    std::printf("kvtier sweep: %zu points in %d array tasks of %d -> %s (README there)\n",
                grid.size(), tasks, slurm.points_per_task, slurm.dir.c_str());
    if (submit) {
      const std::string job = SubmitSlurmJob(slurm.dir);
      std::printf("submitted job %s\n", job.c_str());
    } else {
      std::printf("submit: sbatch %s/job.sh\n", slurm.dir.c_str());
    }
    return 0;
  }

  // An array task's slice of the grid.
  std::size_t first = 0, last = grid.size() - 1;
  if (!points_arg.empty()) {
    std::tie(first, last) = ParsePoints(points_arg);
    if (first >= grid.size()) {
      throw InputError("command line: --points " + points_arg + ": the grid has " +
                       std::to_string(grid.size()) + " points (0-" +
                       std::to_string(grid.size() - 1) + ")");
    }
    last = std::min(last, grid.size() - 1);
    if (!grid_file.empty()) CheckGrid(grid_file, grid, first, last);
  }

  std::vector<std::pair<std::string, Config>> todo;
  std::size_t total = 0, skipped = 0;
  std::vector<std::string> failed;  // labels of points whose run ended with an error
  ResultsDb db(out);
  for (std::size_t i = first; i <= last; ++i) {
    ++total;
    const std::string& sha = grid[i].config_sha256;
    // Done points are skipped; failed ones are reported and rerun only when asked; a point a
    // kill interrupted (complete = 0) is run again, its partial run deleted first.
    const ResultsDb::PointState state = db.GetPointState(sha, "sim");
    if (state == ResultsDb::PointState::kDone) {
      ++skipped;
      continue;
    }
    if (state == ResultsDb::PointState::kFailed) {
      if (!rerun_failed) {
        failed.push_back(grid[i].label);
        continue;
      }
      db.DeleteFailedRuns(sha, "sim");
    }
    db.DeleteIncompleteRuns(sha, "sim");
    todo.emplace_back(grid[i].label, std::move(configs[i]));
  }
  if (!quiet) {
    std::fprintf(stderr, "kvtier sweep: %zu points (%zu done before, %zu to run) -> %s\n",
                 total, skipped, todo.size(), out.c_str());
  }
  if (!failed.empty()) {
    std::fprintf(stderr, "kvtier sweep: %zu point(s) failed before and are not rerun (pass "
                 "--rerun-failed to rerun them):\n", failed.size());
    for (const std::string& label : failed) std::fprintf(stderr, "  failed: %s\n", label.c_str());
  }
  const auto start = std::chrono::steady_clock::now();
  std::size_t done = 0;
  int worst = 0;
  // Each point's rate and ETA (where stderr is a terminal, or --progress); the points' own
  // log.progress lines are off (1h), so without it a point says only when it is done.
  ProgressOptions rate_eta;
  const bool use_rate_eta =
      SimProgressOptions(a.Base().GetDuration("log.progress"), a.jobs(), progress, quiet,
                         &rate_eta);
  std::vector<long long> ids =
      RunInChildren(todo, a.jobs(), 3600, "sweep", SimChild(out), &worst,
                    [&](const std::string& label, int code) {
        ++done;
        if (quiet && code == 0) return;
        const double el =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double eta = el / double(done) * double(todo.size() - done);
        std::fprintf(stderr, "[%zu/%zu] %s %s  (%.0f s elapsed, ~%.0f s left)\n", done,
                     todo.size(), code == 0 ? "done" : "FAILED", label.c_str(), el, eta);
      }, use_rate_eta ? &rate_eta : nullptr);
  if (!quiet) {
    std::fprintf(stderr, "kvtier sweep: %zu of %zu points ran; query run_summary in %s\n",
                 ids.size(), todo.size(), out.c_str());
  }
  return worst;
}

}  // namespace kvtier::cli
