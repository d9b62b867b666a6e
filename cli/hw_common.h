#pragma once
// Helpers shared by `kvtier hw` and `kvtier validate`.

#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace kvtier::cli {

// Parses `--config X.ini [--systems a,b] --out R.sqlite [--key=value ...]` (plus the extra
// options `extra` names, returned in *values) into one validated Config per system, like
// `kvtier sim`. Returns false when --help was printed.
struct SystemsArgs {
  std::string config_path;
  std::string out;
  std::string trace;
  std::vector<std::string> overrides;
  std::vector<std::pair<std::string, Config>> runs;
  double progress_s = 2;
};
bool ParseSystemsArgs(const std::vector<std::string>& args, const char* command,
                      const char* usage, SystemsArgs* out);

// Runs each system on this machine's hardware, one child process at a time (systems never
// share the disk or the cores while measured). Returns the run ids; *worst_exit the largest
// child exit code.
std::vector<long long> RunHwSystems(const std::vector<std::pair<std::string, Config>>& runs,
                                    const std::string& trace, const std::string& out,
                                    double progress_s, int* worst_exit);

}  // namespace kvtier::cli
