#pragma once
// Helpers shared by `kvtier sim` and `kvtier sweep`.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace kvtier::cli {

std::vector<std::string> SplitList(const std::string& text);
// The trace an experiment names (workload.trace), resolved against the experiment file's
// directory; throws ConfigError if absent.
std::string ResolveTrace(const Config& config, const std::string& experiment_path);
// Called in the parent when a child ends: its label and exit code.
using DoneFn = std::function<void(const std::string& label, int exit_code)>;
// Runs each (label, config) in a child process, at most `jobs` at once, on the trace its
// workload.trace names (already resolved with ResolveTrace); returns the run ids of those that
// finished. *worst_exit receives the largest child exit code.
std::vector<long long> RunSystems(const std::vector<std::pair<std::string, Config>>& runs,
                                  const std::string& out, int jobs,
                                  double progress_s, int* worst_exit, const DoneFn& on_done);
void PrintComparison(const std::string& out, const std::vector<long long>& run_ids);

}  // namespace kvtier::cli
