#include "analysis/results_db.h"

#include <sqlite3.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/errors.h"

namespace kvtier {

extern const char* const kResultsSchemaSql;  // generated from analysis/schema.sql
extern const char* const kResultsViewsSql;   // generated from analysis/views.sql

namespace {

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql, const std::string& path) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      throw InputError(path + ": cannot prepare statement: " + sqlite3_errmsg(db));
    }
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt& Bind(int i, long long v) { sqlite3_bind_int64(stmt_, i, v); return *this; }
  Stmt& Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); return *this; }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.c_str(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // For text that outlives the statement's next step (the static names of tiers, kinds and
  // purposes): bound without a copy.
  Stmt& BindStatic(int i, std::string_view v) {
    sqlite3_bind_text(stmt_, i, v.data(), int(v.size()), SQLITE_STATIC);
    return *this;
  }
  Stmt& BindNull(int i) { sqlite3_bind_null(stmt_, i); return *this; }
  // Steps once; returns true if a row is available.
  bool Step(const std::string& path) {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) {
      throw ResultsWriteError(path + ": write failed: " + sqlite3_errmsg(db_));
    }
    return false;
  }
  // Every caller binds every parameter before the next step, so bindings are not cleared.
  void Reset() { sqlite3_reset(stmt_); }
  sqlite3_stmt* get() { return stmt_; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Buffers a batch of requests' rows in memory and writes it in one short transaction
// (BEGIN IMMEDIATE ... COMMIT) when the batch is due: kFlushesPerBatch requests or
// kBatchSeconds of wall time since the last write, whichever comes first, and at Close().
// Holding no transaction while the run computes lets parallel sweep processes share one file
// without waiting on each other's runs, and a commit per request was ~40% of the SQLite time in
// sim_bench (spec, ~180 rows per request). A killed run loses at most the last batch, and its
// run stays incomplete either way (runs.complete is set by EndRun after Close).
class SqliteRunLog : public RunLog {
 public:
  SqliteRunLog(ResultsDb* db, long long run_id, bool log_transfers)
      : db_(db), run_(run_id), log_transfers_(log_transfers),
        request_(db->handle(),
                 // Plain INSERT: a second row for a (run, request) is a bug to report, never a
                 // row to replace (run ids are never reused: AUTOINCREMENT).
                 "INSERT INTO requests VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                 db->path()),
        layer_(db->handle(), InsertSql("layers", kLayerColumns, 1).c_str(), db->path()),
        layers_n_(db->handle(), InsertSql("layers", kLayerColumns, kRowsPerInsert).c_str(),
                  db->path()),
        transfer_(db->handle(), InsertSql("transfers", kTransferColumns, 1).c_str(), db->path()),
        transfers_n_(db->handle(),
                     InsertSql("transfers", kTransferColumns, kRowsPerInsert).c_str(),
                     db->path()),
        decision_(db->handle(), "INSERT INTO decisions VALUES (?,?,?,?,?,?,?)", db->path()),
        metric_(db->handle(), "INSERT OR REPLACE INTO metrics VALUES (?,?,?)", db->path()),
        decode_step_(db->handle(), "INSERT INTO decode_steps VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     db->path()),
        decode_request_(db->handle(), "INSERT INTO decode_requests VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        db->path()) {}
  ~SqliteRunLog() override {
    try {
      Write();  // best effort on error paths; a finished run calls Close() first
    } catch (...) {
    }
  }

  void LogRequest(const RequestRecord& r) override { requests_.push_back(r); }
  void LogLayer(const LayerRecord& r) override { layers_.push_back(r); }
  void LogTransfer(const TransferRecord& r) override {
    if (log_transfers_) transfers_.push_back(r);
  }
  void LogDecision(const DecisionRecord& r) override { decisions_.push_back(r); }
  void LogMetric(const std::string& name, double value) override {
    metrics_.emplace_back(name, value);
  }
  void LogDecodeStep(const DecodeStepRecord& r) override { decode_steps_.push_back(r); }
  void LogDecodeRequest(const DecodeRequestRecord& r) override { decode_requests_.push_back(r); }
  void Flush() override {
    ++flushes_;
    if (flushes_ < kFlushesPerBatch &&
        std::chrono::steady_clock::now() - last_write_ < kBatchSeconds) {
      return;
    }
    Write();
  }
  void Close() override { Write(); }

 private:
  static constexpr int kFlushesPerBatch = 256;
  static constexpr std::chrono::milliseconds kBatchSeconds{1000};

  void Write() {
    flushes_ = 0;
    last_write_ = std::chrono::steady_clock::now();
    if (requests_.empty() && layers_.empty() && transfers_.empty() && decisions_.empty() &&
        metrics_.empty() && decode_steps_.empty() && decode_requests_.empty()) {
      return;
    }
    // Every row of the batch names this run, which BeginRun inserted and nothing deletes while
    // the run writes, so the per-row foreign-key probe of runs (one B-tree lookup per row,
    // ~180 rows per request) proves nothing; it is off for the batch and back on after, so
    // deletes through this connection still cascade. (The pragma is a no-op inside a
    // transaction, hence outside BEGIN/COMMIT.)
    db_->Exec("PRAGMA foreign_keys = OFF");
    db_->Exec("BEGIN IMMEDIATE");
    try {
      for (const RequestRecord& r : requests_) InsertRequest(r);
      InsertRows(layers_, kLayerColumns, layer_, layers_n_,
                 [this](Stmt& s, int base, const LayerRecord& r) { BindLayer(s, base, r); });
      InsertRows(transfers_, kTransferColumns, transfer_, transfers_n_,
                 [this](Stmt& s, int base, const TransferRecord& r) { BindTransfer(s, base, r); });
      for (const DecisionRecord& r : decisions_) InsertDecision(r);
      for (const DecodeStepRecord& r : decode_steps_) InsertDecodeStep(r);
      for (const DecodeRequestRecord& r : decode_requests_) InsertDecodeRequest(r);
      for (const auto& [name, value] : metrics_) {
        metric_.Bind(1, run_).Bind(2, name).Bind(3, value);
        metric_.Step(db_->path());
        metric_.Reset();
      }
      db_->Exec("COMMIT");
    } catch (...) {
      try {
        db_->Exec("ROLLBACK");
        db_->Exec("PRAGMA foreign_keys = ON");
      } catch (...) {
      }
      throw;
    }
    db_->Exec("PRAGMA foreign_keys = ON");
    requests_.clear();
    layers_.clear();
    transfers_.clear();
    decisions_.clear();
    metrics_.clear();
    decode_steps_.clear();
    decode_requests_.clear();
  }

  void InsertDecodeStep(const DecodeStepRecord& r) {
    Stmt& s = decode_step_;
    s.Bind(1, run_).Bind(2, (long long)r.step).Bind(3, r.start_s).Bind(4, r.end_s);
    s.Bind(5, (long long)r.batch).Bind(6, (long long)r.tokens).Bind(7, (long long)r.rows);
    s.Bind(8, (long long)r.context_tokens).Bind(9, (long long)r.gpu_bytes);
    s.Bind(10, r.compute_s).Bind(11, r.stall_s).Bind(12, (long long)r.h2d_bytes);
    s.Bind(13, (long long)r.d2h_bytes);
    s.Step(db_->path());
    s.Reset();
  }
  void InsertDecodeRequest(const DecodeRequestRecord& r) {
    Stmt& s = decode_request_;
    s.Bind(1, run_).Bind(2, (long long)r.request_id).Bind(3, (long long)r.warmup);
    s.Bind(4, (long long)r.prompt_tokens).Bind(5, (long long)r.output_tokens);
    s.Bind(6, r.first_token_s).Bind(7, r.join_s).Bind(8, r.end_s);
    s.Bind(9, (long long)r.steps).Bind(10, r.tpot_s).Bind(11, r.stall_s);
    s.Step(db_->path());
    s.Reset();
  }

  void InsertRequest(const RequestRecord& r) {
    Stmt& s = request_;
    s.Bind(1, run_).Bind(2, (long long)r.request_id).Bind(3, r.arrival_s).Bind(4, r.start_s);
    s.Bind(5, r.end_s).Bind(6, (long long)r.prefix_tokens).Bind(7, (long long)r.reused_tokens);
    s.Bind(8, (long long)r.query_tokens).Bind(9, (long long)r.important_tokens);
    s.Bind(10, r.ttft_s).Bind(11, r.ttft_arrival_s).Bind(12, r.start_s - r.arrival_s);
    s.Bind(13, r.io_stall_s).Bind(14, (long long)r.ssd_read_bytes);
    s.Bind(15, (long long)r.ssd_write_bytes).Bind(16, (long long)r.pcie_h2d_bytes);
    s.Bind(17, (long long)r.pcie_d2h_bytes).Bind(18, (long long)r.gpu_hit_chunks);
    s.Bind(19, (long long)r.cpu_hit_chunks).Bind(20, (long long)r.ssd_read_chunks);
    s.Bind(21, (long long)r.itf_layers).Bind(22, (long long)r.itf_fallback_layers);
    s.Bind(23, (long long)r.warmup).Bind(24, r.status);
    s.Step(db_->path());
    s.Reset();
  }
  // Binds one row's values to parameters base+1 ... base+columns.
  void BindLayer(Stmt& s, int base, const LayerRecord& r) {
    s.Bind(base + 1, run_).Bind(base + 2, (long long)r.request_id);
    s.Bind(base + 3, (long long)r.layer);
    if (r.itf_similarity < 0) {
      s.BindNull(base + 4).BindNull(base + 5);
    } else {
      s.Bind(base + 4, r.itf_similarity).Bind(base + 5, r.itf_threshold);
    }
    s.Bind(base + 6, (long long)r.itf_fallback).Bind(base + 7, (long long)r.selected_tokens);
    s.Bind(base + 8, (long long)r.loaded_chunks).Bind(base + 9, (long long)r.prefetched_chunks);
    s.Bind(base + 10, (long long)r.prefetch_used_chunks).Bind(base + 11, r.start_s);
    s.Bind(base + 12, r.end_s).Bind(base + 13, r.stall_s);
  }
  void BindTransfer(Stmt& s, int base, const TransferRecord& r) {
    s.Bind(base + 1, run_).Bind(base + 2, (long long)r.request_id);
    s.Bind(base + 3, (long long)r.layer);
    s.BindStatic(base + 4, TierName(r.src)).BindStatic(base + 5, TierName(r.dst));
    s.BindStatic(base + 6, TransferKindName(r.kind)).BindStatic(base + 7, PurposeName(r.purpose));
    s.Bind(base + 8, (long long)r.bytes).Bind(base + 9, (long long)r.ios);
    s.BindStatic(base + 10, CopyMethodName(r.method)).Bind(base + 11, (long long)r.descriptors);
    s.Bind(base + 12, r.submit_s).Bind(base + 13, r.start_s).Bind(base + 14, r.end_s);
    s.BindStatic(base + 15, TransferOutcomeName(r.outcome));
  }
  // Inserts `rows` kRowsPerInsert at a time through `many`, the rest one by one through `one`
  // (a multi-row INSERT runs the statement machinery once per group: SQLite was 17% of
  // sim_bench's spec run with one statement per row, ~150 rows per request).
  template <typename Row, typename BindFn>
  void InsertRows(const std::vector<Row>& rows, int columns, Stmt& one, Stmt& many, BindFn bind) {
    std::size_t i = 0;
    for (; i + kRowsPerInsert <= rows.size(); i += kRowsPerInsert) {
      for (int j = 0; j < kRowsPerInsert; ++j) bind(many, j * columns, rows[i + std::size_t(j)]);
      many.Step(db_->path());
      many.Reset();
    }
    for (; i < rows.size(); ++i) {
      bind(one, 0, rows[i]);
      one.Step(db_->path());
      one.Reset();
    }
  }
  static std::string InsertSql(const char* table, int columns, int rows) {
    std::string group = "(";
    for (int c = 0; c < columns; ++c) group += c == 0 ? "?" : ",?";
    group += ")";
    std::string sql = std::string("INSERT INTO ") + table + " VALUES ";
    for (int r = 0; r < rows; ++r) sql += (r == 0 ? "" : ",") + group;
    return sql;
  }
  static constexpr int kLayerColumns = 13, kTransferColumns = 15;
  static constexpr int kRowsPerInsert = 32;

  void InsertDecision(const DecisionRecord& r) {
    Stmt& s = decision_;
    s.Bind(1, run_).Bind(2, (long long)r.request_id).Bind(3, (long long)r.layer);
    s.Bind(4, r.kind).Bind(5, (long long)r.chunk).Bind(6, r.detail);
    s.Bind(7, (long long)r.timing_dependent);
    s.Step(db_->path());
    s.Reset();
  }

  ResultsDb* db_;
  long long run_;
  bool log_transfers_;
  Stmt request_, layer_, layers_n_, transfer_, transfers_n_, decision_, metric_;
  Stmt decode_step_, decode_request_;
  std::vector<DecodeStepRecord> decode_steps_;
  std::vector<DecodeRequestRecord> decode_requests_;
  std::vector<RequestRecord> requests_;
  std::vector<LayerRecord> layers_;
  std::vector<TransferRecord> transfers_;
  std::vector<DecisionRecord> decisions_;
  std::vector<std::pair<std::string, double>> metrics_;
  int flushes_ = 0;
  std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
};

}  // namespace

NewResultsFileGuard::NewResultsFileGuard(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  keep_ = std::filesystem::exists(path_, ec) || ec;  // an existing file is never removed
}

NewResultsFileGuard::~NewResultsFileGuard() {
  if (keep_) return;
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::filesystem::remove(path_ + suffix, ec);
  }
}

ResultsDb::ResultsDb(const std::string& path) : path_(path) {
  // NOMUTEX: a ResultsDb is used from one thread (RunLog is not thread-safe either), so
  // SQLite's per-call connection mutex only costs time.
  if (sqlite3_open_v2(path.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) !=
      SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw InputError(path + ": cannot open results database: " + msg);
  }
  // The destructor does not run for a constructor that throws: close the handle here.
  try {
    sqlite3_busy_timeout(db_, 60000);
    // The first statement that reads the file: a file that is not SQLite fails here.
    if (sqlite3_exec(db_, "PRAGMA journal_mode = WAL", nullptr, nullptr, nullptr) != SQLITE_OK) {
      const bool not_db = sqlite3_errcode(db_) == SQLITE_NOTADB;
      throw InputError(path + (not_db ? ": not an SQLite database (is --out the right file?)"
                                      : ": cannot use as results database: " +
                                            std::string(sqlite3_errmsg(db_))));
    }
    Exec("PRAGMA synchronous = NORMAL");
    ApplySchema();
    // Per connection (and a no-op inside a transaction, hence here): deletes of runs cascade.
    Exec("PRAGMA foreign_keys = ON");
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

long long ResultsDb::QueryInt(const char* sql) {
  Stmt s(db_, sql, path_);
  return s.Step(path_) ? sqlite3_column_int64(s.get(), 0) : 0;
}

void ResultsDb::ApplySchema() {
  // A new file gets the schema and its version in one transaction; BEGIN IMMEDIATE makes the
  // parallel processes of a sweep that open a new file at once create it exactly once.
  Exec("BEGIN IMMEDIATE");
  try {
    const long long version = QueryInt("PRAGMA user_version");
    const bool empty = QueryInt("SELECT count(*) FROM sqlite_master") == 0;
    if (empty) {
      Exec(kResultsSchemaSql);
      Exec(kResultsViewsSql);
      Exec("PRAGMA user_version = " + std::to_string(kResultsSchemaVersion));
    } else if (version != kResultsSchemaVersion) {
      // No migration (analysis/SCHEMA.md, "Versions"): rows written under another schema mean
      // other things, and appending to them would mix the two in one file. (Unversioned files
      // gained runs.error and transfers.status by ALTER TABLE for a while; they are refused too:
      // their old views and reused run ids would stay.)
      const std::string numbered = "(schema version " + std::to_string(version) + ")";
      const std::string kind = version == 0 ? "an older kvtier (a schema without a version)"
                               : version < kResultsSchemaVersion ? "an older kvtier " + numbered
                                                                 : "a newer kvtier " + numbered;
      throw InputError(path_ + ": results database written by " + kind +
                       "; this kvtier writes schema version " +
                       std::to_string(kResultsSchemaVersion) +
                       ". Write to a new --out file (the old one stays readable with sqlite3)");
    }
    Exec("COMMIT");
  } catch (...) {
    try {
      Exec("ROLLBACK");
    } catch (...) {
    }
    throw;
  }
}

ResultsDb::~ResultsDb() { sqlite3_close(db_); }

void ResultsDb::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw ResultsWriteError(path_ + ": " + msg);
  }
}

long long ResultsDb::BeginRun(const RunInfo& info) {
  Stmt s(db_,
         "INSERT INTO runs (mode, experiment, system, model, hardware, trace, trace_sha256, config,"
         " config_sha256, git_commit, started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
         path_);
  s.Bind(1, info.mode).Bind(2, info.experiment).Bind(3, info.system).Bind(4, info.model);
  s.Bind(5, info.hardware).Bind(6, info.trace).Bind(7, info.trace_sha256).Bind(8, info.config);
  s.Bind(9, info.config_sha256).Bind(10, GitCommit()).Bind(11, NowUtc());
  s.Step(path_);
  return sqlite3_last_insert_rowid(db_);
}

void ResultsDb::EndRun(long long run_id, double wall_s) {
  Stmt s(db_, "UPDATE runs SET wall_s = ?, complete = 1, status = 'ok' WHERE run_id = ?", path_);
  s.Bind(1, wall_s).Bind(2, run_id);
  s.Step(path_);
}

void ResultsDb::FailRun(long long run_id, double wall_s, const std::string& error) {
  Stmt s(db_,
         "UPDATE runs SET wall_s = ?, complete = 0, status = 'failed', error = ? WHERE run_id = ?",
         path_);
  s.Bind(1, wall_s).Bind(2, error).Bind(3, run_id);
  s.Step(path_);
}

std::string ResultsDb::FailRunAfterWriteError(long long run_id, double wall_s,
                                              const ResultsWriteError& e) {
  const std::string error = std::string("results file: ") + e.what();
  try {
    FailRun(run_id, wall_s, error);
    return error;
  } catch (const std::exception&) {
    return error + " (the run could not be marked failed either: it stays incomplete, "
                   "complete = 0)";
  }
}

ResultsDb::PointState ResultsDb::GetPointState(const std::string& config_sha256,
                                               const std::string& mode) {
  Stmt s(db_,
         "SELECT MAX(complete = 1 AND status = 'ok'), MAX(status NOT IN ('ok', 'running')) "
         "FROM runs WHERE config_sha256 = ? AND mode = ?",
         path_);
  s.Bind(1, config_sha256).Bind(2, mode);
  if (!s.Step(path_)) return PointState::kNone;
  if (sqlite3_column_int(s.get(), 0) == 1) return PointState::kDone;
  if (sqlite3_column_int(s.get(), 1) == 1) return PointState::kFailed;
  return PointState::kNone;
}

void ResultsDb::DeleteIncompleteRuns(const std::string& config_sha256, const std::string& mode) {
  Stmt s(db_,
         "DELETE FROM runs WHERE config_sha256 = ? AND mode = ? AND complete = 0 AND "
         "status = 'running'",
         path_);
  s.Bind(1, config_sha256).Bind(2, mode);
  s.Step(path_);
}

void ResultsDb::DeleteFailedRuns(const std::string& config_sha256, const std::string& mode) {
  Stmt s(db_,
         "DELETE FROM runs WHERE config_sha256 = ? AND mode = ? AND status NOT IN ('ok', "
         "'running')",
         path_);
  s.Bind(1, config_sha256).Bind(2, mode);
  s.Step(path_);
}

std::unique_ptr<RunLog> ResultsDb::NewRunLog(long long run_id, bool log_transfers) {
  return std::make_unique<SqliteRunLog>(this, run_id, log_transfers);
}

std::string ConfigSha256(const Config& config, const std::string& trace_sha256) {
  return Sha256(config.Dump(/*with_origins=*/false) + trace_sha256);
}

RunInfo MakeRunInfo(const std::string& mode, const Config& config, const ExperimentOptions& opts,
                    const std::string& trace_path) {
  RunInfo info;
  info.mode = mode;
  info.experiment = opts.experiment_name;
  info.system = opts.system.name;
  info.model = opts.model.name;
  info.hardware = opts.hardware.name;
  info.trace = trace_path;
  info.trace_sha256 = Sha256File(trace_path);
  info.config = config.Dump(/*with_origins=*/false);
  info.config_sha256 = ConfigSha256(config, info.trace_sha256);
  return info;
}

std::string GitCommit() {
#ifdef KVTIER_GIT_COMMIT
  return KVTIER_GIT_COMMIT;
#else
  return "unknown";
#endif
}

}  // namespace kvtier
