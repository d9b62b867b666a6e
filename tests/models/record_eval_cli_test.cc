// `kvtier trace record` and `kvtier eval` bad input through the built binary: unknown datasets
// and tasks, data that may not be committed (RTE, OpenBookQA) missing, bad flag values. All are
// rejected before the model loads (exit 2, a message naming the problem), so no model is needed.

#include <fstream>

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include "tests/models/cli_run.h"
#include "tests/models/tiny_model.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using testing::RunKvtier;

class RecordEvalCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvtier_receval_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(RecordEvalCliTest, UnknownDatasetOrTaskExitsTwo) {
  auto r = RunKvtier(dir_, "trace record --dataset hellaswag --out " + (dir_ / "t.kvt").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown dataset 'hellaswag'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("piqa, copa, rte, openbookqa, rag"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks piqa,bogus --out " + (dir_ / "r.sqlite").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown task 'bogus'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "r.sqlite")) << "nothing written on bad input";
}

TEST_F(RecordEvalCliTest, MissingSharedDataForRteIsAClearError) {
  auto r = RunKvtier(dir_, "trace record --dataset rte --shared-data /nonexistent/data --out " +
                               (dir_ / "t.kvt").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent/data/rte does not exist"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks rte --shared-data /nonexistent/data --out " +
                          (dir_ / "r.sqlite").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent/data/rte does not exist"), std::string::npos) << r.err;
}

TEST_F(RecordEvalCliTest, BadFlagValuesExitTwo) {
  auto r = RunKvtier(dir_, "eval --retentions 0.5,1.5 --out " + (dir_ / "r.sqlite").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--retentions"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --selectors itf,magic --out " + (dir_ / "r.sqlite").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown selector 'magic'"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks piqa");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--out is required"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "trace record --dataset piqa");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--out is required"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "trace record --dataset piqa --out x.kvt --model /nonexistent.gguf");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent.gguf"), std::string::npos) << r.err;
}

// Regression (issue 18's class): each eval thread holds a model workspace; --threads 100000
// took 15 GB and never finished.
TEST_F(RecordEvalCliTest, ThreadsOfOneHundredThousandExitTwoBeforeAnyWork) {
  const auto r = RunKvtier(dir_, "eval --threads 100000 --out " + (dir_ / "t.sqlite").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--threads 100000: at most "), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "t.sqlite"));
}

TEST_F(RecordEvalCliTest, BadDecodeFlagsExitTwoBeforeAnyWork) {
  const std::string out = " --out " + (dir_ / "d.sqlite").string();
  auto r = RunKvtier(dir_, "eval --tasks texts --bits 1,3" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--bits: bad value '3'"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks decode --residual 48" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("residual length 48"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks niah --niah-depths 0.5,1.5" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--niah-depths"), std::string::npos) << r.err;
  r = RunKvtier(dir_, "eval --tasks greedy --ks 0" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--ks"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "d.sqlite")) << "nothing written on bad input";
}

// Regression (issue 18's class): a multiple-choice flag with only decode tasks named was
// ignored without a word (`--tasks texts --retentions 0.5` ran the texts alone).
TEST_F(RecordEvalCliTest, AMultipleChoiceFlagWithOnlyDecodeTasksExitsTwoNamingTheFlag) {
  const std::string out = " --out " + (dir_ / "m.sqlite").string();
  for (const char* args : {"--tasks texts --retentions 0.5", "--tasks decode --selectors itf",
                           "--tasks niah,greedy --shots 1", "--tasks texts --probe-heads 1",
                           "--tasks greedy --shared-data /tmp"}) {
    const auto r = RunKvtier(dir_, std::string("eval ") + args + out);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("applies to the multiple-choice tasks"), std::string::npos)
        << args << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "m.sqlite")) << "nothing written on bad input";
  // With a multiple-choice task named the flag is used (the run goes on to the model).
  const auto r = RunKvtier(dir_, "eval --tasks copa,texts --retentions 0.5 --model "
                                 "/nonexistent.gguf" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent.gguf"), std::string::npos) << r.err;
}

// Regression (issue 18's class): a missing or malformed --model left an empty results file
// behind (the file was created before the model was opened).
TEST_F(RecordEvalCliTest, AMissingOrMalformedModelCreatesNoResultsFile) {
  const fs::path out = dir_ / "r.sqlite";
  const fs::path junk = dir_ / "junk.gguf";
  { std::ofstream(junk) << "not a GGUF file at all"; }
  for (const std::string& model : {std::string("/nonexistent.gguf"), junk.string()}) {
    const auto r = RunKvtier(dir_, "eval --tasks copa --model " + model + " --out " + out.string());
    EXPECT_EQ(r.code, 2) << model << ": " << r.err;
    EXPECT_NE(r.err.find(model), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out)) << model << ": nothing written on bad input";
  }
}

// Regression (probing, 2026-12-02): a FIFO among the decode texts blocked eval for ever (each
// text is read twice: hashed, then tokenized).
TEST_F(RecordEvalCliTest, AFifoAmongTheDecodeTextsExitsTwoNamingIt) {
  const fs::path data = dir_ / "data";
  fs::create_directories(data / "texts");
  { std::ofstream(data / "texts" / "a.txt") << "A text of a few words.\n"; }
  const fs::path fifo = data / "texts" / "b.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path out = dir_ / "r.sqlite";
  const auto r = RunKvtier(dir_, "eval --tasks texts --data-dir " + data.string() + " --out " +
                                     out.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(fifo.string() + ": decode text must be a regular file, not a FIFO"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
}

// Regression (probing, 2026-12-02): a decode text too short for --ppl-context was found only
// after the multiple-choice tasks had been evaluated (hours with --items 0), and left a run
// 'running' in the results file; and `--tasks texts` on a model with one KV head failed on the
// default --probe-heads 2, which only the multiple-choice tasks use. The decode samples are
// built before the run begins, and a command failing before then leaves no results file.
TEST_F(RecordEvalCliTest, ADecodeTextTooShortIsFoundBeforeTheRunBegins) {
  const fs::path model = dir_ / "tiny.gguf";
  testing::TinySpec spec;
  spec.n_kv_heads = 1;
  testing::WriteTinyLlama(model.string(), spec);
  const fs::path data = dir_ / "data";
  fs::create_directories(data / "texts");
  { std::ofstream(data / "texts" / "a.txt") << "hello world, hello world.\n"; }
  const fs::path out = dir_ / "r.sqlite";
  const auto r = RunKvtier(dir_, "eval --tasks texts --ppl-context 16 --ppl-tokens 8 --model " +
                                     model.string() + " --data-dir " + data.string() +
                                     " --out " + out.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("a.txt: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens, the texts task needs 25"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out)) << "no run begun, no results file left";
}

// A results file whose accuracy table predates the decode selectors cannot take decode rows
// (SQLite cannot change a CHECK): such a file has no schema version, so it is refused as an
// older kvtier's file, a clear error before the model is loaded.
TEST_F(RecordEvalCliTest, DecodeRowsNeedAFileWithTheDecodeSelectors) {
  const fs::path db = dir_ / "old.sqlite";
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h,
                         "CREATE TABLE accuracy (run_id INTEGER NOT NULL, task TEXT NOT NULL, "
                         "selector TEXT NOT NULL CHECK (selector IN ('full', 'itf')), alpha REAL, "
                         "retention REAL NOT NULL, items INTEGER NOT NULL, correct INTEGER NOT "
                         "NULL, accuracy REAL NOT NULL, first_token_agreement REAL NOT NULL, "
                         "mean_kept_fraction REAL NOT NULL, itf_fallback_rate REAL)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  const fs::path model = dir_ / "tiny.gguf";  // any readable GGUF: the file is refused first
  testing::WriteTinyLlama(model.string(), testing::TinySpec{});
  const auto r = RunKvtier(dir_, "eval --tasks texts --model " + model.string() + " --out " +
                                     db.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("results database written by an older kvtier"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace kvtier
