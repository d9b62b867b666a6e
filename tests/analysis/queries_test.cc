// The reports of analysis/queries.h on a results file written through ResultsDb and its run
// log, with every expected number derived by hand from the rows written: run_summary's
// statistics over measured requests of complete runs, the simulator's TTFT error against the
// hardware (nearest-rank percentiles), the stage busy times, and the accuracy rows of eval
// (multiple choice and decode).

#include "analysis/queries.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "analysis/results_db.h"
#include "core/errors.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

class QueriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() /
             ("kvtier_queries_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".sqlite"))
                .string();
    fs::remove(path_);
  }
  void TearDown() override {
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path_ + suffix);
  }

  // One run of `system` in `mode` whose measured requests have these TTFTs (request ids 1..n;
  // request 0 is a warm-up with a TTFT of 9 s that no statistic may include). Every request
  // queued 2 ms, stalled 1 ms, read 3 MiB from SSD, and looked up the chunks given.
  long long AddRun(ResultsDb* db, const std::string& mode, const std::string& system,
                   const std::vector<double>& ttfts, bool complete = true, int gpu_hits = 1,
                   int cpu_hits = 1, int ssd_reads = 2, int itf_layers = 4, int fallbacks = 1) {
    RunInfo info;
    info.mode = mode;
    info.experiment = "x";
    info.system = system;
    info.model = "opt-13b";
    info.hardware = "box";
    info.trace = "t.kvt";
    info.trace_sha256 = "abc";
    info.config = "c";
    info.config_sha256 = mode + system;
    const long long id = db->BeginRun(info);
    std::unique_ptr<RunLog> log = db->NewRunLog(id);
    for (std::size_t i = 0; i <= ttfts.size(); ++i) {
      RequestRecord r;
      r.request_id = i;
      r.warmup = i == 0;
      r.ttft_s = i == 0 ? 9.0 : ttfts[i - 1];
      r.arrival_s = 10.0 * double(i);
      r.start_s = r.arrival_s + 0.002;
      r.end_s = r.start_s + r.ttft_s;
      r.ttft_arrival_s = r.end_s - r.arrival_s;
      r.io_stall_s = 0.001;
      r.ssd_read_bytes = 3 << 20;
      r.gpu_hit_chunks = gpu_hits;
      r.cpu_hit_chunks = cpu_hits;
      r.ssd_read_chunks = ssd_reads;
      r.itf_layers = itf_layers;
      r.itf_fallback_layers = fallbacks;
      log->LogRequest(r);
    }
    log->Close();
    if (complete) db->EndRun(id, 1.0);  // else as if killed: complete = 0, status 'running'
    return id;
  }

  std::string path_;
};

TEST_F(QueriesTest, RunSummariesAreMeasuredRequestsOfCompleteRunsLowestMeanFirst) {
  long long spec = 0, as = 0, broken = 0;
  {
    ResultsDb db(path_);
    spec = AddRun(&db, "sim", "spec", {0.040, 0.010, 0.030, 0.020});
    as = AddRun(&db, "sim", "as", {0.005, 0.005}, true, 0, 0, 0, 0, 0);
    broken = AddRun(&db, "sim", "cake", {0.001}, /*complete=*/false);
  }
  const std::vector<RunSummaryRow> rows = RunSummaries(path_, {spec, as, broken});
  ASSERT_EQ(rows.size(), 2u) << "the incomplete run has no row";
  EXPECT_EQ(rows[0].run_id, as);
  EXPECT_EQ(rows[0].system, "as");
  EXPECT_EQ(rows[0].requests, 2);
  EXPECT_FALSE(rows[0].gpu_hit_ratio) << "no chunk was looked up";
  EXPECT_FALSE(rows[0].cpu_hit_ratio);
  EXPECT_FALSE(rows[0].itf_fallback_rate) << "ITF never ran";

  const RunSummaryRow& s = rows[1];
  EXPECT_EQ(s.run_id, spec);
  EXPECT_EQ(s.requests, 4);  // the warm-up is not measured
  EXPECT_NEAR(s.mean_ttft_s, 0.025, 1e-12);
  EXPECT_DOUBLE_EQ(s.p50_ttft_s, 0.020);  // nearest rank: 2nd of 4
  EXPECT_DOUBLE_EQ(s.p99_ttft_s, 0.040);  // 4th of 4
  EXPECT_NEAR(s.mean_queue_s, 0.002, 1e-12);
  EXPECT_NEAR(s.mean_io_stall_s, 0.001, 1e-12);
  EXPECT_DOUBLE_EQ(s.mean_ssd_read_bytes, 3 << 20);
  ASSERT_TRUE(s.gpu_hit_ratio && s.cpu_hit_ratio && s.itf_fallback_rate);
  EXPECT_DOUBLE_EQ(*s.gpu_hit_ratio, 0.25);  // 1 of 1 + 1 + 2 chunks
  EXPECT_DOUBLE_EQ(*s.cpu_hit_ratio, 0.25);
  EXPECT_DOUBLE_EQ(*s.itf_fallback_rate, 0.25);  // 1 of 4 layers

  EXPECT_TRUE(RunSummaries(path_, {}).empty());
  EXPECT_TRUE(RunSummaries(path_, {broken}).empty());
}

TEST_F(QueriesTest, SimVsHwErrorsPairRequestsOfTheRunsAskedFor) {
  long long sim = 0, hw = 0, other_sim = 0;
  {
    ResultsDb db(path_);
    // Request by request, sim vs hw: 10 vs 12.5 ms (-20%), 20 vs 25 (-20%), 30 vs 20 (+50%),
    // 40 vs 40 (0%).
    sim = AddRun(&db, "sim", "spec", {0.010, 0.020, 0.030, 0.040});
    hw = AddRun(&db, "hw", "spec", {0.0125, 0.025, 0.020, 0.040});
    other_sim = AddRun(&db, "sim", "spec", {1, 1, 1, 1});  // another run, not asked for
  }
  const std::vector<TtftErrorSummary> e = SimVsHwTtftErrors(path_, {sim}, {hw});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].system, "spec");
  EXPECT_EQ(e[0].requests, 4u);
  // |errors| sorted: 0, 0.2, 0.2, 0.5; nearest rank: median the 2nd, p90 the 4th.
  EXPECT_NEAR(e[0].median_abs, 0.2, 1e-12);
  EXPECT_NEAR(e[0].p90_abs, 0.5, 1e-12);
  EXPECT_NEAR(e[0].max_abs, 0.5, 1e-12);
  // Signed: -0.2, -0.2, 0, 0.5: the simulator is fast on most requests.
  EXPECT_NEAR(e[0].median_signed, -0.2, 1e-12);

  const std::vector<TtftErrorSummary> other = SimVsHwTtftErrors(path_, {other_sim}, {hw});
  ASSERT_EQ(other.size(), 1u);
  EXPECT_NEAR(other[0].median_abs, 1 / 0.025 - 1, 1e-9);  // 1 s vs 25 ms
  EXPECT_TRUE(SimVsHwTtftErrors(path_, {}, {hw}).empty());
}

TEST_F(QueriesTest, SimVsHwStagesCompareBusyTimePerStage) {
  long long sim = 0, hw = 0;
  {
    ResultsDb db(path_);
    auto run = [&](const std::string& mode, double read_s, double layer_s) {
      RunInfo info;
      info.mode = mode;
      info.experiment = "x";
      info.system = "spec";
      info.trace_sha256 = "abc";
      const long long id = db.BeginRun(info);
      std::unique_ptr<RunLog> log = db.NewRunLog(id);
      RequestRecord q;
      log->LogRequest(q);
      for (int i = 0; i < 2; ++i) {  // two reads and two layers, back to back
        TransferRecord t;
        t.kind = TransferKind::kSsdRead;
        t.start_s = i * read_s;
        t.end_s = (i + 1) * read_s;
        log->LogTransfer(t);
        LayerRecord l;
        l.layer = i;
        l.start_s = i * layer_s;
        l.end_s = (i + 1) * layer_s;
        log->LogLayer(l);
      }
      log->Close();
      db.EndRun(id, 1.0);
      return id;
    };
    sim = run("sim", 0.003, 0.001);
    hw = run("hw", 0.002, 0.001);
  }
  const std::vector<StageErrorRow> rows = SimVsHwStages(path_, {sim}, {hw});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].stage, "compute");  // ordered by system, then stage
  EXPECT_NEAR(rows[0].sim_busy_s, 0.002, 1e-12);
  EXPECT_NEAR(rows[0].hw_busy_s, 0.002, 1e-12);
  EXPECT_NEAR(rows[0].rel_error, 0, 1e-9);
  EXPECT_EQ(rows[1].system, "spec");
  EXPECT_EQ(rows[1].stage, "ssd_read");
  EXPECT_NEAR(rows[1].sim_busy_s, 0.006, 1e-12);
  EXPECT_NEAR(rows[1].hw_busy_s, 0.004, 1e-12);
  EXPECT_NEAR(rows[1].rel_error, 0.5, 1e-9);
}

// The driving thread's four metrics of each complete hw run, one row per run; sim runs,
// incomplete runs and runs without the metrics have none.
TEST_F(QueriesTest, DriverTimesAreTheHwRunsDriverMetrics) {
  long long hw1 = 0, hw2 = 0, sim = 0, killed = 0, bare = 0;
  {
    ResultsDb db(path_);
    auto run = [&](const std::string& mode, const std::string& system, double awake, double ops,
                   bool complete, bool metrics) {
      RunInfo info;
      info.mode = mode;
      info.experiment = "x";
      info.system = system;
      info.config_sha256 = mode + system + std::to_string(awake);
      const long long id = db.BeginRun(info);
      std::unique_ptr<RunLog> log = db.NewRunLog(id);
      log->LogRequest(RequestRecord{});
      if (metrics) {
        log->LogMetric("hw.driver_awake_s", awake);
        log->LogMetric("hw.driver_ops", ops);
        log->LogMetric("hw.driver_wake_s", 0.002);
        log->LogMetric("hw.driver_blocked_waits", 100);
        log->LogMetric("hw.chunks_read", 7);  // not a driver metric
      }
      log->Close();
      if (complete) db.EndRun(id, 1.0);
      return id;
    };
    hw1 = run("hw", "as", 0.004, 400, true, true);
    sim = run("sim", "as", 0.001, 10, true, true);
    hw2 = run("hw", "spec", 0.009, 600, true, true);
    killed = run("hw", "spec", 0.5, 5, false, true);
    bare = run("hw", "cake", 0, 0, true, false);
  }
  const std::vector<DriverTimeRow> all = DriverTimes(path_, {});
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].run_id, hw1);
  EXPECT_EQ(all[0].system, "as");
  EXPECT_NEAR(all[0].awake_s, 0.004, 1e-15);
  EXPECT_EQ(all[0].ops, 400);
  EXPECT_NEAR(all[0].wake_s, 0.002, 1e-15);
  EXPECT_EQ(all[0].blocked_waits, 100);
  EXPECT_EQ(all[1].run_id, hw2);
  EXPECT_EQ(all[1].ops, 600);
  const std::vector<DriverTimeRow> one = DriverTimes(path_, {hw2, sim, killed, bare});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].run_id, hw2);
  EXPECT_NEAR(one[0].awake_s, 0.009, 1e-15);
}

TEST_F(QueriesTest, AccuracyRowsAreInsertedAllOrNone) {
  ResultsDb db(path_);
  RunInfo info;
  info.mode = "eval";
  const long long run = db.BeginRun(info);
  AccuracyRecord full;  // the full KV: no alpha, no fallback rate
  full.task = "piqa";
  full.selector = "full";
  full.items = 20;
  full.correct = 13;
  full.accuracy = 0.65;
  full.first_token_agreement = 1;
  full.mean_kept_fraction = 1;
  AccuracyRecord itf = full;
  itf.selector = "itf";
  itf.alpha = 0.6;
  itf.retention = 0.25;
  itf.correct = 12;
  itf.accuracy = 0.6;
  itf.first_token_agreement = 0.9;
  itf.mean_kept_fraction = 0.27;
  itf.itf_fallback_rate = 0.1;
  InsertAccuracy(&db, run, {full, itf});
  AccuracyRecord bad = full;
  bad.selector = "oracle";  // the schema's CHECK rejects it
  EXPECT_THROW(InsertAccuracy(&db, run, {itf, bad}), InputError);

  // Read back through SQL, as a user would.
  std::string rows;
  db.Exec(
      "CREATE TEMP TABLE seen AS SELECT group_concat(selector || ':' || "
      "ifnull(alpha, 'null') || ':' || retention || ':' || correct || ':' || "
      "ifnull(itf_fallback_rate, 'null'), ' ') AS r FROM (SELECT * FROM accuracy "
      "ORDER BY selector)");
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db.handle(), "SELECT r FROM seen", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  rows = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  EXPECT_EQ(rows, "full:null:1.0:13:null itf:0.6:0.25:12:0.1") << "the failed insert added none";
}

TEST_F(QueriesTest, DecodeAccuracyRowsCarryTheirColumns) {
  ResultsDb db(path_);
  RequireDecodeSelectors(&db);  // a file made by this version takes decode rows
  RunInfo info;
  info.mode = "eval";
  const long long run = db.BeginRun(info);
  AccuracyRecord full;  // the 16-bit cache: bits only
  full.task = "texts";
  full.selector = "full";
  full.items = 96;
  full.correct = 46;
  full.accuracy = 0.5;
  full.first_token_agreement = 1;
  full.mean_kept_fraction = 1;
  full.kv_bits = 16;
  full.perplexity = 21.5;
  full.token_agreement = 1;
  full.kv_size_ratio = 1;
  AccuracyRecord spec = full;
  spec.selector = "specache";
  spec.kv_bits = 1;
  spec.kv_group = 32;
  spec.kv_residual = 64;
  spec.kv_quant = "improved";
  spec.topk = 64;
  spec.perplexity = 25.5;
  spec.token_agreement = 0.75;
  spec.hit_rate = 0.825;
  spec.oracle_hit_rate = 0.875;
  spec.kv_size_ratio = 0.25;
  InsertAccuracy(&db, run, {full, spec});

  db.Exec(
      "CREATE TEMP TABLE seen AS SELECT group_concat(selector || ':' || kv_bits || ':' || "
      "ifnull(kv_group, 'null') || ':' || ifnull(kv_residual, 'null') || ':' || "
      "ifnull(kv_quant, 'null') || ':' || ifnull(topk, 'null') || ':' || perplexity || ':' || "
      "token_agreement || ':' || ifnull(hit_rate, 'null') || ':' || "
      "ifnull(oracle_hit_rate, 'null') || ':' || kv_size_ratio || ':' || ifnull(alpha, 'null'), "
      "' ') AS r FROM (SELECT * FROM accuracy ORDER BY selector)");
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db.handle(), "SELECT r FROM seen", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  const std::string rows = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  EXPECT_EQ(rows,
            "full:16:null:null:null:null:21.5:1.0:null:null:1.0:null "
            "specache:1:32:64:improved:64:25.5:0.75:0.825:0.875:0.25:null");
}

TEST_F(QueriesTest, AMissingFileIsAnInputErrorNamingIt) {
  try {
    RunSummaries(path_ + ".absent", {1});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path_ + ".absent"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtier
