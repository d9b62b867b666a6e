// `kvtier trace record` and `kvtier eval` bad input through the built binary: unknown datasets
// and tasks, data that may not be committed (RTE, OpenBookQA) missing, bad flag values. All are
// rejected before the model loads (exit 2, a message naming the problem), so no model is needed.

#include <gtest/gtest.h>

#include "tests/models/cli_run.h"

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

}  // namespace
}  // namespace kvtier
