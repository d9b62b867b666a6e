// Progress of the long commands through the built binary (cli/progress.h): with stderr in a
// file each prints its closing line with the count and the rate, and nothing with --quiet.
// (Line timing and the terminal form are unit-tested on a fake clock in progress_test.cc.)

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/cli/cli_fixture.h"

namespace {

namespace fs = std::filesystem;
using kvtier::testing::CliResult;

std::string ModelPath() {
  if (const char* p = std::getenv("KVTIER_MODEL"); p != nullptr && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class ProgressCliTest : public kvtier::testing::CliFixture {
 protected:
  // A tiny SmolLM2-shaped trace and an experiment the hw host backend runs in about a second.
  std::string HwExperiment() {
    const std::string trace = (dir_ / "t.kvt").string();
    CliResult r = Run("trace gen --quiet --out " + trace + " --requests 6 --prompts 2 --tasks 1 "
                      "--examples_min 1 --examples_max 2 --example_tokens 200 "
                      "--example_tokens_sd 20 --rate 50 --model-name smollm2-135m "
                      "--model-layers 30 --model-heads 9 --model-kv-heads 3 --vocab 49152 "
                      "--calibration_tokens 256");
    EXPECT_EQ(r.code, 0) << r.err;
    return Write("x.ini",
                 "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\n"
                 "[experiment]\nname = p\nsystems = as\n[workload]\ntrace = " + trace +
                     "\n[cache]\ngpu_capacity = 4MiB\ncpu_capacity = 16MiB\n"
                     "[run]\nwarmup_requests = 1\n[hw]\nbackend = host\nmax_memory = 256MiB\n");
  }
};

TEST_F(ProgressCliTest, TraceGenReportsCalibrationAndRecordsAndIsQuietWithQuiet) {
  const std::string args = "trace gen --out " + (dir_ / "g.kvt").string() +
                           " --requests 30 --prompts 2 --example_tokens 100 "
                           "--calibration_tokens 256";
  CliResult r = Run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[trace gen: calibrate importance] 100/100 measurements (100%)"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[trace gen] 30/30 records (100%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("records/s  done in"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a file gets whole lines";
  r = Run(args + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, "");
}

// (2026-12-02) `trace fit` of a 40-layer, 40-head trace ran for minutes without a word; it now
// counts its model evaluations, naming the step, and prints the same INI with --quiet.
TEST_F(ProgressCliTest, TraceFitCountsItsModelEvaluationsAndIsQuietWithQuiet) {
  const std::string trace = (dir_ / "f.kvt").string();
  ASSERT_EQ(Run("trace gen --quiet --out " + trace + " --requests 4 --model-name tiny "
                "--model-layers 2 --model-heads 2 --model-kv-heads 2 --vocab 1000").code,
            0);
  const std::string fit = "trace fit " + trace + " --rounds 1";
  CliResult r = Run(fit);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.rfind("[trace fit] ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(" model evaluations  "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model evaluations/s  done in"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[importance]\nparams = "), std::string::npos) << r.out;
  CliResult q = Run(fit + " --quiet");
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_EQ(q.err, "");
  EXPECT_EQ(q.out, r.out) << "progress changes nothing the fit writes";
}

TEST_F(ProgressCliTest, HwAndValidateCountTheTraceRequestsAndAreQuietWithQuiet) {
  const std::string x = HwExperiment();
  CliResult r = Run("hw --config " + x + " --out " + (dir_ / "h.sqlite").string());
  ASSERT_EQ(r.code, 0) << r.err;
  // The trace's header does not say how many requests it has: its end marker does.
  EXPECT_NE(r.err.find("[hw as] 6/6 requests (100%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("requests/s  done in"), std::string::npos) << r.err;
  r = Run("hw --config " + x + " --out " + (dir_ / "h2.sqlite").string() + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("mean TTFT"), std::string::npos) << "the table stays on stdout";

  r = Run("validate --config " + x + " --out " + (dir_ / "v.sqlite").string() + " --repeats 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[hw as] 6/6 requests (100%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[sim as] 6/6 requests (100%)"), std::string::npos) << r.err;
  r = Run("validate --config " + x + " --out " + (dir_ / "v2.sqlite").string() +
          " --repeats 1 --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

// sim and sweep: a rate-and-ETA line per run where stderr is a terminal or with --progress
// (here stderr is a file: whole lines, no carriage return); without either the plain
// log.progress lines as before; nothing on stderr with --quiet.
TEST_F(ProgressCliTest, SimAndSweepReportRateAndEtaPerRunWithProgressAndAreQuietWithQuiet) {
  const std::string x = HwExperiment();
  CliResult r = Run("sim --config " + x + " --out " + (dir_ / "s.sqlite").string() +
                    " --systems as,recomp --progress");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[sim as] 6/6 requests (100%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[sim recomp] 6/6 requests (100%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("requests/s  done in"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a file gets whole lines";
  r = Run("sim --config " + x + " --out " + (dir_ / "s2.sqlite").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("requests/s"), std::string::npos) << "not a terminal, not asked: " << r.err;
  EXPECT_NE(r.err.find("done: 6 requests"), std::string::npos) << r.err;
  r = Run("sim --config " + x + " --out " + (dir_ / "s3.sqlite").string() + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("mean TTFT"), std::string::npos) << "the table stays on stdout";

  const std::string sweep = "sweep --config " + x + " --set select.retention=0.25,0.5 ";
  r = Run(sweep + "--out " + (dir_ / "w.sqlite").string() + " --progress");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[sweep as select.retention=0.25] 6/6 requests (100%)"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[sweep as select.retention=0.5] 6/6 requests (100%)"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("requests/s  done in"), std::string::npos) << r.err;
  r = Run(sweep + "--out " + (dir_ / "w2.sqlite").string() + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST_F(ProgressCliTest, RecordAndEvalReportTheirRequestsAndItems) {
  if (!fs::exists(ModelPath())) {
    GTEST_SKIP() << "no model at " << ModelPath() << " (scripts/fetch_model.sh)";
  }
  const std::string rec = "trace record --dataset copa --prompts 1 --queries 2 --out " +
                          (dir_ / "r.kvt").string();
  CliResult r = Run(rec);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[record] 2/2 requests (100%)"), std::string::npos) << r.err;
  r = Run(rec + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");

  const std::string eval = "eval --tasks copa --items 2 --selectors itf --retentions 0.5 "
                           "--alphas 0.6 --threads 1 --out " + (dir_ / "a.sqlite").string();
  r = Run(eval);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[eval copa] 2/2 items (100%)"), std::string::npos) << r.err;
  r = Run(eval + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

}  // namespace
