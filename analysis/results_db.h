#pragma once
// ResultsDb: the SQLite file both modes write (schema: analysis/schema.sql, documented in
// analysis/SCHEMA.md). A run is a row in `runs` created with complete = 0; its requests,
// layers, transfers and decisions are buffered by SqliteRunLog and written in batches (every
// 256 requests or second, and at RunLog::Close), each one short transaction, with WAL
// journaling, so a killed run leaves a consistent file whose run is marked incomplete (status
// 'running'). Several processes may write one file (sweeps): writes
// wait on the lock (busy timeout) instead of failing.
//
// Errors opening or writing the file are InputErrors naming the path (exit 2 in the CLI); a
// failed write or statement is a ResultsWriteError, which a run in progress turns into a
// failed run (Experiment::Run: RunFailed, exit 3): the disk filling mid-run is not bad input.
// Not thread-safe: one ResultsDb per thread/process.
//
// Schema versions: a file records the version of the schema it was created with in
// `PRAGMA user_version`. A ResultsDb creates the schema in an empty file and refuses (InputError)
// a file of any other version, older or newer: no migration (analysis/SCHEMA.md, "Versions").

#include <memory>
#include <string>

#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "core/run_log.h"

struct sqlite3;

namespace kvtier {

// Removes the results file at `path` (with its -wal, -shm and -journal files) when the scope
// ends without Keep() and the file did not exist when the guard was made: a command that
// fails before its first run (a bad model, a bad shard) leaves no empty results file of its
// own making behind, and never touches a file that was there. Declare it before the
// ResultsDb, so the connection is closed when it removes the file.
class NewResultsFileGuard {
 public:
  explicit NewResultsFileGuard(std::string path);
  ~NewResultsFileGuard();
  NewResultsFileGuard(const NewResultsFileGuard&) = delete;
  NewResultsFileGuard& operator=(const NewResultsFileGuard&) = delete;
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_;
};

// A statement on the results file failed: a write (disk full, an I/O error, a lock held past
// the busy timeout) or a transaction. Before a run begins it is an unusable output (exit 2).
class ResultsWriteError : public InputError {
 public:
  explicit ResultsWriteError(const std::string& what) : InputError(what) {}
};

// The version of analysis/schema.sql + views.sql, stored in PRAGMA user_version. Bump it with
// every change of either file (tests/analysis/results_db_test.cc pins the text to it).
inline constexpr int kResultsSchemaVersion = 4;

struct RunInfo {
  std::string mode = "sim";  // "sim" | "hw"
  std::string experiment;
  std::string system;
  std::string model;
  std::string hardware;
  std::string trace;
  std::string trace_sha256;
  std::string config;        // resolved configuration text
  std::string config_sha256;
};

class ResultsDb {
 public:
  // Opens or creates `path` and applies the schema to a new file. Throws InputError naming the
  // path: cannot open or create it, not an SQLite file, a schema of another version.
  explicit ResultsDb(const std::string& path);
  ~ResultsDb();
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;

  // Inserts a run row (complete = 0) and returns its id.
  long long BeginRun(const RunInfo& info);
  // Marks the run finished, every request logged: wall time, complete = 1, status 'ok'.
  void EndRun(long long run_id, double wall_s);
  // Marks the run stopped by a run-time failure (an I/O or CUDA error; core/pipeline.h):
  // complete = 0, status 'failed', error = `error`. A killed run keeps complete = 0 and status
  // 'running', so the two are told apart.
  void FailRun(long long run_id, double wall_s, const std::string& error);
  // After `e` stopped run `run_id` (the file stopped taking its rows): marks the run failed
  // with "results file: <e>" if the file still takes that, and returns the message to report,
  // which says when even the mark failed (the run then stays incomplete). Never throws.
  std::string FailRunAfterWriteError(long long run_id, double wall_s, const ResultsWriteError& e);
  // What a resumed sweep finds of a configuration point in `mode`: kDone, a complete run that
  // ended ok; else kFailed, a run that failed (FailRun: status 'failed');
  // else kNone (never run, or only runs a kill interrupted: complete = 0, status 'running').
  enum class PointState { kNone, kDone, kFailed };
  PointState GetPointState(const std::string& config_sha256, const std::string& mode);
  // Deletes the runs of this configuration a kill interrupted (complete = 0, status 'running'),
  // before the point is run again.
  void DeleteIncompleteRuns(const std::string& config_sha256, const std::string& mode);
  // Deletes the runs of this configuration that ended with an error (sweep --rerun-failed).
  void DeleteFailedRuns(const std::string& config_sha256, const std::string& mode);

  // A RunLog that writes the rows of `run_id` (transfer rows only if `log_transfers`: they can
  // dominate the file; the config key log.transfers). Valid while this ResultsDb lives.
  std::unique_ptr<RunLog> NewRunLog(long long run_id, bool log_transfers = true);

  // Runs SQL (e.g. analysis/views.sql) on the file. Throws InputError on failure.
  void Exec(const std::string& sql);
  sqlite3* handle() { return db_; }
  const std::string& path() const { return path_; }

 private:
  void ApplySchema();
  long long QueryInt(const char* sql);

  std::string path_;
  sqlite3* db_ = nullptr;
};

// Identifies a configuration point: SHA-256 of the resolved configuration text (Config::Dump
// without origins) and the trace's hash. Runs store it; sweeps skip points that have one.
std::string ConfigSha256(const Config& config, const std::string& trace_sha256);

// The runs row of a run of `config` in `mode` ("sim", "hw") on `trace_path`.
RunInfo MakeRunInfo(const std::string& mode, const Config& config, const ExperimentOptions& opts,
                    const std::string& trace_path);

// Hex SHA-256 of a file's bytes ("" and no throw if it cannot be read) and of a string.
std::string Sha256File(const std::string& path);
std::string Sha256(const std::string& data);
// The git commit kvtier was built from (configure time), or "unknown".
std::string GitCommit();

}  // namespace kvtier
