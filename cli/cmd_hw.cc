// kvtier hw: replay a trace through one or more systems on this machine's real disk, memory
// and device (hw/run_hw.h), and compare them like `kvtier sim`.
//
//   kvtier hw --config configs/experiments/X.ini [--systems a,b,c] --out R.sqlite
//             [--section.key=value ...]
//
// Each system runs in its own child process, one after another (measured systems never share
// the machine), and writes one run with mode = 'hw' into the same SQLite file; the parent
// prints the comparison table from the run_summary view.

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
      "out", po::value(&out->out)->required(), "results SQLite file (created or appended)")(
      "quiet", po::bool_switch(&out->quiet), "no progress lines (rate and ETA on stderr)");
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
      std::printf("usage: %s\n%s\n%s", usage, s.str().c_str(), kExitStatusHelp);
      if (std::string(command) == "validate") {
        std::printf("(validate exits 3 when one of its hw runs failed, without simulating or "
                    "comparing anything.)\n");
      }
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

ChildFn HwChild(const std::string& out) {
  return [out](const Config& config, const ProgressFn& progress) {
    const std::string trace = config.GetString("workload.trace");  // resolved by the caller
    hw::HwRunResult r = hw::RunHardware(config, trace, out, progress);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%lld requests, %.2f s measured, %.2f s wall", r.requests,
                  r.measured_s, r.wall_s);
    return ChildRun{r.run_id, buf};
  };
}

int RunHw(const Args& args) {
  SystemsArgs a;
  if (!ParseSystemsArgs(args, "hw",
                        "kvtier hw --config X.ini --out R.sqlite [--systems a,b] [--quiet] "
                        "[--section.key=value ...]",
                        &a)) {
    return 0;
  }
  if (!a.quiet) {
    std::fprintf(stderr, "kvtier hw: %zu system(s) on %s, trace %s -> %s\n", a.runs.size(),
                 a.runs.front().second.GetString("model.name").c_str(), a.trace.c_str(),
                 a.out.c_str());
  }
  int worst = 0;
  // One system at a time: measured runs never share the disk or the cores.
  const ProgressOptions progress = a.progress();
  std::vector<long long> ids =
      RunInChildren(a.runs, 1, a.progress_s, "hw", HwChild(a.out), &worst, nullptr, &progress);
  PrintComparison(a.out, ids);
  return worst;
}

}  // namespace kvtier::cli
