// `kvtier hw` with decode systems end to end (issue 17's hw half): a small smollm2-shaped decode
// trace through specache and offload_all at decode.max_batch = 1 on the host backend fills the
// decode tables as `kvtier sim` does, its decode transfers move rows of the decode home, and
// `kvtier validate` reports the per-request TPOT error; a configuration asking hw for a larger
// batch is bad input (exit 2, naming the key).

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/hw/hw_cli_util.h"
#include "tests/hw/hw_test_util.h"
#include "tests/testutil/run_command.h"
#include "tests/testutil/sqlite_scalar.h"

namespace kvtier::hw {
namespace {

std::string Kvtier() { return KVTIER_CLI; }  // set by tests/hw/executor.cmake

using kvtier::testing::RunCmd;
using kvtier::testing::Scalar;

// 5 requests of ~8 output tokens (1 warm-up), and an experiment running `systems` on the host
// backend with `extra` appended. A100 profile: the decode steps take milliseconds.
std::string MakeDecodeExperiment(const std::string& d, const std::string& systems,
                                 const std::string& extra) {
  std::string out;
  EXPECT_EQ(testing::GenTinySmollmTrace(Kvtier(), d, 5, &out,
                                        "--output_tokens 8 --output_tokens_sd 2"),
            0)
      << out;
  std::ofstream(d + "/exp.ini")
      << "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\nsystem = specache\n"
         "[experiment]\nname = hw-decode\nsystems = "
      << systems
      << "\n[workload]\ntrace = t.trace\n[run]\nwarmup_requests = 1\n"
         "[hw]\nbackend = host\nmax_memory = 256MiB\n"
      << extra;
  return d + "/exp.ini";
}

TEST(KvtierHwDecode, DecodesOneRequestAtATimeIntoTheDecodeTables) {
  testing::ScratchDir dir;
  const std::string exp =
      MakeDecodeExperiment(dir.path(), "specache,offload_all", "[decode]\nmax_batch = 1\n");
  const std::string db = dir.path() + "/r.sqlite";
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + db, &out), 0) << out;
  EXPECT_NE(out.find("mean TPOT"), std::string::npos) << out;
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM runs WHERE mode = 'hw' AND complete = 1"), 2);
  // Every request decodes (the warm-up too), one at a time.
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM decode_requests"), 10);
  EXPECT_EQ(Scalar(h, "SELECT MAX(batch) FROM decode_steps"), 1);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM decode_requests WHERE tpot_s <= 0"), 0);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM decode_throughput"), 2);
  // specache prefetches its top-k rows out of the decode home (staged_gather: a CPU gather,
  // then the H2D); offload_all streams every layer; both offload the new KV.
  const std::string of = "SELECT COUNT(*) FROM transfers t JOIN runs r USING (run_id) WHERE ";
  EXPECT_GT(Scalar(h, of + "r.system = 'specache' AND t.kind = 'cpu_gather' AND "
                           "t.purpose = 'decode_prefetch'"),
            0);
  EXPECT_GT(Scalar(h, of + "r.system = 'offload_all' AND t.kind = 'h2d' AND "
                           "t.purpose = 'decode_fetch'"),
            0);
  EXPECT_GT(Scalar(h, of + "t.kind = 'd2h' AND t.purpose = 'decode_offload'"), 0);
  EXPECT_EQ(Scalar(h, of + "t.status != 'ok'"), 0);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM metrics WHERE name = 'hw.decode_home_tokens' AND "
                      "value >= 1000"),
            2);
  EXPECT_EQ(Scalar(h, "SELECT SUM(value) FROM metrics WHERE name = 'hw.decode_home_wraps'"), 0);
  EXPECT_GT(Scalar(h, "SELECT SUM(value) FROM metrics WHERE name = 'hw.bytes_gathered'"), 0);
  sqlite3_close(h);

  // validate pairs each measured decode request of hw with the simulator's (no bound on the
  // error here: this machine's timing is not the test's to judge).
  out.clear();
  const std::string v = dir.path() + "/v.sqlite";
  ASSERT_EQ(RunCmd(Kvtier() + " validate --config " + exp + " --out " + v +
                       " --systems specache --preset compute-bound --repeats 1 --quiet",
                   &out),
            0)
      << out;
  EXPECT_NE(out.find("per-request TPOT error"), std::string::npos) << out;
  ASSERT_EQ(sqlite3_open(v.c_str(), &h), SQLITE_OK);
  const std::string paired =
      "SELECT COUNT(*) FROM decode_requests dh JOIN runs h ON h.run_id = dh.run_id AND "
      "h.mode = 'hw' JOIN runs s ON s.mode = 'sim' AND s.system = h.system JOIN decode_requests "
      "ds ON ds.run_id = s.run_id AND ds.request_id = dh.request_id WHERE dh.warmup = 0 AND "
      "h.system = 'specache'";
  EXPECT_EQ(Scalar(h, paired), 4);
  EXPECT_EQ(Scalar(h, paired + " AND (dh.tpot_s <= 0 OR ds.tpot_s <= 0)"), 0);
  sqlite3_close(h);
}

TEST(KvtierHwDecode, ABatchLargerThanOneIsBadInput) {
  testing::ScratchDir dir;
  for (const std::string extra : {"", "[decode]\nmax_batch = 4\n"}) {
    const std::string exp = MakeDecodeExperiment(dir.path(), "specache", extra);
    std::string out;
    EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() + "/b.sqlite", &out),
              2)
        << out;
    EXPECT_NE(out.find("decode.max_batch"), std::string::npos) << out;
    EXPECT_NE(out.find("one request at a time"), std::string::npos) << out;
  }
  // The key from the command line too, and validate refuses it the same way.
  const std::string exp = MakeDecodeExperiment(dir.path(), "specache", "");
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " validate --config " + exp + " --out " + dir.path() +
                       "/v.sqlite --repeats 1 --preset compute-bound --quiet",
                   &out),
            2)
      << out;
  EXPECT_NE(out.find("decode.max_batch"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() +
                       "/c.sqlite --decode.max_batch=1 --hw.max_memory=256MiB",
                   &out),
            0)
      << out;
}

}  // namespace
}  // namespace kvtier::hw
