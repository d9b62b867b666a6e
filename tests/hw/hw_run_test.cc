// `kvtier hw` end to end on a tiny generated trace: runs land in the results database with
// mode = 'hw', the measured requests are all ok, and the environment rows are there.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <fstream>

#include "tests/hw/hw_test_util.h"

namespace kvtier::hw {
namespace {

std::string Kvtier() { return KVTIER_CLI; }  // set by tests/hw/executor.cmake

int RunCmd(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) *out += buf;
  const int status = p ? ::pclose(p) : -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double Scalar(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
  double v = -1;
  if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_double(st, 0);
  sqlite3_finalize(st);
  return v;
}

TEST(KvtierHw, RunsSystemsIntoTheResultsDatabase) {
  testing::ScratchDir dir;
  const std::string d = dir.path();
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " trace gen --quiet --out " + d + "/t.trace --requests 6 --prompts 2 "
                "--tasks 1 --examples_min 1 --examples_max 2 --example_tokens 200 "
                "--example_tokens_sd 20 --rate 50 --model-name smollm2-135m --model-layers 30 "
                "--model-heads 9 --model-kv-heads 3 --vocab 49152 --calibration_tokens 256",
                &out), 0) << out;
  std::ofstream(d + "/exp.ini")
      << "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\nsystem = as\n"
         "[experiment]\nname = hw-test\nsystems = recomp,as\n[workload]\ntrace = t.trace\n"
         "[cache]\ngpu_capacity = 4MiB\ncpu_capacity = 16MiB\n[run]\nwarmup_requests = 1\n"
         "[hw]\nbackend = host\nverify = true\nmax_memory = 256MiB\n";
  out.clear();
  ASSERT_EQ(RunCmd(Kvtier() + " hw --config " + d + "/exp.ini --out " + d + "/r.sqlite", &out), 0)
      << out;
  EXPECT_NE(out.find("mean TTFT"), std::string::npos) << out;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((d + "/r.sqlite").c_str(), &db), SQLITE_OK);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM runs WHERE mode = 'hw' AND complete = 1"), 2);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM requests WHERE status != 'ok'"), 0);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM requests WHERE warmup = 1"), 2);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM metrics WHERE name = 'env.direct_io' AND value = 1"), 2);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM metrics WHERE name = 'env.backend.host'"), 2);
  EXPECT_GT(Scalar(db, "SELECT SUM(value) FROM metrics WHERE name = 'hw.chunks_read'"), 0);
  EXPECT_GT(Scalar(db, "SELECT COUNT(*) FROM transfers t JOIN runs r USING (run_id) "
                       "WHERE r.system = 'as' AND t.kind = 'ssd_read'"), 0);
  EXPECT_GE(Scalar(db, "SELECT MIN(io_stall_s) FROM requests"), 0);
  sqlite3_close(db);
}

}  // namespace
}  // namespace kvtier::hw
