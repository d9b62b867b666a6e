#pragma once
// The subcommands of `kvtier`. Each lives in cli/cmd_<name>.cc and is listed once in the
// table in cli/main.cc (no self-registration). A command receives the arguments after its
// name, prints to stdout/stderr, and returns the process exit code: 0 success, 2 bad input
// (InputError, before any run), 3 a run failed at run time (RunFailed: recorded in the results
// database with runs.status = 'failed'), 1 an internal error. Commands may throw InputError
// and RunFailed; main turns them into exit 2 and 3.

#include <string>
#include <vector>

namespace kvtier::cli {

using Args = std::vector<std::string>;

// The exit codes, as `--help` of every command that runs systems prints them.
inline constexpr const char* kExitStatusHelp =
    "exit status: 0 every run completed; 2 bad input (config, trace, flags, an unusable output "
    "or store), found before any run starts; 3 a run failed at run time (an I/O or CUDA error: "
    "recorded in the results database as runs.status = 'failed' with runs.error, "
    "complete = 0); 1 an internal error.\n";

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
int RunMerge(const Args& args);   // cli/cmd_merge.cc
int RunLm(const Args& args);      // cli/cmd_lm.cc
int RunHw(const Args& args);        // cli/cmd_hw.cc
int RunCalibrate(const Args& args); // cli/cmd_calibrate.cc
int RunValidate(const Args& args);  // cli/cmd_validate.cc
int RunTraceRecord(const Args& args);  // cli/cmd_record.cc (`kvtier trace record`)
int RunEval(const Args& args);         // cli/cmd_eval.cc
int RunReport(const Args& args);       // cli/cmd_report.cc (runs analysis/report.py)
// Defaults shared by record and eval (cli/cmd_record.cc): the GGUF file, the repository's data/,
// and the directory of datasets that may not be committed (RTE, OpenBookQA).
std::string DefaultModelPath();
std::string DefaultRepoDataDir();
std::string DefaultSharedDataDir();

}  // namespace kvtier::cli
