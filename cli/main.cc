// kvtier: which prefix-KV caching, loading and prefetching policy gives the lowest TTFT,
// at what accuracy cost, on which hardware. See README.md and docs/architecture.md.

#include <cstdio>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "core/errors.h"

namespace kvtier::cli {

const std::vector<Command>& AllCommands() {
  static const std::vector<Command> kCommands = {
      {"config", "print the resolved, validated configuration (or --keys, --check)", RunConfig},
      {"model", "a model's KV sizes and prefix recompute vs load times", RunModel},
      {"trace", "importance traces: gen, record, import-mooncake, stats, fit, info", RunTrace},
      {"sim", "simulate systems on a trace and hardware profile; compare TTFT", RunSim},
      {"sweep", "simulate a grid of configurations in parallel, resumable", RunSweep},
      {"merge", "merge results files (a Slurm sweep's shards) into one under new run ids", RunMerge},
      {"lm", "the real small LM (GGUF): generate, perplexity, tokenize", RunLm},
      {"hw", "run systems on this machine's disk, memory and device; compare TTFT", RunHw},
      {"calibrate", "measure this machine and write a hardware profile for the simulator", RunCalibrate},
      {"validate", "run sim and hw on the same trace; report the simulator's TTFT error", RunValidate},
      {"eval", "accuracy of each KV selector on few-shot tasks with the real small LM", RunEval},
      {"report", "figures (PNG, SVG, CSV) and an index.html from a results database", RunReport},
  };
  return kCommands;
}

namespace {

void PrintUsage(std::FILE* out) {
  std::fprintf(out, "usage: kvtier <command> [options]   (kvtier <command> --help for details)\n\n");
  std::fprintf(out, "commands:\n");
  for (const Command& c : AllCommands()) std::fprintf(out, "  %-16s %s\n", c.name, c.summary);
  std::fprintf(out, "\n%s", kExitStatusHelp);
}

}  // namespace
}  // namespace kvtier::cli

int main(int argc, char** argv) {
  using namespace kvtier::cli;
  if (argc < 2) {
    PrintUsage(stderr);
    return kvtier::kExitBadInput;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(stdout);
    return 0;
  }
  Args args(argv + 2, argv + argc);
  for (const Command& c : AllCommands()) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const kvtier::InputError& e) {
      std::fprintf(stderr, "kvtier %s: error: %s\n", c.name, e.what());
      return kvtier::kExitBadInput;
    } catch (const kvtier::RunFailed& e) {
      std::fprintf(stderr, "kvtier %s: run failed: %s\n", c.name, e.what());
      return kvtier::kExitRunFailed;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvtier %s: internal error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "kvtier: unknown command '%s'\n\n", name.c_str());
  PrintUsage(stderr);
  return kvtier::kExitBadInput;
}
