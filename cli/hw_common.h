#pragma once
// Helpers shared by `kvtier hw` and `kvtier validate`.

#include <string>
#include <utility>
#include <vector>

#include "cli/sim_common.h"
#include "core/config.h"

namespace kvtier::cli {

// Parses `--config X.ini [--systems a,b] --out R.sqlite [--quiet] [--key=value ...]` (plus the extra
// options `extra` names, returned in *values) into one validated Config per system, like
// `kvtier sim`. Returns false when --help was printed.
struct SystemsArgs {
  std::string config_path;
  std::string out;
  std::string trace;
  std::vector<std::string> overrides;
  std::vector<std::pair<std::string, Config>> runs;
  double progress_s = 2;
  bool quiet = false;  // --quiet: no progress lines
  // The Progress options of the runs: log.progress between lines when not on a terminal.
  ProgressOptions progress() const {
    ProgressOptions o;
    o.interval_s = progress_s;
    o.quiet = quiet;
    return o;
  }
};
bool ParseSystemsArgs(const std::vector<std::string>& args, const char* command,
                      const char* usage, SystemsArgs* out);

// The hardware run as a ChildFn for RunInChildren (cli/sim_common.h): hw::RunHardware on the
// config's resolved workload.trace into `out`. Run it with jobs = 1: systems measured at the
// same time would share the disk and the cores.
ChildFn HwChild(const std::string& out);

}  // namespace kvtier::cli
