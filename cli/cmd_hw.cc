// kvtier hw: replay a trace through one or more systems on this machine's real disk, memory
// and device (hw/run_hw.h), and compare them like `kvtier sim`.
//
//   kvtier hw --config configs/experiments/X.ini [--systems a,b,c] --out R.sqlite
//             [--section.key=value ...]
//
// Each system runs in its own child process, one after another (measured systems never share
// the machine), and writes one run with mode = 'hw' into the same SQLite file; the parent
// prints the comparison table from the run_summary view.

#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "analysis/results_db.h"
#include "cli/commands.h"
#include "cli/hw_common.h"
#include "cli/sim_common.h"
#include "core/errors.h"
#include "core/options.h"
#include "hw/run_hw.h"

namespace kvtier::cli {

namespace po = boost::program_options;

bool ParseSystemsArgs(const std::vector<std::string>& args, const char* command,
                      const char* usage, SystemsArgs* out) {
  po::options_description desc(std::string("kvtier ") + command + " options");
  std::string systems_arg;
  desc.add_options()("help,h", "show this help")(
      "config", po::value(&out->config_path)->required(), "experiment INI file")(
      "systems", po::value(&systems_arg), "systems, comma-separated (default: "
                                           "experiment.systems, else include.system)")(
      "out", po::value(&out->out)->required(), "results SQLite file (created or appended)");
  po::variables_map vm;
  try {
    const int style = po::command_line_style::default_style &
                      ~po::command_line_style::allow_guessing;
    po::parsed_options parsed =
        po::command_line_parser(args).options(desc).style(style).allow_unregistered().run();
    out->overrides = po::collect_unrecognized(parsed.options, po::include_positional);
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::ostringstream s;
      s << desc;
      std::printf("usage: %s\n%s", usage, s.str().c_str());
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(std::string("command line: ") + e.what() + " (kvtier " + command + " --help)");
  }
  for (const auto& o : out->overrides) {
    if (o.rfind("--", 0) != 0 || o.find('=') == std::string::npos) {
      throw InputError("command line: unexpected argument '" + o + "' (overrides are --key=value)");
    }
  }
  Config base = Config::Load(out->config_path, out->overrides);
  std::vector<std::string> systems =
      SplitList(!systems_arg.empty() ? systems_arg : base.GetString("experiment.systems"));
  if (systems.empty() && base.Has("include.system")) systems = {base.GetString("include.system")};
  if (systems.empty()) {
    throw ConfigError(out->config_path + ": no system to run: pass --systems or set "
                      "experiment.systems / include.system");
  }
  for (const std::string& system : systems) {
    std::vector<std::string> with_system = out->overrides;
    with_system.push_back("--include.system=" + system);
    Config c = Config::Load(out->config_path, with_system);
    BuildOptions(c);
    out->runs.emplace_back(system, std::move(c));
  }
  out->trace = ResolveTrace(base, out->config_path);
  for (auto& run : out->runs) {  // the resolved path, as RunSystems expects
    run.second.Set("workload.trace", out->trace, run.second.Get("workload.trace").origin);
  }
  out->progress_s = base.GetDuration("log.progress");
  { ResultsDb check(out->out); }  // creates the schema; an unwritable path fails here (exit 2)
  return true;
}

namespace {

int RunHwChild(const Config& config, const std::string& trace, const std::string& out,
               const std::string& label, double progress_s, int result_fd) {
  auto last = std::chrono::steady_clock::now();
  auto progress = [&](long long done, long long total, double t) {
    auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last).count() < progress_s) return;
    last = now;
    std::fprintf(stderr, "  %-12s %lld/%lld requests, %.1f s\n", label.c_str(), done, total, t);
  };
  try {
    hw::HwRunResult r = hw::RunHardware(config, trace, out, progress);
    std::fprintf(stderr, "  %-12s done: %lld requests, %.2f s measured, %.2f s wall\n",
                 label.c_str(), r.requests, r.measured_s, r.wall_s);
    std::string id = std::to_string(r.run_id) + "\n";
    if (write(result_fd, id.data(), id.size()) < 0) return 1;
    return 0;
  } catch (const InputError& e) {
    std::fprintf(stderr, "kvtier hw (%s): error: %s\n", label.c_str(), e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtier hw (%s): internal error: %s\n", label.c_str(), e.what());
    return 1;
  }
}

}  // namespace

std::vector<long long> RunHwSystems(const std::vector<std::pair<std::string, Config>>& runs,
                                    const std::string& trace, const std::string& out,
                                    double progress_s, int* worst_exit) {
  std::vector<long long> ids;
  *worst_exit = 0;
  for (const auto& [label, config] : runs) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(fds[0]);
      int code = RunHwChild(config, trace, out, label, progress_s, fds[1]);
      std::fflush(nullptr);
      _exit(code);
    }
    close(fds[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    char buf[64] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code == 0 && n > 0) ids.push_back(std::atoll(buf));
    *worst_exit = std::max(*worst_exit, code);
  }
  return ids;
}

int RunHw(const Args& args) {
  SystemsArgs a;
  if (!ParseSystemsArgs(args, "hw",
                        "kvtier hw --config X.ini --out R.sqlite [--systems a,b] "
                        "[--section.key=value ...]",
                        &a)) {
    return 0;
  }
  std::fprintf(stderr, "kvtier hw: %zu system(s) on %s, trace %s -> %s\n", a.runs.size(),
               a.runs.front().second.GetString("model.name").c_str(), a.trace.c_str(),
               a.out.c_str());
  int worst = 0;
  std::vector<long long> ids = RunHwSystems(a.runs, a.trace, a.out, a.progress_s, &worst);
  PrintComparison(a.out, ids);
  return worst;
}

}  // namespace kvtier::cli
