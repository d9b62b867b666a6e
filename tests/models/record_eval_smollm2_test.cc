// The real SmolLM2-135M through the built binary (label slow; skips without the model file,
// $KVTIER_MODEL or ~/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf):
//   a recorded 2-request PIQA trace passes `trace info`/`trace stats` and replays through
//   `kvtier sim` (exit 0, a complete run row);
//   `kvtier eval` on 12 PIQA items writes accuracy rows, full-KV accuracy is above chance, and
//   the accuracy_latency view pairs the ITF row with the spec sim run in the same file;
//   `kvtier eval --tasks decode` at small sizes writes one row per task and configuration with
//   the decode columns filled as analysis/SCHEMA.md says.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdlib>
#include <iostream>

#include "tests/models/cli_run.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using testing::RunKvtier;
using testing::SourceDir;

std::string ModelPath() {
  if (const char* p = std::getenv("KVTIER_MODEL"); p != nullptr && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string Query(const fs::path& db, const std::string& sql) {
  sqlite3* h = nullptr;
  std::string out;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    } else {
      out = std::string("error: ") + sqlite3_errmsg(h);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return out;
}

class SmolLm2RecordEvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(ModelPath())) GTEST_SKIP() << "no model at " << ModelPath() << " (scripts/fetch_model.sh)";
    dir_ = fs::temp_directory_path() /
           ("kvtier_smol_receval_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    setenv("KVTIER_CONFIG_DIR", (SourceDir() / "configs").c_str(), 1);
    setenv("OMP_NUM_THREADS", "2", 0);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(SmolLm2RecordEvalTest, RecordedTraceReplaysThroughSimAndEvalJoinsLatency) {
  const std::string trace = (dir_ / "piqa.kvt").string();
  auto r = RunKvtier(dir_, "trace record --dataset piqa --prompts 1 --queries 2 --examples-min 2 "
                           "--examples-max 2 --rate 2 --decode-steps 2 --out " + trace,
                     SourceDir());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(": 2 records"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  std::cout << r.out;

  r = RunKvtier(dir_, "trace info " + trace);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model smollm2-135m: 30 layers, 9 heads, 3 kv heads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("importance explicit"), std::string::npos) << r.out;
  r = RunKvtier(dir_, "trace stats " + trace);
  ASSERT_EQ(r.code, 0) << r.err;

  const fs::path db = dir_ / "r.sqlite";
  const std::string ini = (dir_ / "e.ini").string();
  std::ofstream(ini) << "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\n"
                        "[experiment]\nname = t\nsystems = spec,as_h2o_lfu\n[workload]\ntrace = "
                     << trace << "\n[select]\nretention = 0.25\n[itf]\nprobe_heads = 2\n";
  r = RunKvtier(dir_, "sim --config " + ini + " --out " + db.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE mode = 'sim' AND complete = 1"), "2");
  EXPECT_EQ(Query(db, "SELECT requests FROM run_summary WHERE system = 'spec'"), "2");

  r = RunKvtier(dir_, "eval --tasks piqa --items 12 --selectors itf,h2o --alphas 0.6 "
                      "--retentions 0.25 --out " + db.string(), SourceDir());
  ASSERT_EQ(r.code, 0) << r.err;
  std::cout << r.out;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy"), "3");  // full, itf, h2o
  EXPECT_EQ(Query(db, "SELECT items FROM accuracy WHERE selector = 'full'"), "12");
  const double full = std::atof(Query(db, "SELECT accuracy FROM accuracy WHERE selector = 'full'").c_str());
  std::cout << "PIQA full-KV accuracy on 12 items: " << full << "\n";
  EXPECT_GT(full, 0.5) << "a 2-choice task: chance is 0.5";
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE mode = 'eval' AND complete = 1"), "1");
  // accuracy_latency: itf@0.25/0.6 pairs with the spec run, h2o@0.25 with as_h2o_lfu.
  EXPECT_EQ(Query(db, "SELECT system FROM accuracy_latency WHERE selector = 'itf'"), "spec");
  EXPECT_EQ(Query(db, "SELECT system FROM accuracy_latency WHERE selector = 'h2o'"), "as_h2o_lfu");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy_latency WHERE selector = 'full'"), "0");
}

TEST_F(SmolLm2RecordEvalTest, DecodeTasksWriteOneRowPerTaskAndConfiguration) {
  const fs::path db = dir_ / "decode.sqlite";
  const auto r = RunKvtier(dir_,
                           "eval --tasks decode --bits 2 --ks 16 --ablation-k 0 --ppl-context 128 "
                           "--ppl-tokens 8 --gen-prompt 160 --gen-tokens 4 --niah-lengths 160 "
                           "--niah-depths 1 --niah-answer-tokens 8 --threads 2 --out " + db.string(),
                           SourceDir());
  ASSERT_EQ(r.code, 0) << r.err;
  std::cout << r.out;
  // 3 tasks x (full, kivi, specache k=16, specache_nospec k=16).
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy"), "12");
  EXPECT_EQ(Query(db, "SELECT group_concat(DISTINCT task) FROM accuracy"), "texts,greedy,niah");
  EXPECT_EQ(Query(db, "SELECT items FROM accuracy WHERE task = 'texts' AND selector = 'full'"),
            "24");  // 3 texts x 8 tokens
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy WHERE selector = 'full' AND kv_bits = 16 AND "
                      "token_agreement = 1 AND kv_size_ratio = 1 AND topk IS NULL"),
            "3");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy WHERE selector = 'specache' AND kv_bits = 2 "
                      "AND topk = 16 AND kv_group = 32 AND kv_residual = 64 AND kv_quant = "
                      "'improved' AND hit_rate > 0 AND hit_rate <= oracle_hit_rate + 1e-9"),
            "3");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy WHERE selector = 'kivi' AND kv_residual = 128 "
                      "AND hit_rate IS NULL AND kv_size_ratio < 1"),
            "3");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy WHERE perplexity IS NOT NULL"), "4");
  // The 16-bit cache answers the needle at the end of a short haystack.
  EXPECT_EQ(Query(db, "SELECT correct FROM accuracy WHERE task = 'niah' AND selector = 'full'"), "1");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM accuracy_latency"), "0");  // no sim runs, no pairs
}

}  // namespace
// Regression (issue 18's class): --probe-heads above the model's KV heads was cut to them
// silently while the run's configuration recorded the number asked for.
TEST_F(SmolLm2RecordEvalTest, ProbeHeadsAboveTheModelsThreeKvHeadsExitTwoBeforeAnyRun) {
  const fs::path db = dir_ / "p.sqlite";
  const auto r = RunKvtier(dir_, "eval --tasks piqa --items 1 --probe-heads 4 --out " + db.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--probe-heads 4: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("has 3 KV heads"), std::string::npos) << r.err;
  // No run begun, and no results file left of the command's making (2026-12-02: it left one
  // holding only the schema).
  EXPECT_FALSE(fs::exists(db));
}

// Regression (issue 18's class): `lm generate --tokens 1000000000` generated up to the context
// for minutes and returned fewer tokens than asked for without a word.
TEST_F(SmolLm2RecordEvalTest, LmGenerateOfABillionTokensExitsTwoNamingTheContext) {
  const auto r = RunKvtier(dir_, "lm generate --prompt hi --tokens 1000000000");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--tokens 1000000000: at most 8191 (the model's context of 8192 tokens"),
            std::string::npos)
      << r.err;
}

// Regression (probing, 2026-12-01): an empty prompt failed inside the forward pass naming the
// model file ("...gguf: Forward: no tokens"), and an empty --text path read as
// ": cannot open --text: No such file or directory". Both name the flag.
TEST_F(SmolLm2RecordEvalTest, AnEmptyPromptOrAnEmptyTextPathExitsTwoNamingTheFlag) {
  auto r = RunKvtier(dir_, "lm generate --prompt '' --tokens 3");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--prompt: empty: give the text to continue"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "lm perplexity --text ''");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: --text: an empty path names no file"), std::string::npos) << r.err;
}

// Regression (probing, 2026-12-01, second sitting): a prompt of non-UTF-8 bytes was called
// "empty"; a text longer than the context failed inside the model as "MODEL.gguf: input of N
// tokens ... longer than the context length", blaming the model file.
TEST_F(SmolLm2RecordEvalTest, APromptOfNoTokensOrATextPastTheContextNamesTheFlag) {
  auto r = RunKvtier(dir_, "lm generate --prompt \"$(printf '\\377\\376')\" --tokens 2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--prompt: its 2 bytes give no token"), std::string::npos) << r.err;
  const std::filesystem::path long_text = dir_ / "long.txt";
  {
    std::ofstream f(long_text);
    for (int i = 0; i < 3000; ++i) f << "the quick brown fox jumps over the lazy dog ";
  }
  r = RunKvtier(dir_, "lm perplexity --text " + long_text.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("tokens, more than the model's context of 8192"), std::string::npos)
      << r.err;
}

// Regression (probing, 2026-12-01): `eval --tasks ''` ran every default task, `--tasks
// piqa,piqa` scored PIQA twice into two sets of rows, and a repeated retention or selector
// scored one configuration twice. Each is an error naming the flag, before the model loads.
TEST_F(SmolLm2RecordEvalTest, EvalListsThatAreEmptyOrRepeatAnItemExitTwo) {
  const std::string db = (dir_ / "e.sqlite").string();
  auto r = RunKvtier(dir_, "eval --tasks '' --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--tasks: empty list"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks piqa,copa,piqa --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--tasks: 'piqa' listed twice"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks piqa --retentions 0.1,0.10 --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--retentions: '0.10' repeats a value listed before"), std::string::npos)
      << r.err;
  r = RunKvtier(dir_, "eval --tasks piqa --selectors , --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--selectors: empty list"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(db));
}

// Regression (probing, 2026-12-01, second sitting): a decode flag whose task --tasks does not
// name was ignored without a word (`--tasks copa --bits 3` scored copa); a zero decode length
// was "decode task lengths must be >= 1", naming no flag.
TEST_F(SmolLm2RecordEvalTest, ADecodeFlagForATaskNotNamedOrAZeroLengthExitsTwoNamingTheFlag) {
  const std::string db = (dir_ / "d.sqlite").string();
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--tasks copa --bits 3", "--bits applies to the decode tasks texts, greedy, niah"},
           {"--tasks texts --niah-text x.txt", "--niah-text applies to the decode task niah"},
           {"--tasks copa,niah --ppl-tokens 5", "--ppl-tokens applies to the decode task texts"},
           {"--tasks greedy --gen-tokens 0", "--gen-tokens must be >= 1 (a length in tokens)"}}) {
    auto r = RunKvtier(dir_, "eval " + args + " --out " + db);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(db));
}

}  // namespace kvtier
