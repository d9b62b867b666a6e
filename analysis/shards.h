#pragma once
// Shards: results files written apart -- one per Slurm array task of a sweep (docs/scale-out.md)
// -- read for a sweep's status and merged into one file. The SQL lives here, beside the schema
// (analysis/schema.sql); cli/ holds none.
//
// A *point* is a configuration on a trace in a mode, identified by runs.config_sha256 (the
// resolved configuration and the trace's SHA-256; ConfigSha256 in results_db.h), its
// runs.trace_sha256 and runs.mode. A run of a point is *complete* when runs.complete = 1;
// otherwise it was killed (status 'running': nothing recorded its end) or failed (status
// 'failed', runs.error says why).
//
// Errors (a file that is missing, not SQLite, or of another schema) are InputErrors naming the
// file: exit 2 in the CLI. Not thread-safe; each call opens its own connections.

#include <functional>
#include <string>
#include <vector>

namespace kvtier {

// One row of a shard's `runs`, as status and merge need it.
struct ShardRun {
  long long run_id = 0;
  std::string mode;
  std::string system;
  std::string config_sha256;
  std::string trace_sha256;
  bool complete = false;
  std::string status;  // running | ok | failed
  std::string error;   // status 'failed': what stopped it
  // "complete", "killed" (complete = 0, status 'running') or "failed" (any other status).
  const char* State() const;
};

// Every run of the results file `path`, in run id order. Opens the file read-only (a shard a
// running task writes can be read). Throws InputError naming the path: no such file, not an
// SQLite file, no `runs` table.
std::vector<ShardRun> ReadShardRuns(const std::string& path);

struct MergeOptions {
  // Also merge incomplete runs (killed or failed), with their rows as they are. Off: they are
  // reported and left out.
  bool include_incomplete = false;
};

// What merging one shard did.
struct MergeShardReport {
  std::string shard;
  std::size_t runs = 0;     // runs in the shard
  std::size_t merged = 0;   // copied into the target under new run ids
  std::size_t already = 0;  // left out: the target already holds the point complete (or this
                            // very incomplete run, with include_incomplete)
  std::vector<ShardRun> incomplete;  // killed and failed runs (merged only with
                                     // include_incomplete)
  long long rows = 0;                // rows of the run tables copied (requests, layers, ...)
};

// Merges the runs of `shards` into the results file `out` (created with the current schema if
// it does not exist) under new run ids, with every row of every table that references a run
// (requests, layers, transfers, decisions, metrics, accuracy: every table of the schema with a
// run_id column, so a table added later is merged too).
//
// Idempotent: a complete run whose point (config_sha256, trace_sha256, mode) already has a
// complete run in `out` is left out, so merging twice, or a shard whose points were merged
// from another shard, adds nothing. Each run is copied in its own transaction, so an
// interrupted merge leaves `out` consistent and a rerun completes it.
//
// Every shard's schema is checked before anything is written: each must have the schema
// version (PRAGMA user_version) and the tables and columns of the schema `out` has. Throws
// InputError naming the file otherwise, or when a shard is missing, not SQLite, or is `out`.
// `on_shard` (may be empty) is called after each shard is merged.
std::vector<MergeShardReport> MergeShards(
    const std::vector<std::string>& shards, const std::string& out, const MergeOptions& options,
    const std::function<void(const MergeShardReport&)>& on_shard = {});

}  // namespace kvtier
