#pragma once
// Helpers shared by `kvtier hw` and `kvtier validate`.

#include <string>

#include "cli/experiment_args.h"
#include "cli/sim_common.h"
#include "core/config.h"

namespace kvtier::cli {

// The command-line description of a hardware-measuring experiment command (hw, validate): the
// common experiment flags with --jobs limited to 1.
ExperimentCommand HwCommand(const char* name, const char* about, const char* notes = "");

// Adds hw's and validate's --quiet (no progress lines on stderr) to `a`; Parse sets *quiet.
void AddQuietFlag(ExperimentArgs* a, bool* quiet);

// The Progress options (cli/progress.h) of hw's and validate's runs: a line every log.progress
// when stderr is not a terminal, nothing with --quiet.
ProgressOptions HwProgressOptions(const Config& base, bool quiet);

// The hardware run as a ChildFn for RunInChildren (cli/sim_common.h): hw::RunHardware on the
// config's resolved workload.trace into `out`. Run it with jobs = 1: systems measured at the
// same time would share the disk and the cores.
ChildFn HwChild(const std::string& out);

}  // namespace kvtier::cli
