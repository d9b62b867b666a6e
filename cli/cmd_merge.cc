// kvtier merge: results files written apart (the shards of a Slurm sweep, docs/scale-out.md)
// into one, under new run ids.
//
//   kvtier merge SHARD... --out ALL.sqlite [--include-incomplete]
//
// The work is analysis/shards.h's MergeShards; this command parses, prints what each shard
// gave, and lists the incomplete runs it left out.

#include <boost/program_options.hpp>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/shards.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "core/errors.h"

namespace kvtier::cli {

namespace po = boost::program_options;

int RunMerge(const Args& args) {
  std::vector<std::string> shards;
  std::string out;
  MergeOptions options;
  po::options_description desc("kvtier merge options");
  desc.add_options()("help,h", "show this help")(
      "out", po::value(&out)->required()->value_name("ALL.sqlite"),
      "the merged results file (created, or added to)")(
      "include-incomplete", po::bool_switch(&options.include_incomplete),
      "also merge killed and failed runs (complete = 0)");
  po::options_description all;
  all.add(desc).add_options()("shard", po::value(&shards));
  po::positional_options_description positional;
  positional.add("shard", -1);
  po::variables_map vm;
  StoreArgs("merge", args, all, desc, &vm, &positional);  // no option-name guessing
  if (vm.count("help")) {
    std::ostringstream s;
    s << desc;
    std::printf(
        "usage: kvtier merge SHARD... --out ALL.sqlite [--include-incomplete]\n\n"
        "Copies the runs of the results files SHARD... (e.g. a Slurm sweep's DIR/shards/*.sqlite)\n"
        "into ALL.sqlite under new run ids, with all their rows, one transaction per run. A\n"
        "complete run of a point (configuration hash, trace hash, mode) that ALL.sqlite already\n"
        "holds complete is skipped, so merging again, or after an interrupted merge, adds each\n"
        "point once. Incomplete runs (killed, or failed: complete = 0) are listed and left out.\n"
        "Shards must have the schema of this kvtier.\n\n%s\n"
        "exit status: 0 merged; 2 bad input (a shard missing, not SQLite or of another schema,\n"
        "an unusable --out), nothing written.\n",
        s.str().c_str());
    return 0;
  }
  NotifyArgs("merge", &vm);
  if (shards.empty()) throw InputError("command line: no shard to merge (kvtier merge --help)");

  std::size_t merged = 0, already = 0, left_out = 0;
  MergeShards(shards, out, options, [&](const MergeShardReport& r) {
    merged += r.merged;
    already += r.already;
    std::fprintf(stderr, "%s: %zu runs: %zu merged (%lld rows), %zu already in %s", r.shard.c_str(),
                 r.runs, r.merged, r.rows, r.already, out.c_str());
    if (!r.incomplete.empty()) {
      std::fprintf(stderr, ", %zu incomplete%s", r.incomplete.size(),
                   options.include_incomplete ? " (merged)" : " (left out)");
    }
    std::fprintf(stderr, "\n");
    for (const ShardRun& run : r.incomplete) {
      if (!options.include_incomplete) ++left_out;
      std::fprintf(stderr, "  run %lld %s %s config %.12s: %s%s%s\n", run.run_id,
                   run.mode.c_str(), run.system.c_str(), run.config_sha256.c_str(), run.State(),
                   run.error.empty() ? "" : ": ", run.error.c_str());
    }
  });
  std::printf("merged %zu runs into %s (%zu already there, %zu incomplete left out)\n", merged,
              out.c_str(), already, left_out);
  return 0;
}

}  // namespace kvtier::cli
