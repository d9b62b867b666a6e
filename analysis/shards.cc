#include "analysis/shards.h"

#include <sqlite3.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "analysis/results_db.h"
#include "core/errors.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// One prepared statement on `db`; errors are InputErrors naming `path`, the file the statement
// is about.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql, const std::string& path) : db_(db), path_(path) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK) {
      throw InputError(path + ": " + sqlite3_errmsg(db));
    }
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt& Bind(int i, long long v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.c_str(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // Steps once; true if a row is available.
  bool Step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) throw InputError(path_ + ": " + sqlite3_errmsg(db_));
    return false;
  }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  long long Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }

 private:
  sqlite3* db_;
  std::string path_;
  sqlite3_stmt* stmt_ = nullptr;
};

void Exec(sqlite3* db, const std::string& sql, const std::string& path) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    throw InputError(path + ": " + msg);
  }
}

// A shard must be an existing regular file: SQLite would create a missing one.
void CheckIsFile(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw InputError(path + ": no such results file");
  if (!fs::is_regular_file(st)) throw InputError(path + ": not a regular file");
}

const char* const kShardRunColumns =
    "run_id, mode, system, config_sha256, trace_sha256, complete, status, COALESCE(error, '')";

ShardRun ReadRun(Stmt& s) {
  ShardRun r;
  r.run_id = s.Int(0);
  r.mode = s.Text(1);
  r.system = s.Text(2);
  r.config_sha256 = s.Text(3);
  r.trace_sha256 = s.Text(4);
  r.complete = s.Int(5) == 1;
  r.status = s.Text(6);
  r.error = s.Text(7);
  return r;
}

// The tables of schema `schema` ("main", "shard") by name, each with its columns in order;
// SQLite's own tables (sqlite_sequence) left out.
std::vector<std::pair<std::string, std::vector<std::string>>> Tables(sqlite3* db,
                                                                     const std::string& schema,
                                                                     const std::string& path) {
  std::vector<std::pair<std::string, std::vector<std::string>>> tables;
  Stmt t(db,
         "SELECT name FROM " + schema +
             ".sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
         path);
  while (t.Step()) tables.emplace_back(t.Text(0), std::vector<std::string>{});
  for (auto& [table, columns] : tables) {
    Stmt c(db, "SELECT name FROM pragma_table_info(?, ?) ORDER BY cid", path);
    c.Bind(1, table).Bind(2, schema);
    while (c.Step()) columns.push_back(c.Text(0));
  }
  return tables;
}

long long UserVersion(sqlite3* db, const std::string& schema, const std::string& path) {
  Stmt s(db, "PRAGMA " + schema + ".user_version", path);
  return s.Step() ? s.Int(0) : 0;
}

std::string Joined(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// Attaches `shard` to `db` as schema "shard" and checks that it has the schema of "main"
// (version and tables with their columns). Throws InputError naming the shard (detached).
void AttachShard(sqlite3* db, const std::string& shard, const std::string& out) {
  CheckIsFile(shard);
  {
    Stmt a(db, "ATTACH DATABASE ? AS shard", shard);
    a.Bind(1, shard);
    a.Step();
  }
  try {
    const long long version = UserVersion(db, "shard", shard);
    const long long ours = UserVersion(db, "main", out);
    const auto theirs = Tables(db, "shard", shard);
    const auto mine = Tables(db, "main", out);
    if (version != ours) {
      throw InputError(shard + ": results database of schema version " + std::to_string(version) +
                       "; " + out + " and this kvtier use schema version " +
                       std::to_string(ours) + " (merge shards written by the same kvtier)");
    }
    if (theirs != mine) {
      // Name the first table that differs.
      std::string what;
      for (const auto& [table, columns] : mine) {
        auto it = theirs.begin();
        while (it != theirs.end() && it->first != table) ++it;
        if (it == theirs.end()) {
          what = "no table '" + table + "'";
          break;
        }
        if (it->second != columns) {
          what = "table '" + table + "' has columns (" + Joined(it->second) + "), expected (" +
                 Joined(columns) + ")";
          break;
        }
      }
      if (what.empty()) what = "tables the schema does not have";
      throw InputError(shard + ": not a results database of this kvtier's schema: " + what +
                       " (merge shards written by the same kvtier)");
    }
  } catch (...) {
    sqlite3_exec(db, "DETACH DATABASE shard", nullptr, nullptr, nullptr);
    throw;
  }
}

// Merges the attached shard's runs into main.
class ShardMerger {
 public:
  ShardMerger(sqlite3* db, const std::string& shard, const std::string& out,
              const MergeOptions& options)
      : db_(db), shard_(shard), out_(out), options_(options) {
    // Every table with a run_id column, runs first (the others reference it).
    std::string run_columns;
    for (const auto& [table, columns] : Tables(db, "main", out)) {
      bool has_run = false;
      std::string rest;
      for (const std::string& c : columns) {
        if (c == "run_id") {
          has_run = true;
        } else {
          rest += (rest.empty() ? "" : ", ") + c;
        }
      }
      if (!has_run) continue;
      if (table == "runs") {
        run_columns = rest;
        continue;
      }
      copies_.push_back(std::make_unique<Stmt>(
          db, "INSERT INTO main." + table + " (run_id, " + rest + ") SELECT ?, " + rest +
                  " FROM shard." + table + " WHERE run_id = ?",
          out));
    }
    copy_run_ = std::make_unique<Stmt>(db,
                                       "INSERT INTO main.runs (" + run_columns + ") SELECT " +
                                           run_columns + " FROM shard.runs WHERE run_id = ?",
                                       out);
  }

  MergeShardReport Merge() {
    MergeShardReport report;
    report.shard = shard_;
    std::vector<ShardRun> runs;
    {
      Stmt s(db_, std::string("SELECT ") + kShardRunColumns + " FROM shard.runs ORDER BY run_id",
             shard_);
      while (s.Step()) runs.push_back(ReadRun(s));
    }
    report.runs = runs.size();
    // A complete run of the point already in main; for an incomplete run, this very run (its
    // start time, commit and status) already copied.
    Stmt complete_in_out(db_,
                         "SELECT 1 FROM main.runs WHERE config_sha256 = ? AND trace_sha256 = ? "
                         "AND mode = ? AND complete = 1 LIMIT 1",
                         out_);
    Stmt same_in_out(db_,
                     "SELECT 1 FROM main.runs m JOIN shard.runs s ON s.run_id = ? WHERE "
                     "m.config_sha256 = s.config_sha256 AND m.trace_sha256 = s.trace_sha256 AND "
                     "m.mode = s.mode AND m.complete = 0 AND m.status = s.status AND "
                     "m.started_at = s.started_at AND m.git_commit = s.git_commit AND "
                     "m.system = s.system LIMIT 1",
                     out_);
    for (const ShardRun& run : runs) {
      if (!run.complete) {
        report.incomplete.push_back(run);
        if (!options_.include_incomplete) continue;
      }
      Exec(db_, "BEGIN IMMEDIATE", out_);
      try {
        Stmt& probe = run.complete ? complete_in_out : same_in_out;
        probe.Reset();
        if (run.complete) {
          probe.Bind(1, run.config_sha256).Bind(2, run.trace_sha256).Bind(3, run.mode);
        } else {
          probe.Bind(1, run.run_id);
        }
        if (probe.Step()) {
          probe.Reset();
          Exec(db_, "COMMIT", out_);
          ++report.already;
          continue;
        }
        probe.Reset();
        copy_run_->Reset();
        copy_run_->Bind(1, run.run_id).Step();
        const long long id = sqlite3_last_insert_rowid(db_);
        for (const auto& copy : copies_) {
          copy->Reset();
          copy->Bind(1, id).Bind(2, run.run_id).Step();
          report.rows += sqlite3_changes(db_);
        }
        Exec(db_, "COMMIT", out_);
        ++report.merged;
      } catch (...) {
        sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
      }
    }
    return report;
  }

 private:
  sqlite3* db_;
  std::string shard_, out_;
  MergeOptions options_;
  std::unique_ptr<Stmt> copy_run_;
  std::vector<std::unique_ptr<Stmt>> copies_;
};

}  // namespace

const char* ShardRun::State() const {
  if (complete) return "complete";
  return status == "running" ? "killed" : "failed";
}

std::vector<ShardRun> ReadShardRuns(const std::string& path) {
  CheckIsFile(path);
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> db(raw, sqlite3_close);
  if (rc != SQLITE_OK) {
    throw InputError(path + ": cannot open results database: " +
                     (raw ? sqlite3_errmsg(raw) : "out of memory"));
  }
  sqlite3_busy_timeout(raw, 60000);
  std::vector<ShardRun> runs;
  Stmt s(raw, std::string("SELECT ") + kShardRunColumns + " FROM runs ORDER BY run_id", path);
  while (s.Step()) runs.push_back(ReadRun(s));
  return runs;
}

std::vector<MergeShardReport> MergeShards(
    const std::vector<std::string>& shards, const std::string& out, const MergeOptions& options,
    const std::function<void(const MergeShardReport&)>& on_shard) {
  if (shards.empty()) throw InputError("no shard to merge");
  for (const std::string& shard : shards) {
    CheckIsFile(shard);
    std::error_code ec;
    if (fs::exists(out, ec) && fs::equivalent(shard, out, ec)) {
      throw InputError(shard + ": is the merge's output file; write to another --out");
    }
  }
  // A refused merge leaves no output file of its own making behind (it left an empty results
  // file, only the schema, found probing).
  NewResultsFileGuard new_file(out);
  ResultsDb target(out);  // creates the file and its schema, or checks the existing one's
  sqlite3* db = target.handle();
  // Every shard's schema before anything is written.
  for (const std::string& shard : shards) {
    AttachShard(db, shard, out);
    Exec(db, "DETACH DATABASE shard", out);
  }
  new_file.Keep();
  // Each copied row references the run inserted in the same transaction, so the per-row
  // foreign-key probe proves nothing (as in SqliteRunLog's batches).
  Exec(db, "PRAGMA foreign_keys = OFF", out);
  std::vector<MergeShardReport> reports;
  for (const std::string& shard : shards) {
    AttachShard(db, shard, out);
    try {
      MergeShardReport r;
      {
        ShardMerger merger(db, shard, out, options);
        r = merger.Merge();
      }
      Exec(db, "DETACH DATABASE shard", out);
      reports.push_back(r);
      if (on_shard) on_shard(reports.back());
    } catch (...) {
      sqlite3_exec(db, "DETACH DATABASE shard", nullptr, nullptr, nullptr);
      Exec(db, "PRAGMA foreign_keys = ON", out);
      throw;
    }
  }
  Exec(db, "PRAGMA foreign_keys = ON", out);
  return reports;
}

}  // namespace kvtier
