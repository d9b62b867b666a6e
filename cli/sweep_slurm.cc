#include "cli/sweep_slurm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/results_db.h"
#include "analysis/shards.h"
#include "cli/subprocess.h"
#include "core/errors.h"
#include "core/input_file.h"

namespace kvtier::cli {
namespace {

namespace fs = std::filesystem;

const char* const kGridHeader =
    "# point\ttask\tconfig_sha256\ttrace_sha256\ttrace\tlabel\toverrides";

// `word` quoted for bash: as is when it has only safe characters, else in single quotes.
std::string ShellQuote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789-_./=:,+@%") == std::string::npos) {
    return word;
  }
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The absolute form of the job directory given to `flag`. An empty one made fs::absolute
// throw ("internal error: filesystem error: cannot make absolute path", exit 1; found probing).
std::string Absolute(const std::string& path, const char* flag) {
  if (path.empty()) {
    throw InputError(std::string("command line: ") + flag +
                     ": an empty path names no job directory");
  }
  return fs::absolute(fs::path(path)).lexically_normal().string();
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Slurm's job name for a job directory: one name per directory, so squeue finds its tasks.
std::string JobName(const std::string& dir) { return "kvtier-sweep-" + Sha256(dir).substr(0, 10); }

// "1,3-5,7" from sorted task ids.
std::string Ranges(const std::vector<int>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(ids[i]);
    if (j > i) s += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

std::vector<std::string> SplitTabs(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t tab = line.find('\t', start);
    fields.push_back(line.substr(start, tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  return fields;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int WriteSlurmJob(const SlurmJobOptions& options, const std::vector<std::string>& sweep_words,
                  const std::vector<GridPoint>& grid) {
  if (options.points_per_task < 1) throw InputError("command line: --points-per-task must be >= 1");
  if (options.cpus_per_task < 1) throw InputError("command line: --cpus-per-task must be >= 1");
  if (grid.empty()) throw InputError("command line: the grid has no point");
  const std::string dir = Absolute(options.dir, "--slurm");
  const int k = options.points_per_task;
  const int tasks = int((grid.size() + std::size_t(k) - 1) / std::size_t(k));

  // grid.tsv: written to a string first, so that an existing one can be compared.
  std::ostringstream g;
  g << kGridHeader << "\n";
  for (std::size_t i = 0; i < grid.size(); ++i) {
    const GridPoint& p = grid[i];
    g << i << "\t" << i / std::size_t(k) << "\t" << p.config_sha256 << "\t" << p.trace_sha256
      << "\t" << p.trace << "\t" << p.label << "\t";
    for (std::size_t w = 0; w < p.words.size(); ++w) g << (w ? " " : "") << ShellQuote(p.words[w]);
    g << "\n";
  }
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "shards", ec);
  if (!ec) fs::create_directories(fs::path(dir) / "logs", ec);
  if (ec) throw InputError(dir + ": cannot create the job directory: " + ec.message());
  const fs::path grid_path = fs::path(dir) / "grid.tsv";
  if (fs::exists(grid_path) && ReadFile(grid_path) != g.str()) {
    throw InputError(grid_path.string() +
                     ": a job directory of another grid (or another --points-per-task); write "
                     "this sweep to a new --slurm directory");
  }
  {
    std::ofstream out(grid_path);
    out << g.str();
    if (!out) throw InputError(grid_path.string() + ": cannot write");
  }

  const char* memo_env = std::getenv("KVTIER_SELECTION_MEMO");
  const std::string memo =
      memo_env != nullptr && *memo_env != '\0' ? std::string(memo_env) : dir + "/memo";
  const std::string binary = SelfPath("sweep --slurm");
  const std::string cwd = fs::current_path().string();
  std::string words;
  for (const std::string& w : sweep_words) words += " " + ShellQuote(w);
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));

  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# A kvtier sweep as a Slurm job array: " << grid.size() << " points, " << k
    << " per task, " << tasks << " tasks. Written by `kvtier sweep --slurm` (kvtier "
    << GitCommit() << ") on " << date << "; see README beside it.\n"
    << "#SBATCH --job-name=" << JobName(dir) << "\n"
    << "#SBATCH --array=0-" << tasks - 1 << "\n"
    << "#SBATCH --ntasks=1\n"
    << "#SBATCH --cpus-per-task=" << options.cpus_per_task << "\n"
    << "#SBATCH --output=" << dir << "/logs/%A_%a.out\n"
    << "#SBATCH --chdir=" << cwd << "\n";
  if (!options.partition.empty()) s << "#SBATCH --partition=" << options.partition << "\n";
  if (!options.time.empty()) s << "#SBATCH --time=" << options.time << "\n";
  s << "\n"
    << "dir=" << ShellQuote(dir) << "\n"
    << "kvtier=" << ShellQuote(binary) << "\n"
    << "points=" << grid.size() << "\n"
    << "per_task=" << k << "\n"
    << "# ITF decisions computed once per trace and reused by every point (docs/configuration.md,\n"
    << "# \"Selection memo\"): on storage every node sees.\n"
    << "export KVTIER_SELECTION_MEMO=" << ShellQuote(memo) << "\n"
    << "task=${SLURM_ARRAY_TASK_ID:?submit with sbatch (README)}\n"
    << "first=$((task * per_task))\n"
    << "last=$((first + per_task - 1))\n"
    << "((last < points)) || last=$((points - 1))\n"
    << "echo \"kvtier task $task (job ${SLURM_ARRAY_JOB_ID:-?}_$task on $(hostname)): points "
       "$first-$last, start $(date -u +%FT%TZ)\"\n"
    << "\"$kvtier\" sweep" << words << " \\\n"
    << "  --points \"$first-$last\" --grid \"$dir/grid.tsv\" --out \"$dir/shards/task-$task.sqlite\" "
       "\\\n"
    << "  -j \"${SLURM_CPUS_PER_TASK:-1}\" ${KVTIER_SWEEP_FLAGS:-}\n"
    << "status=$?\n"
    << "echo \"kvtier task $task: exit $status, end $(date -u +%FT%TZ)\"\n"
    << "exit $status\n";
  const fs::path script = fs::path(dir) / "job.sh";
  {
    std::ofstream out(script);
    out << s.str();
    if (!out) throw InputError(script.string() + ": cannot write");
  }
  fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                  fs::perm_options::add, ec);

  std::ostringstream r;
  r << "A kvtier sweep as a Slurm job array (written by `kvtier sweep --slurm`, " << date << ")\n\n"
    << "  points    " << grid.size() << " (grid.tsv: one line each, with its configuration hash)\n"
    << "  tasks     " << tasks << ", " << k << " points each, " << options.cpus_per_task
    << " CPU(s) each (a task runs that many of its points at once)\n"
    << "  binary    " << binary << "\n"
    << "  sweep     kvtier sweep" << words << "\n"
    << "  run in    " << cwd << "\n"
    << "  memo      " << memo << " (selection memo: on storage every node sees)\n"
    << "  shards    " << dir << "/shards/task-<task>.sqlite\n"
    << "  logs      " << dir << "/logs/<job>_<task>.out\n\n"
    << "Every node must see the binary, the experiment file with its includes, the traces\n"
    << "(grid.tsv lists them), this directory and the memo directory at the same paths.\n\n"
    << "Submit:        sbatch " << dir << "/job.sh\n"
    << "Progress:      kvtier sweep --status " << dir << "\n"
    << "               (done, killed, failed, missing points, and the sbatch command that\n"
    << "               resubmits only the tasks of the missing and killed ones)\n"
    << "Rerun failed:  sbatch --export=ALL,KVTIER_SWEEP_FLAGS=--rerun-failed --array=TASKS "
    << dir << "/job.sh\n"
    << "Merge:         kvtier merge " << dir << "/shards/*.sqlite --out ALL.sqlite\n"
    << "               (idempotent: run it again after a resubmission)\n\n"
    << "A task checks that its points still have the configuration hashes of grid.tsv and stops\n"
    << "(exit 2) if the experiment, an include or a trace changed since this was written.\n";
  const fs::path readme = fs::path(dir) / "README";
  {
    std::ofstream out(readme);
    out << r.str();
    if (!out) throw InputError(readme.string() + ": cannot write");
  }
  return tasks;
}

std::string SubmitSlurmJob(const std::string& dir, const std::string& array) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  if (!array.empty()) argv.push_back("--array=" + array);
  argv.push_back(Absolute(dir, "--slurm") + "/job.sh");
  std::string output;
  const int rc = Capture(argv, &output);
  output = Trimmed(output);
  if (rc == 127 || rc < 0) {
    throw InputError("--submit: cannot run sbatch (not on PATH?); the job directory " + dir +
                     " is written: submit it where Slurm is with `sbatch " + argv.back() + "`");
  }
  if (rc != 0) throw InputError("--submit: sbatch refused the job (exit " + std::to_string(rc) +
                                "): " + output);
  // --parsable: "jobid" or "jobid;cluster", possibly after warnings on earlier lines.
  std::string last = output.substr(output.rfind('\n') == std::string::npos ? 0
                                                                         : output.rfind('\n') + 1);
  return last.substr(0, last.find(';'));
}

std::vector<GridLine> ReadGrid(const std::string& grid_path) {
  // Read once and bounded: `--grid /dev/zero` grew one endless line until memory ran out.
  std::istringstream in(ReadInputFile(grid_path, kMaxDataFileBytes, "grid file"));
  std::vector<GridLine> lines;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> f = SplitTabs(line);
    const std::string where = grid_path + ":" + std::to_string(n);
    if (f.size() != 7) throw InputError(where + ": expected 7 tab-separated fields");
    GridLine g;
    try {
      g.point = std::stoul(f[0]);
      g.task = std::stoi(f[1]);
    } catch (const std::exception&) {
      throw InputError(where + ": point and task must be numbers");
    }
    if (g.point != lines.size()) {
      throw InputError(where + ": point " + f[0] + " out of order (expected " +
                       std::to_string(lines.size()) + ")");
    }
    g.config_sha256 = f[2];
    g.trace_sha256 = f[3];
    g.trace = f[4];
    g.label = f[5];
    lines.push_back(g);
  }
  if (lines.empty()) throw InputError(grid_path + ": no point");
  return lines;
}

void CheckGrid(const std::string& grid_path, const std::vector<GridPoint>& grid,
               std::size_t first, std::size_t last) {
  const std::vector<GridLine> lines = ReadGrid(grid_path);
  const std::string changed =
      ": the experiment, an include, an override or a trace changed since `kvtier sweep --slurm` "
      "wrote this job directory; write a new one";
  if (lines.size() != grid.size()) {
    throw InputError(grid_path + ": " + std::to_string(lines.size()) + " points, the sweep has " +
                     std::to_string(grid.size()) + changed);
  }
  for (std::size_t i = first; i <= last && i < grid.size(); ++i) {
    if (lines[i].config_sha256 != grid[i].config_sha256) {
      throw InputError(grid_path + ": point " + std::to_string(i) + " (" + lines[i].label +
                       ") has configuration hash " + lines[i].config_sha256.substr(0, 12) +
                       "..., now " + grid[i].config_sha256.substr(0, 12) + "..." + changed);
    }
  }
}

int PrintSweepStatus(const std::string& dir_arg) {
  const std::string dir = Absolute(dir_arg, "--status");
  const std::vector<GridLine> grid = ReadGrid(dir + "/grid.tsv");

  // Runs of every shard, by point (config hash, trace hash).
  struct Seen {
    bool complete = false, failed = false, killed = false;
    std::string error, where;
  };
  std::map<std::pair<std::string, std::string>, Seen> seen;
  std::error_code ec;
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "shards", ec)) {
    if (e.path().extension() == ".sqlite") shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  for (const fs::path& shard : shards) {
    for (const ShardRun& run : ReadShardRuns(shard.string())) {
      if (run.mode != "sim") continue;
      Seen& s = seen[{run.config_sha256, run.trace_sha256}];
      const std::string where = "run " + std::to_string(run.run_id) + " in shards/" +
                                shard.filename().string();
      if (run.complete) {
        s.complete = true;
      } else if (run.status == "running") {
        s.killed = true;
        s.where = where;
      } else {
        s.failed = true;
        s.error = run.error;
        s.where = where;
      }
    }
  }

  // Slurm's output files: the newest of each task (job ids grow), and its last line that is
  // Slurm's (a time limit, a cancellation, the OOM killer) or kvtier's end line.
  std::map<int, std::pair<long long, fs::path>> newest_log;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "logs", ec)) {
    const std::string name = e.path().stem().string();  // <job>_<task>
    const auto us = name.find('_');
    if (e.path().extension() != ".out" || us == std::string::npos) continue;
    try {
      const long long job = std::stoll(name.substr(0, us));
      const int task = std::stoi(name.substr(us + 1));
      auto it = newest_log.find(task);
      if (it == newest_log.end() || job > it->second.first) newest_log[task] = {job, e.path()};
    } catch (const std::exception&) {
    }
  }
  auto log_note = [&](int task) -> std::string {
    auto it = newest_log.find(task);
    if (it == newest_log.end()) return "";
    std::ifstream in(it->second.second);
    std::string line, note;
    while (std::getline(in, line)) {
      if (line.find("slurmstepd") != std::string::npos || line.find("CANCELLED") != std::string::npos ||
          line.find("oom") != std::string::npos || line.rfind("kvtier task ", 0) == 0) {
        note = line;
      }
    }
    return "logs/" + it->second.second.filename().string() + (note.empty() ? "" : ": " + note);
  };

  // Tasks Slurm still has (pending or running), by the job name of this directory.
  std::map<int, std::string> queued;
  std::string squeue_out;
  const int rc = Capture({"squeue", "--noheader", "--array", "--name=" + JobName(dir),
                          "--format=%i %T"},
                         &squeue_out);
  const bool have_squeue = rc == 0;
  if (have_squeue) {
    std::istringstream in(squeue_out);
    std::string id, state;
    while (in >> id >> state) {
      const auto us = id.find('_');
      if (us == std::string::npos) continue;
      try {
        queued[std::stoi(id.substr(us + 1))] = state;
      } catch (const std::exception&) {
      }
    }
  }

  std::size_t done = 0, killed = 0, failed = 0, missing = 0, active = 0;
  std::set<int> resubmit, rerun_failed;
  for (const GridLine& p : grid) {
    auto it = seen.find({p.config_sha256, p.trace_sha256});
    const Seen* s = it == seen.end() ? nullptr : &it->second;
    if (s != nullptr && s->complete) {
      ++done;
      continue;
    }
    const auto q = queued.find(p.task);
    const std::string head = "point " + std::to_string(p.point) + " (task " +
                             std::to_string(p.task) + ") ";
    if (q != queued.end()) {
      ++active;
      std::printf("%s%s: %s\n", head.c_str(), q->second == "PENDING" ? "queued" : "running",
                  p.label.c_str());
    } else if (s != nullptr && s->failed) {
      ++failed;
      rerun_failed.insert(p.task);
      std::printf("%sfailed: %s (%s: %s)\n", head.c_str(), p.label.c_str(), s->where.c_str(),
                  s->error.c_str());
    } else if (s != nullptr && s->killed) {
      ++killed;
      resubmit.insert(p.task);
      const std::string note = log_note(p.task);
      std::printf("%skilled: %s (%s, complete = 0%s%s)\n", head.c_str(), p.label.c_str(),
                  s->where.c_str(), note.empty() ? "" : "; ", note.c_str());
    } else {
      ++missing;
      resubmit.insert(p.task);
      const std::string note = log_note(p.task);
      std::printf("%smissing: %s%s%s%s\n", head.c_str(), p.label.c_str(),
                  note.empty() ? "" : " (", note.c_str(), note.empty() ? "" : ")");
    }
  }
  std::printf("%s: %zu points: %zu done, %zu killed, %zu failed, %zu missing, %zu queued or "
              "running%s\n",
              dir.c_str(), grid.size(), done, killed, failed, missing, active,
              have_squeue ? "" : " (squeue did not answer: tasks still queued or running show as "
                                 "missing or killed)");
  if (!resubmit.empty()) {
    std::printf("resubmit the missing and killed points:\n  sbatch --array=%s %s/job.sh\n",
                Ranges({resubmit.begin(), resubmit.end()}).c_str(), dir.c_str());
  }
  if (!rerun_failed.empty()) {
    std::printf("rerun the failed points once their cause is fixed:\n  sbatch "
                "--export=ALL,KVTIER_SWEEP_FLAGS=--rerun-failed --array=%s %s/job.sh\n",
                Ranges({rerun_failed.begin(), rerun_failed.end()}).c_str(), dir.c_str());
  }
  if (done == grid.size()) {
    std::printf("all %zu points done; merge: kvtier merge %s/shards/*.sqlite --out ALL.sqlite\n",
                grid.size(), dir.c_str());
  }
  return 0;
}

}  // namespace kvtier::cli
