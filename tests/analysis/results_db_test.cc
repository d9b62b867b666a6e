// ResultsDb: how a run ends (complete, failed) in `runs` and how its transfers ended; files it
// must refuse (not SQLite, unwritable, another schema version); the identity rules that keep
// two runs' rows apart (run ids never reused, no row replaced); views that show complete runs
// only.

#include "analysis/results_db.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/errors.h"

namespace kvtier {

extern const char* const kResultsSchemaSql;  // analysis/schema.sql
extern const char* const kResultsViewsSql;   // analysis/views.sql

namespace {

namespace fs = std::filesystem;

class ResultsDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvtier_results_db_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The message of the InputError `f` throws; fails the test if it throws nothing.
  template <typename F>
  std::string ErrorOf(F f) {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected an InputError";
    return "";
  }
  // Runs `sql` on `path` with plain SQLite (a database another program or version wrote).
  void RawSql(const fs::path& path, const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
    sqlite3_free(err);
    sqlite3_close(db);
  }

  fs::path dir_;
};

TEST_F(ResultsDbTest, NonSqliteFileIsAnInputErrorNamingThePath) {
  const fs::path p = dir_ / "notes.txt";
  std::ofstream(p) << "these are my notes, not a results database\n";
  const std::string msg = ErrorOf([&] { ResultsDb db(p.string()); });
  EXPECT_NE(msg.find(p.string() + ": not an SQLite database"), std::string::npos) << msg;
  // Untouched.
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "these are my notes, not a results database");
}

TEST_F(ResultsDbTest, UnwritablePathIsAnInputErrorNamingThePath) {
  std::string msg = ErrorOf([&] { ResultsDb db("/nonexistent-dir/r.sqlite"); });
  EXPECT_NE(msg.find("/nonexistent-dir/r.sqlite: cannot open results database"),
            std::string::npos)
      << msg;
  msg = ErrorOf([&] { ResultsDb db(dir_.string()); });
  EXPECT_NE(msg.find(dir_.string()), std::string::npos) << msg;
}

TEST_F(ResultsDbTest, NewFileRecordsTheSchemaVersionAndReopens) {
  const fs::path p = dir_ / "r.sqlite";
  { ResultsDb db(p.string()); }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(p.c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "PRAGMA user_version", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), kResultsSchemaVersion);
  sqlite3_finalize(st);
  sqlite3_close(raw);
  EXPECT_NO_THROW(ResultsDb db(p.string()));  // the same version: appended to
}

TEST_F(ResultsDbTest, DatabaseOfAnOlderUnversionedSchemaIsRefused) {
  // What kvtier wrote before schema versions: tables, user_version 0, an old view.
  const fs::path p = dir_ / "old.sqlite";
  RawSql(p,
         "CREATE TABLE runs (run_id INTEGER PRIMARY KEY, mode TEXT NOT NULL, experiment TEXT NOT "
         "NULL, system TEXT NOT NULL, model TEXT NOT NULL, hardware TEXT NOT NULL, trace TEXT NOT "
         "NULL, trace_sha256 TEXT NOT NULL, config TEXT NOT NULL, config_sha256 TEXT NOT NULL, "
         "git_commit TEXT NOT NULL, started_at TEXT NOT NULL, wall_s REAL, complete INTEGER NOT "
         "NULL DEFAULT 0, status TEXT NOT NULL DEFAULT 'running');"
         "INSERT INTO runs VALUES (1, 'sim', 'e', 'as', 'm', 'h', 't', 'x', 'c', 'y', 'g', 'now', "
         "1.0, 1, 'ok');"
         "CREATE VIEW run_summary AS SELECT run_id FROM runs;");
  const std::string msg = ErrorOf([&] { ResultsDb db(p.string()); });
  EXPECT_NE(msg.find(p.string() + ": results database written by an older kvtier"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Write to a new --out file"), std::string::npos) << msg;
  // Nothing was added to it (it used to gain runs.error by ALTER TABLE, keeping its old view).
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM pragma_table_info('runs') WHERE name = "
                                   "'error'", -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

TEST_F(ResultsDbTest, DatabaseOfANewerSchemaIsRefused) {
  const fs::path p = dir_ / "new.sqlite";
  { ResultsDb db(p.string()); }
  RawSql(p, "PRAGMA user_version = " + std::to_string(kResultsSchemaVersion + 1));
  const std::string msg = ErrorOf([&] { ResultsDb db(p.string()); });
  EXPECT_NE(msg.find("a newer kvtier (schema version " +
                     std::to_string(kResultsSchemaVersion + 1) + ")"),
            std::string::npos)
      << msg;
}

RunInfo Info() {
  RunInfo info;
  info.system = "as";
  info.config_sha256 = "abc";
  return info;
}

TEST_F(ResultsDbTest, RunIdsAreNeverReusedAfterADelete) {
  // An interrupted sweep point's run is deleted and rerun; the rerun must not get the deleted
  // run's id, or a late writer of the old run would add rows to the new one.
  ResultsDb db((dir_ / "r.sqlite").string());
  const long long first = db.BeginRun(Info());
  db.DeleteIncompleteRuns("abc", "sim");
  const long long second = db.BeginRun(Info());
  EXPECT_GT(second, first);
}

TEST_F(ResultsDbTest, ASecondRowForOneRequestIsAnErrorNotAReplacement) {
  ResultsDb db((dir_ / "r.sqlite").string());
  const long long run = db.BeginRun(Info());
  std::unique_ptr<RunLog> log = db.NewRunLog(run);
  RequestRecord r;
  r.request_id = 7;
  r.ttft_s = 1;
  log->LogRequest(r);
  r.ttft_s = 2;
  log->LogRequest(r);
  EXPECT_THROW(log->Close(), InputError);
}

// A killed run (complete = 0) keeps the rows it committed; no view may show them. Two runs of
// each mode with identical rows, one complete and one not: every view must show the first only.
TEST_F(ResultsDbTest, EveryViewExcludesIncompleteRuns) {
  const fs::path p = dir_ / "r.sqlite";
  { ResultsDb db(p.string()); }
  std::string sql;
  const std::string config =
      "select.retention = 0.5\nitf.alpha = 0.6\nitf.enabled = true\nselect.policy = all\n"
      "reuse.enabled = true\n";
  for (int complete : {1, 0}) {
    for (const char* mode : {"sim", "hw", "eval"}) {
      const std::string id = "(SELECT MAX(run_id) FROM runs)";
      sql += "INSERT INTO runs (mode, experiment, system, model, hardware, trace, trace_sha256, "
             "config, config_sha256, git_commit, started_at, complete, status) VALUES ('" +
             std::string(mode) + "', 'x', 'as_h2o_lfu', 'm', 'h', 't', 's', '" + config +
             "', 'c', 'g', 'now', " + std::to_string(complete) + ", " +
             (complete ? "'ok'" : "'running'") + ");";
      for (int q = 0; q < 2; ++q) {
        sql += "INSERT INTO requests VALUES (" + id + ", " + std::to_string(q) +
               ", 0, 0, 1, 10, 5, 2, 3, 0.5, 0.5, 0, 0.1, 100, 0, 100, 0, 1, 1, 1, 1, 0, 0, 'ok');"
               "INSERT INTO layers VALUES (" + id + ", " + std::to_string(q) +
               ", 0, 0.5, 0.4, 0, 3, 1, 1, 1, 0, 0.1, 0);"
               "INSERT INTO transfers VALUES (" + id + ", " + std::to_string(q) +
               ", 0, 'ssd', 'cpu', 'ssd_read', 'demand', 100, 1, 'dma', 0, 0, 0, 0.1, "
               "'ok');"
               "INSERT INTO decode_steps VALUES (" + id + ", " + std::to_string(q) +
               ", 1, 1.1, 2, 2, 2, 100, 1000, 0.08, 0.02, 64, 32);"
               "INSERT INTO decode_requests VALUES (" + id + ", " + std::to_string(q) +
               ", 0, 50, 3, 1, 1, 1.2, 2, 0.1, 0.04);";
      }
      sql += "INSERT INTO accuracy (run_id, task, selector, alpha, retention, items, correct, "
             "accuracy, first_token_agreement, mean_kept_fraction, itf_fallback_rate) VALUES (" +
             id + ", 'copa', 'itf', 0.6, 0.5, 4, 3, 0.75, 1, 0.5, 0);";
    }
  }
  RawSql(p, sql);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
  auto count = [&](const std::string& q) {
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, q.c_str(), -1, &st, nullptr), SQLITE_OK) << q;
    long long n = -1;
    if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
  };
  const std::pair<const char*, const char*> kViews[] = {
      {"measured_requests", "run_id"}, {"run_summary", "run_id"},     {"ttft_cdf", "run_id"},
      {"layer_retention", "run_id"},   {"io_breakdown", "run_id"},    {"hit_ratios", "run_id"},
      {"ablation_delta", "run_id"},    {"sim_vs_hw", "sim_run_id"},   {"sim_vs_hw", "hw_run_id"},
      {"stage_busy", "run_id"},        {"sim_vs_hw_stages", "sim_run_id"},
      {"sim_vs_hw_stages", "hw_run_id"}, {"accuracy_latency", "eval_run_id"},
      {"accuracy_latency", "latency_run_id"}, {"tpot_cdf", "run_id"},
      {"decode_throughput", "run_id"}};
  for (const auto& [view, column] : kViews) {
    const std::string of =
        std::string(" FROM ") + view + " v JOIN runs r ON r.run_id = v." + column;
    EXPECT_GT(count("SELECT COUNT(*)" + of + " WHERE r.complete = 1"), 0)
        << view << " shows no complete run: the test data does not reach it";
    EXPECT_EQ(count("SELECT COUNT(*)" + of + " WHERE r.complete = 0"), 0)
        << view << "." << column << " shows an incomplete run";
  }
  sqlite3_close(db);
}

// How a run ends (complete, failed, killed) and how its transfers ended (issue 12).
class RunEndingsTest : public ::testing::Test {
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

TEST_F(RunEndingsTest, CompleteFailedAndKilledRunsAreToldApart) {
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

TEST_F(RunEndingsTest, TransfersAreLoggedWithHowTheyEnded) {
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

TEST_F(RunEndingsTest, StageBusyIsTheUnionOfTheOpsIntervals) {
  // Two H2D copies sharing the link over [0, 2) and [1, 3), one more at [5, 6), one inside the
  // first ([0.5, 1)), and an SSD read alone: the stage was busy 3 + 1 s, its ops took 5.5 s.
  ResultsDb db(path_);
  const long long run = db.BeginRun(Info("as"));
  {
    std::unique_ptr<RunLog> log = db.NewRunLog(run);
    TransferRecord t;
    t.kind = TransferKind::kH2D;
    t.bytes = 100;
    t.ios = 1;
    for (auto [s, e] : {std::pair{0.0, 2.0}, {1.0, 3.0}, {5.0, 6.0}, {0.5, 1.0}}) {
      t.start_s = s, t.end_s = e;
      log->LogTransfer(t);
    }
    t.kind = TransferKind::kSsdRead;
    t.start_s = 1, t.end_s = 1.25;
    log->LogTransfer(t);
    log->Close();
  }
  db.EndRun(run, 6);
  EXPECT_EQ(Query("SELECT stage, busy_s, op_s, bytes FROM stage_busy WHERE stage != 'compute' "
                  "ORDER BY stage"),
            "h2d|4.0|5.5|400\nssd_read|0.25|0.25|100\n");
}

// Decode rows (core/decode_engine.h) go to decode_steps and decode_requests; tpot_cdf ranks the
// measured requests, decode_throughput adds tokens over the steps' durations.
TEST_F(RunEndingsTest, DecodeRowsAndTheirViews) {
  ResultsDb db(path_);
  const long long run = db.BeginRun(Info("specache"));
  {
    std::unique_ptr<RunLog> log = db.NewRunLog(run);
    for (int i = 0; i < 3; ++i) {
      DecodeStepRecord st;
      st.step = i;
      st.start_s = 1.0 + i;
      st.end_s = 1.5 + i;  // 0.5 s each
      st.batch = 4 - i;
      st.tokens = i == 0 ? 0 : 4 - i;  // a pre-decoding step, then 3 and 2 tokens
      st.rows = 2 * st.batch;
      st.stall_s = 0.1 * i;
      st.h2d_bytes = 1000;
      st.gpu_bytes = 5000 - 1000 * Bytes(i);
      log->LogDecodeStep(st);
    }
    for (int q = 0; q < 4; ++q) {
      DecodeRequestRecord d;
      d.request_id = RequestId(q);
      d.warmup = q == 3;
      d.output_tokens = 3;
      d.first_token_s = 0.5;
      d.end_s = 1.5 + 0.5 * q;
      d.tpot_s = (d.end_s - d.first_token_s) / 2;  // 0.5, 0.75, 1.0 (and the warm-up 1.25)
      log->LogDecodeRequest(d);
    }
    log->Close();
  }
  db.EndRun(run, 1.0);
  EXPECT_EQ(Query("SELECT request_id, tpot_s, fraction FROM tpot_cdf ORDER BY request_id"),
            "0|0.5|0.333333333333333\n1|0.75|0.666666666666667\n2|1.0|1.0\n");
  // 5 tokens in 1.5 s of steps; batch 3 on average, 4 at most; stall 0.1 s per step;
  // TPOT mean 0.75, p50 0.75, p99 1.0.
  EXPECT_EQ(Query("SELECT requests, steps, tokens, decode_s, round(tokens_per_s, 6), mean_batch, "
                  "max_batch, mean_step_s, round(mean_stall_s, 6), h2d_bytes, max_gpu_bytes, "
                  "mean_tpot_s, p50_tpot_s, p99_tpot_s FROM decode_throughput"),
            "3|3|5|1.5|3.333333|3.0|4|0.5|0.1|3000|5000|0.75|0.75|1.0\n");
}

TEST_F(ResultsDbTest, SchemaTextIsPinnedToItsVersion) {
  // Files of one version must have one schema: a change of schema.sql or views.sql must come
  // with a new kResultsSchemaVersion (and its text's hash here).
  EXPECT_EQ(kResultsSchemaVersion, 4);
  EXPECT_EQ(Sha256(std::string(kResultsSchemaSql) + kResultsViewsSql),
            "f34863283055081064f0a5c7159532a3012bc2572b806688060647339feb2442")
      << "analysis/schema.sql or views.sql changed: bump kResultsSchemaVersion in "
         "analysis/results_db.h and pin the new hash here";
}

}  // namespace
}  // namespace kvtier
