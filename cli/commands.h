#pragma once
// The subcommands of `kvtier`. Each lives in cli/cmd_<name>.cc and is listed once in the
// table in cli/main.cc (no self-registration). A command receives the arguments after its
// name, prints to stdout/stderr, and returns the process exit code: 0 success, 1 a runtime
// failure, 2 bad input (InputError). Commands may throw InputError; main turns it into exit 2.

#include <string>
#include <vector>

namespace kvtier::cli {

using Args = std::vector<std::string>;

struct Command {
  const char* name;     // "sim", "trace", ...
  const char* summary;  // one line for `kvtier --help`
  int (*run)(const Args& args);
};

// The table in main.cc; exposed so `kvtier help` and tests can list it.
const std::vector<Command>& AllCommands();

int RunConfig(const Args& args);  // cli/cmd_config.cc
int RunModel(const Args& args);   // cli/cmd_model.cc
int RunTrace(const Args& args);   // cli/cmd_trace.cc
int RunSim(const Args& args);     // cli/cmd_sim.cc
int RunSweep(const Args& args);   // cli/cmd_sweep.cc
int RunLm(const Args& args);      // cli/cmd_lm.cc
int RunHw(const Args& args);        // cli/cmd_hw.cc
int RunCalibrate(const Args& args); // cli/cmd_calibrate.cc
int RunValidate(const Args& args);  // cli/cmd_validate.cc
int RunTraceRecord(const Args& args);  // cli/cmd_record.cc (`kvtier trace record`)
int RunEval(const Args& args);         // cli/cmd_eval.cc
// Defaults shared by record and eval (cli/cmd_record.cc): the GGUF file, the repository's data/,
// and the directory of datasets that may not be committed (RTE, OpenBookQA).
std::string DefaultModelPath();
std::string DefaultRepoDataDir();
std::string DefaultSharedDataDir();

}  // namespace kvtier::cli
