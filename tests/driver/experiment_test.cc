// The experiment driver's contract (driver/experiment.h) with a backend over the FakeExecutor:
// the order it calls the backend in, requests served in trace order with the first
// run.warmup_requests marked, run.max_requests, progress, the run row of a complete run, and a
// failure (a request's, or the backend's before serving) recorded as a failed run and thrown
// as RunFailed. Both modes' own backends are covered end to end by tests/sim, tests/hw and
// tests/cli.

#include "driver/experiment.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "analysis/results_db.h"
#include "core/errors.h"
#include "tests/testutil/fake_executor.h"
#include "traces/generator.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using testing::FakeExecutor;
using testing::FakeExecutorOptions;
using testing::FakeFailure;

// One request at a time on the FakeExecutor, recording what the driver asked of it.
class FakeBackend : public ExperimentBackend {
 public:
  explicit FakeBackend(FakeExecutorOptions options = {}) : executor_(std::move(options)) {}

  const char* mode() const override { return "sim"; }
  const char* end_time_metric() const override { return "simulated_s"; }
  Executor& executor() override { return executor_; }
  void ConfigurePipeline(PipelineOptions* options) override {
    calls.push_back("ConfigurePipeline");
    options->chunk_detail = false;
  }
  void BeginRun(const RunInfo& info, TraceScoreSource* scores) override {
    calls.push_back("BeginRun " + info.mode + " " + info.system);
    EXPECT_EQ(scores->live_requests(), 0u);
  }
  Status BeforeServing(const Pipeline& pipeline, bool prewarmed) override {
    calls.push_back(std::string("BeforeServing") + (prewarmed ? " prewarmed" : ""));
    prewarmed_segments = pipeline.tree().FindSegment(1) != nullptr;
    return before_serving;
  }
  ServeOutcome Serve(Pipeline& pipeline, const NextFn& next, const DoneFn& done) override {
    calls.push_back("Serve");
    ServeOutcome out;
    ReplayItem item;
    while (next(&item)) {
      EXPECT_GE(item.request.arrival_s, last_arrival) << "arrival order";
      last_arrival = item.request.arrival_s;
      executor_.IdleUntil(item.request.arrival_s);
      served.push_back({item.request.id, item.warmup});
      const Status st = pipeline.Run(item.request, item.warmup);
      ++out.requests;
      done(item, st);
    }
    out.finish = pipeline.Finish();
    out.end_s = executor_.Now();
    return out;
  }
  void EndServing() override { calls.push_back("EndServing"); }
  void LogMetrics(RunLog& log) override {
    calls.push_back("LogMetrics");
    log.LogMetric("fake.ops", double(executor_.history().size()));
  }

  std::vector<std::string> calls;
  std::vector<std::pair<RequestId, bool>> served;  // id, warmup
  Status before_serving;
  bool prewarmed_segments = false;
  Seconds last_arrival = 0;

 private:
  FakeExecutor executor_;
};

class ExperimentTest : public ::testing::Test {
 protected:
  static constexpr int kRequests = 6;

  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvtier_experiment_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const char* src = std::getenv("KVTIER_SOURCE_DIR");
    setenv("KVTIER_CONFIG_DIR",
           (fs::path(src ? src : KVTIER_SOURCE_DIR_FALLBACK) / "configs").c_str(), 1);
    // SmolLM2's shape, short shared prefixes: every system runs it in milliseconds.
    WorkloadParams w;
    w.requests = kRequests;
    w.prompts = 2;
    w.tasks = 1;
    w.examples_min = 1;
    w.examples_max = 2;
    w.example_tokens = 150;
    w.example_tokens_sd = 10;
    w.rate = 50;
    w.vocab = 49152;
    const ModelDescriptor m{"smollm2-135m", 30, 9, 3};
    ImportanceTargets t;
    GenerateTrace((dir_ / "t.kvt").string(), w, m, t, Calibrate(t, 30, 3, 256, 1));
  }
  void TearDown() override { fs::remove_all(dir_); }

  Config Load(const std::string& extra = "") {
    std::ofstream(dir_ / "e.ini") << "[include]\nmodel = smollm2-135m\n"
                                     "hardware = a100-pcie4-nvme\nsystem = as\n"
                                     "[workload]\ntrace = t.kvt\n[run]\nwarmup_requests = 2\n"
                                  << extra;
    return Config::Load((dir_ / "e.ini").string(), {});
  }
  std::string Out() const { return (dir_ / "r.sqlite").string(); }
  std::string Trace() const { return (dir_ / "t.kvt").string(); }

  // One value of a query on the results file ("" if none).
  std::string Query(const std::string& sql) const {
    sqlite3* db = nullptr;
    std::string out;
    if (sqlite3_open_v2(Out().c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      sqlite3_stmt* st = nullptr;
      if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
          sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr) {
        out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
      }
      sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return out;
  }

  fs::path dir_;
};

TEST_F(ExperimentTest, ServesEveryRequestInTraceOrderAndEndsComplete) {
  const Config config = Load();
  Experiment experiment(config, Trace(), Out());
  experiment.CheckTrace();
  FakeBackend backend;
  std::vector<std::pair<long long, long long>> progress;
  const ExperimentResult r = experiment.Run(backend, [&](long long done, long long total, double) {
    progress.emplace_back(done, total);
  });

  EXPECT_EQ(backend.calls,
            (std::vector<std::string>{"BeginRun sim as", "ConfigurePipeline", "BeforeServing",
                                      "Serve", "EndServing", "LogMetrics"}));
  ASSERT_EQ(backend.served.size(), std::size_t(kRequests));
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(backend.served[i].second, i < 2) << "the first run.warmup_requests are warm-ups";
  }
  EXPECT_EQ(r.requests, kRequests);
  ASSERT_EQ(progress.size(), std::size_t(kRequests));
  // GenerateTrace's header does not say how many requests it holds: the total is unknown (0).
  EXPECT_EQ(progress.back(), std::make_pair((long long)kRequests, 0LL));

  const std::string run = std::to_string(r.run_id);
  EXPECT_EQ(
      Query("SELECT complete || ' ' || status || ' ' || mode FROM runs WHERE run_id = " + run),
      "1 ok sim");
  EXPECT_EQ(Query("SELECT COUNT(*) FROM requests WHERE warmup = 1 AND run_id = " + run), "2");
  EXPECT_EQ(Query("SELECT COUNT(*) FROM requests WHERE run_id = " + run),
            std::to_string(kRequests));
  // The end time under the backend's name, wall_s, then the backend's own metrics.
  EXPECT_EQ(Query("SELECT value FROM metrics WHERE name = 'simulated_s'"),
            Query("SELECT MAX(end_s) FROM requests"))
      << "nothing runs after the last request here";
  EXPECT_NE(Query("SELECT value FROM metrics WHERE name = 'wall_s'"), "");
  EXPECT_NE(Query("SELECT value FROM metrics WHERE name = 'fake.ops'"), "");
}

TEST_F(ExperimentTest, MaxRequestsAndPrewarmBoundWhatIsServedAndStored) {
  const Config config = Load("max_requests = 4\nprewarm = true\n");
  Experiment experiment(config, Trace(), Out());
  experiment.CheckTrace();
  FakeBackend backend;
  long long total = -1;
  const ExperimentResult r =
      experiment.Run(backend, [&](long long, long long t, double) { total = t; });
  EXPECT_EQ(r.requests, 4);
  EXPECT_EQ(total, 4) << "progress counts up to run.max_requests";
  EXPECT_EQ(backend.calls[2], "BeforeServing prewarmed");
  EXPECT_TRUE(backend.prewarmed_segments) << "prewarm stored the prefixes before serving";
}

TEST_F(ExperimentTest, ARequestsFailureStopsTheRunAndRecordsItFailed) {
  const Config config = Load();
  Experiment experiment(config, Trace(), Out());
  experiment.CheckTrace();
  FakeExecutorOptions options;
  FakeFailure failure;
  failure.compute = ComputeKind::kOutputLayer;
  failure.nth = 3;  // the third request's last step
  failure.status = Status::CudaError("scripted launch failure");
  options.failures.push_back(failure);
  FakeBackend backend(options);
  try {
    experiment.Run(backend, nullptr);
    FAIL() << "no RunFailed";
  } catch (const RunFailed& e) {
    EXPECT_NE(std::string(e.what()).find("system as, run 1: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("scripted launch failure"), std::string::npos) << e.what();
  }
  EXPECT_EQ(backend.served.size(), 3u) << "no request is taken after the failure";
  EXPECT_EQ(Query("SELECT complete || ' ' || status FROM runs"), "0 failed");
  EXPECT_NE(Query("SELECT error FROM runs").find("scripted launch failure"), std::string::npos);
  EXPECT_EQ(backend.calls.back(), "LogMetrics") << "a failed run still logs its metrics";
}

TEST_F(ExperimentTest, ABackendFailureBeforeServingFailsTheRunWithoutServing) {
  const Config config = Load();
  Experiment experiment(config, Trace(), Out());
  experiment.CheckTrace();
  FakeBackend backend;
  backend.before_serving = Status::OutOfSpace("prewarm: storing segment 1: store full");
  EXPECT_THROW(experiment.Run(backend, nullptr), RunFailed);
  EXPECT_TRUE(backend.served.empty());
  EXPECT_EQ(Query("SELECT status || ': ' || error FROM runs"),
            "failed: " + backend.before_serving.ToString());
  EXPECT_EQ(Query("SELECT COUNT(*) FROM requests"), "0");
}

TEST_F(ExperimentTest, ATraceTheConfigurationCannotReplayFailsBeforeAnythingIsWritten) {
  std::ofstream(dir_ / "e.ini") << "[include]\nmodel = opt-13b\nhardware = a100-pcie4-nvme\n"
                                   "system = as\n[workload]\ntrace = t.kvt\n";
  const Config config = Config::Load((dir_ / "e.ini").string(), {});
  Experiment experiment(config, Trace(), Out());
  EXPECT_THROW(experiment.CheckTrace(), InputError) << "smollm2 trace, opt-13b experiment";
  EXPECT_FALSE(fs::exists(Out()));
}

}  // namespace
}  // namespace kvtier
