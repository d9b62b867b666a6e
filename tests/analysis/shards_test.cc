// MergeShards and ReadShardRuns (analysis/shards.h): runs and all their rows under new ids,
// each point once however often or partially the merge runs, incomplete runs reported and left
// out, and shards that cannot be merged refused before anything is written.

#include "analysis/shards.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "analysis/results_db.h"
#include "core/errors.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

class ShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvtier_shards_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes one run of point `point` to `path` with `requests` requests (2 layers, 1 transfer,
  // 1 decision each, and a metric), ending it as `end` says: "ok", "failed" or "killed".
  static long long AddRun(const std::string& path, const std::string& point, int requests,
                          const std::string& end = "ok", const std::string& system = "spec") {
    ResultsDb db(path);
    RunInfo info;
    info.system = system;
    info.trace = "t.trace";
    info.trace_sha256 = "trace-" + point;
    info.config = "config of " + point;
    info.config_sha256 = "config-" + point;
    const long long run = db.BeginRun(info);
    {
      std::unique_ptr<RunLog> log = db.NewRunLog(run);
      for (int r = 0; r < requests; ++r) {
        RequestRecord q;
        q.request_id = r;
        q.ttft_s = 0.5 + r;
        q.prefix_tokens = 100 * (r + 1);
        log->LogRequest(q);
        for (int l = 0; l < 2; ++l) {
          LayerRecord layer;
          layer.request_id = r;
          layer.layer = l;
          layer.selected_tokens = 10 * r + l;
          log->LogLayer(layer);
        }
        TransferRecord t;
        t.request_id = r;
        t.bytes = 4096 * (r + 1);
        t.ios = 1;
        log->LogTransfer(t);
        DecisionRecord d;
        d.request_id = r;
        d.kind = "admit";
        d.chunk = 7 + r;
        d.detail = "gpu";
        log->LogDecision(d);
      }
      log->LogMetric("selection_memo_reused_layers", requests);
      log->Close();
    }
    if (end == "ok") db.EndRun(run, 1.0);
    if (end == "failed") db.FailRun(run, 0.5, "IoError: ssd_read: EIO");
    return run;
  }

  static std::string Query(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
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

  // Every row of every run table, keyed by the point instead of the run id.
  static std::string Rows(const std::string& path) {
    std::string out;
    out += Query(path,
                 "SELECT config_sha256, trace_sha256, mode, system, complete, status, config "
                 "FROM runs ORDER BY config_sha256, complete");
    out += Query(path,
                 "SELECT r.config_sha256, q.request_id, q.ttft_s, q.prefix_tokens FROM requests q "
                 "JOIN runs r USING (run_id) ORDER BY 1, 2");
    out += Query(path,
                 "SELECT r.config_sha256, l.request_id, l.layer, l.selected_tokens FROM layers l "
                 "JOIN runs r USING (run_id) ORDER BY 1, 2, 3");
    out += Query(path,
                 "SELECT r.config_sha256, t.request_id, t.bytes FROM transfers t "
                 "JOIN runs r USING (run_id) ORDER BY 1, 2");
    out += Query(path,
                 "SELECT r.config_sha256, d.request_id, d.chunk FROM decisions d "
                 "JOIN runs r USING (run_id) ORDER BY 1, 2");
    out += Query(path,
                 "SELECT r.config_sha256, m.name, m.value FROM metrics m "
                 "JOIN runs r USING (run_id) ORDER BY 1, 2");
    return out;
  }

  fs::path dir_;
};

TEST_F(ShardsTest, RunsAndAllTheirRowsAreCopiedUnderNewIds) {
  AddRun(Path("a.sqlite"), "p1", 3);
  AddRun(Path("a.sqlite"), "p2", 2);
  AddRun(Path("b.sqlite"), "p3", 4);
  const auto reports = MergeShards({Path("a.sqlite"), Path("b.sqlite")}, Path("all.sqlite"), {});
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].runs, 2u);
  EXPECT_EQ(reports[0].merged, 2u);
  EXPECT_EQ(reports[0].already, 0u);
  // 5 requests: 5 request rows, 10 layers, 5 transfers, 5 decisions, 2 metrics.
  EXPECT_EQ(reports[0].rows, 27);
  EXPECT_EQ(reports[1].merged, 1u);
  // b's run was run id 1 in its shard; in the merged file it is the third run.
  EXPECT_EQ(Query(Path("all.sqlite"), "SELECT run_id, config_sha256 FROM runs ORDER BY run_id"),
            "1|config-p1\n2|config-p2\n3|config-p3\n");
  EXPECT_EQ(Query(Path("all.sqlite"), "SELECT count(*) FROM requests WHERE run_id = 3"), "4\n");
  // The merged file holds exactly the rows of the shards, point by point.
  AddRun(Path("both.sqlite"), "p1", 3);
  AddRun(Path("both.sqlite"), "p2", 2);
  AddRun(Path("both.sqlite"), "p3", 4);
  EXPECT_EQ(Rows(Path("all.sqlite")), Rows(Path("both.sqlite")));
}

TEST_F(ShardsTest, MergingTwiceOrAfterAPartialMergeAddsEachPointOnce) {
  AddRun(Path("a.sqlite"), "p1", 3);
  AddRun(Path("b.sqlite"), "p2", 2);
  AddRun(Path("b.sqlite"), "p1", 3);  // the same point, also complete in another shard
  // A merge interrupted after shard a (each run is its own transaction, so what it left is a
  // prefix of the runs): then the full merge, twice.
  MergeShards({Path("a.sqlite")}, Path("all.sqlite"), {});
  const std::string partial = Rows(Path("all.sqlite"));
  auto reports = MergeShards({Path("a.sqlite"), Path("b.sqlite")}, Path("all.sqlite"), {});
  EXPECT_EQ(reports[0].merged, 0u);
  EXPECT_EQ(reports[0].already, 1u);
  EXPECT_EQ(reports[1].merged, 1u);
  EXPECT_EQ(reports[1].already, 1u);
  const std::string once = Rows(Path("all.sqlite"));
  EXPECT_NE(once, partial);
  reports = MergeShards({Path("a.sqlite"), Path("b.sqlite")}, Path("all.sqlite"), {});
  EXPECT_EQ(reports[0].merged + reports[1].merged, 0u);
  EXPECT_EQ(Rows(Path("all.sqlite")), once);
  EXPECT_EQ(Query(Path("all.sqlite"), "SELECT count(*), count(DISTINCT config_sha256) FROM runs"),
            "2|2\n");
}

TEST_F(ShardsTest, IncompleteRunsAreReportedAndLeftOutUnlessAsked) {
  AddRun(Path("a.sqlite"), "p1", 3);
  AddRun(Path("a.sqlite"), "p2", 1, "killed");
  AddRun(Path("a.sqlite"), "p3", 2, "failed");
  auto reports = MergeShards({Path("a.sqlite")}, Path("all.sqlite"), {});
  ASSERT_EQ(reports[0].incomplete.size(), 2u);
  EXPECT_STREQ(reports[0].incomplete[0].State(), "killed");
  EXPECT_EQ(reports[0].incomplete[0].config_sha256, "config-p2");
  EXPECT_STREQ(reports[0].incomplete[1].State(), "failed");
  EXPECT_EQ(reports[0].incomplete[1].error, "IoError: ssd_read: EIO");
  EXPECT_EQ(reports[0].merged, 1u);
  EXPECT_EQ(Query(Path("all.sqlite"), "SELECT config_sha256, complete FROM runs"),
            "config-p1|1\n");

  MergeOptions include;
  include.include_incomplete = true;
  reports = MergeShards({Path("a.sqlite")}, Path("all.sqlite"), include);
  EXPECT_EQ(reports[0].merged, 2u);
  EXPECT_EQ(Query(Path("all.sqlite"),
                  "SELECT config_sha256, complete, status, COALESCE(error, '') FROM runs ORDER BY "
                  "run_id"),
            "config-p1|1|ok|\nconfig-p2|0|running|\nconfig-p3|0|failed|IoError: ssd_read: EIO\n");
  // The killed run's rows came with it; merging again adds no second copy.
  EXPECT_EQ(Query(Path("all.sqlite"), "SELECT count(*) FROM requests WHERE run_id = 2"), "1\n");
  reports = MergeShards({Path("a.sqlite")}, Path("all.sqlite"), include);
  EXPECT_EQ(reports[0].merged, 0u);
  EXPECT_EQ(reports[0].already, 3u);
}

TEST_F(ShardsTest, ReadShardRunsTellsCompleteKilledAndFailedApart) {
  AddRun(Path("a.sqlite"), "p1", 1);
  AddRun(Path("a.sqlite"), "p2", 1, "killed", "cake");
  AddRun(Path("a.sqlite"), "p3", 1, "failed");
  const auto runs = ReadShardRuns(Path("a.sqlite"));
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_STREQ(runs[0].State(), "complete");
  EXPECT_STREQ(runs[1].State(), "killed");
  EXPECT_EQ(runs[1].system, "cake");
  EXPECT_STREQ(runs[2].State(), "failed");
  EXPECT_EQ(runs[2].trace_sha256, "trace-p3");
}

// The InputError's message, or "" if `f` does not throw one.
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST_F(ShardsTest, ShardsThatCannotBeMergedAreRefusedNamingTheFileBeforeAnyWrite) {
  AddRun(Path("a.sqlite"), "p1", 1);
  const std::string out = Path("all.sqlite");
  // Missing.
  EXPECT_NE(ErrorOf([&] { MergeShards({Path("a.sqlite"), Path("none.sqlite")}, out, {}); })
                .find("none.sqlite: no such results file"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_NE(ErrorOf([&] { ReadShardRuns(Path("none.sqlite")); }).find("none.sqlite"),
            std::string::npos);
  // Not SQLite.
  std::ofstream(Path("text.sqlite")) << "not a database, but long enough to have a header......"
                                        "..........................................\n";
  EXPECT_NE(ErrorOf([&] { MergeShards({Path("a.sqlite"), Path("text.sqlite")}, out, {}); })
                .find("text.sqlite"),
            std::string::npos);
  // Another schema version.
  AddRun(Path("v7.sqlite"), "p2", 1);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(Path("v7.sqlite").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 7", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  const std::string version =
      ErrorOf([&] { MergeShards({Path("a.sqlite"), Path("v7.sqlite")}, out, {}); });
  EXPECT_NE(version.find("v7.sqlite: results database of schema version 7"), std::string::npos)
      << version;
  // Regression (probing, 2026-12-02): a shard refused once the output was open left an empty
  // results file (the schema, no run) at --out.
  EXPECT_FALSE(fs::exists(out)) << "a refused merge created its output";
  // Another table layout under the same version (a column missing).
  AddRun(Path("old.sqlite"), "p3", 1);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(Path("old.sqlite").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE runs DROP COLUMN error", nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  const std::string columns =
      ErrorOf([&] { MergeShards({Path("a.sqlite"), Path("old.sqlite")}, out, {}); });
  EXPECT_NE(columns.find("old.sqlite: not a results database of this kvtier's schema: table "
                         "'runs' has columns"),
            std::string::npos)
      << columns;
  // The output itself as a shard.
  AddRun(out, "p9", 1);
  EXPECT_NE(ErrorOf([&] { MergeShards({Path("a.sqlite"), out}, out, {}); })
                .find("all.sqlite: is the merge's output file"),
            std::string::npos);
  // None of the refused merges wrote a run (a.sqlite came first in each).
  EXPECT_EQ(Query(out, "SELECT config_sha256 FROM runs"), "config-p9\n");
}

}  // namespace
}  // namespace kvtier
