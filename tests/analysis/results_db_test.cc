// ResultsDb: how a run ends (complete, failed) in `runs`, transfers logged with how they ended,
// and a file made before those columns (and the decode columns of `accuracy`) existed gaining
// them on open.

#include "analysis/results_db.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace kvtier {
namespace {

class ResultsDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("kvtier_results_db_" + std::to_string(::getpid()) + ".sqlite"))
                .string();
    Remove();
  }
  void TearDown() override { Remove(); }
  void Remove() {
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path_ + suffix).c_str());
  }
  std::string Query(const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
    std::string out;
    while (sqlite3_step(st) == SQLITE_ROW) {
      for (int c = 0; c < sqlite3_column_count(st); ++c) {
        const unsigned char* t = sqlite3_column_text(st, c);
        out += (c ? "|" : "") + std::string(t ? reinterpret_cast<const char*>(t) : "NULL");
      }
      out += "\n";
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
  }
  static RunInfo Info(const std::string& system) {
    RunInfo info;
    info.mode = "hw";
    info.system = system;
    return info;
  }
  std::string path_;
};

TEST_F(ResultsDbTest, CompleteFailedAndKilledRunsAreToldApart) {
  ResultsDb db(path_);
  const long long ok = db.BeginRun(Info("as"));
  const long long failed = db.BeginRun(Info("spec"));
  const long long killed = db.BeginRun(Info("cake"));
  db.EndRun(ok, 1.5);
  db.FailRun(failed, 0.5, "IoError: ssd_read (demand, request 3, layer 0): chunk 0x1: EIO");
  EXPECT_EQ(Query("SELECT run_id, complete, status, error FROM runs ORDER BY run_id"),
            std::to_string(ok) + "|1|ok|NULL\n" + std::to_string(failed) +
                "|0|failed|IoError: ssd_read (demand, request 3, layer 0): chunk 0x1: EIO\n" +
                std::to_string(killed) + "|0|running|NULL\n");
}

TEST_F(ResultsDbTest, TransfersAreLoggedWithHowTheyEnded) {
  ResultsDb db(path_);
  const long long run = db.BeginRun(Info("as"));
  {
    std::unique_ptr<RunLog> log = db.NewRunLog(run);
    TransferRecord t;
    t.request_id = 2;
    t.bytes = 4096;
    t.ios = 1;
    log->LogTransfer(t);
    t.outcome = TransferOutcome::kFailed;
    t.bytes = 1024;
    log->LogTransfer(t);
    t.outcome = TransferOutcome::kAborted;
    t.kind = TransferKind::kH2D;
    t.bytes = 0;
    t.ios = 0;
    log->LogTransfer(t);
    log->Close();
  }
  EXPECT_EQ(Query("SELECT kind, bytes, ios, status FROM transfers ORDER BY rowid"),
            "ssd_read|4096|1|ok\nssd_read|1024|1|failed\nh2d|0|0|aborted\n");
}

// A file written by a kvtier from before runs.error and transfers.status: opening it adds
// them; old rows read NULL and 'ok', new rows are written in full.
TEST_F(ResultsDbTest, AnOlderFileGainsTheNewColumns) {
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    const char* old_schema =
        "CREATE TABLE runs (run_id INTEGER PRIMARY KEY, mode TEXT NOT NULL, experiment TEXT NOT "
        "NULL, system TEXT NOT NULL, model TEXT NOT NULL, hardware TEXT NOT NULL, trace TEXT NOT "
        "NULL, trace_sha256 TEXT NOT NULL, config TEXT NOT NULL, config_sha256 TEXT NOT NULL, "
        "git_commit TEXT NOT NULL, started_at TEXT NOT NULL, wall_s REAL, complete INTEGER NOT "
        "NULL DEFAULT 0, status TEXT NOT NULL DEFAULT 'running');"
        "CREATE TABLE transfers (run_id INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE "
        "CASCADE, request_id INTEGER NOT NULL, layer INTEGER NOT NULL, src TEXT NOT NULL, dst "
        "TEXT NOT NULL, kind TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL, ios "
        "INTEGER NOT NULL, submit_s REAL NOT NULL, start_s REAL NOT NULL, end_s REAL NOT NULL);"
        "INSERT INTO runs VALUES (1, 'sim', 'e', 'as', 'm', 'h', 't', 'x', 'c', 'y', 'g', 'now', "
        "1.0, 1, 'ok');"
        "INSERT INTO transfers VALUES (1, 1, 0, 'ssd', 'cpu', 'ssd_read', 'demand', 10, 1, 0, 0, "
        "0);";
    ASSERT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  ResultsDb db(path_);
  const long long run = db.BeginRun(Info("spec"));
  {
    std::unique_ptr<RunLog> log = db.NewRunLog(run);
    TransferRecord t;
    t.outcome = TransferOutcome::kFailed;
    log->LogTransfer(t);
    log->Close();
  }
  db.FailRun(run, 0.1, "OutOfSpace: full");
  EXPECT_EQ(Query("SELECT run_id, status, error FROM runs ORDER BY run_id"),
            "1|ok|NULL\n" + std::to_string(run) + "|failed|OutOfSpace: full\n");
  EXPECT_EQ(Query("SELECT run_id, status FROM transfers ORDER BY rowid"),
            "1|ok\n" + std::to_string(run) + "|failed\n");
}

// A file from before the decode columns of `accuracy` (and before any view): opening it adds the
// columns, then the views (accuracy_latency names kv_bits); old rows read NULL there.
TEST_F(ResultsDbTest, AnOlderAccuracyTableGainsTheDecodeColumns) {
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    const char* old_schema =
        "CREATE TABLE accuracy (run_id INTEGER NOT NULL, task TEXT NOT NULL, selector TEXT NOT "
        "NULL CHECK (selector IN ('full', 'itf', 'h2o', 'spi', 'random')), alpha REAL, retention "
        "REAL NOT NULL, items INTEGER NOT NULL, correct INTEGER NOT NULL, accuracy REAL NOT NULL, "
        "first_token_agreement REAL NOT NULL, mean_kept_fraction REAL NOT NULL, "
        "itf_fallback_rate REAL);"
        "INSERT INTO accuracy VALUES (1, 'piqa', 'h2o', NULL, 0.5, 10, 6, 0.6, 0.9, 0.5, NULL);";
    ASSERT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  { ResultsDb db(path_); }
  EXPECT_EQ(Query("SELECT task, kv_bits, topk, hit_rate, kv_size_ratio FROM accuracy"),
            "piqa|NULL|NULL|NULL|NULL\n");
  EXPECT_EQ(Query("SELECT COUNT(*) FROM sqlite_master WHERE name = 'accuracy_latency'"), "1\n");
}

}  // namespace
}  // namespace kvtier
