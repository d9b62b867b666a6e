// `kvtier hw` end to end on a tiny generated trace: runs land in the results database with
// mode = 'hw', the measured requests are all ok, and the environment rows are there.

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/hw/hw_cli_util.h"
#include "tests/hw/hw_test_util.h"
#include "tests/testutil/run_command.h"
#include "tests/testutil/sqlite_scalar.h"

namespace kvtier::hw {
namespace {

std::string Kvtier() { return KVTIER_CLI; }  // set by tests/hw/executor.cmake

using kvtier::testing::RunCmd;
using kvtier::testing::Scalar;

TEST(KvtierHw, RunsSystemsIntoTheResultsDatabase) {
  testing::ScratchDir dir;
  const std::string d = dir.path();
  std::string out;
  ASSERT_EQ(testing::GenTinySmollmTrace(Kvtier(), d, 6, &out), 0) << out;
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

// A tiny smollm2-shaped trace and an experiment running `as` on the host backend.
std::string MakeExperiment(const std::string& d, const std::string& extra) {
  std::string out;
  EXPECT_EQ(testing::GenTinySmollmTrace(Kvtier(), d, 6, &out), 0) << out;
  std::ofstream(d + "/exp.ini")
      << "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\nsystem = as\n"
         "[experiment]\nname = hw-fail\n[workload]\ntrace = t.trace\n"
         "[cache]\ngpu_capacity = 1MiB\ncpu_capacity = 1MiB\n"
         "[hw]\nbackend = host\nmax_memory = 256MiB\n"
      << extra;
  return d + "/exp.ini";
}

std::string Text(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
  std::string v = "<no row>";
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr) {
    v = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  return v;
}

// The failed run as the database shows it: incomplete, status 'failed', the error, the failed
// transfer logged as failed, and no row in the views.
void ExpectFailedRun(const std::string& path, const std::vector<std::string>& error_parts) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM runs"), 1);
  EXPECT_EQ(Scalar(db, "SELECT complete FROM runs"), 0);
  EXPECT_EQ(Text(db, "SELECT status FROM runs"), "failed");
  const std::string error = Text(db, "SELECT error FROM runs");
  for (const std::string& part : error_parts) {
    EXPECT_NE(error.find(part), std::string::npos) << error;
  }
  EXPECT_GE(Scalar(db, "SELECT COUNT(*) FROM transfers WHERE status = 'failed'"), 1);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM transfers WHERE status = 'aborted' AND bytes > 0"), 0);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM run_summary"), 0);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM measured_requests"), 0);
  sqlite3_close(db);
}

// Issue 12, reproduction 1: a store far too small. 4 KiB cannot hold one 24 KiB chunk of
// smollm2-135m: bad input, said before the run (exit 2, no run row).
TEST(KvtierHwFailure, AStoreTooSmallForOneChunkIsBadInput) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "");
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() +
                       "/r.sqlite --hw.store_capacity=4KiB",
                   &out),
            2)
      << out;
  for (const char* part : {"hw.store_capacity = 4096 B", "cannot hold one chunk", "24576 B"}) {
    EXPECT_NE(out.find(part), std::string::npos) << out;
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/r.sqlite").c_str(), &db), SQLITE_OK);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM runs"), 0);
  sqlite3_close(db);
}

// hw writes the SSD from one write lane: any other ssd.write_lanes is bad input naming the key
// (the simulator's default, 1, is what hw does; validate would compare unlike runs otherwise).
TEST(KvtierHwFailure, WriteLanesOtherThanOneIsBadInput) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "");
  for (const char* lanes : {"0", "4"}) {
    std::string out;
    EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() +
                         "/r.sqlite --ssd.write_lanes=" + lanes,
                     &out),
              2)
        << out;
    EXPECT_NE(out.find("ssd.write_lanes"), std::string::npos) << out;
    EXPECT_NE(out.find("one write lane"), std::string::npos) << out;
  }
}

// A store that holds a few chunks but not the run: the write that does not fit fails (naming
// the chunk and the capacity), the run stops, is recorded as failed, and kvtier exits 3.
TEST(KvtierHwFailure, AStoreThatFillsUpFailsTheRun) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "");
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() +
                       "/r.sqlite --hw.store_capacity=512KiB",
                   &out),
            3)
      << out;
  for (const char* part : {"run failed", "OutOfSpace", "capacity 524288", "ssd_write (store"}) {
    EXPECT_NE(out.find(part), std::string::npos) << out;
  }
  ExpectFailedRun(dir.path() + "/r.sqlite", {"OutOfSpace", "ssd_write (store, request 0)",
                                             "capacity 524288", "chunk 0x"});
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/r.sqlite").c_str(), &db), SQLITE_OK);
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM transfers WHERE status = 'failed' AND "
                       "kind = 'ssd_write'"), 1);
  sqlite3_close(db);
}

// Issue 12, reproduction 2: the chunk store's data file is corrupted between two runs on a
// persistent hw.store_dir. The second run never serves the corrupted bytes: reopening the store
// reads every chunk back against its CRC-32C, drops the ones that fail (saying so, and counting
// them in hw.store_dropped_chunks), and prewarm stores them again before the clock starts.
TEST(KvtierHwFailure, ACorruptedStoreIsDroppedOnReopenNeverServed) {
  testing::ScratchDir dir;
  const std::string store = dir.path() + "/store";
  const std::string exp = MakeExperiment(
      dir.path(), "store_dir = " + store + "\nstore_capacity = 64MiB\nverify = true\n"
                  "[run]\nprewarm = true\n");
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() + "/first.sqlite",
                   &out),
            0)
      << out;
  {
    // Corrupt bytes 64-127 of every 4 KiB block: every chunk's content, never its header.
    const std::string data = store + "/chunks.dat";
    std::FILE* f = std::fopen(data.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    const std::string junk(64, '\xA5');
    for (long off = 0; off + 4096 <= size; off += 4096) {
      std::fseek(f, off + 64, SEEK_SET);
      ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
    }
    std::fclose(f);
  }
  out.clear();
  EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() + "/second.sqlite",
                   &out),
            0)
      << out;
  for (const char* part : {"chunk(s) whose bytes did not read back intact, e.g. IoError: chunk 0x",
                           ": checksum mismatch: CRC-32C 0x"}) {
    EXPECT_NE(out.find(part), std::string::npos) << out;
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/second.sqlite").c_str(), &db), SQLITE_OK);
  const double dropped =
      Scalar(db, "SELECT value FROM metrics WHERE name = 'hw.store_dropped_chunks'");
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(Scalar(db, "SELECT value FROM metrics WHERE name = 'hw.chunks_written'"), dropped);
  EXPECT_EQ(Text(db, "SELECT status FROM runs"), "ok");
  EXPECT_EQ(Scalar(db, "SELECT COUNT(*) FROM requests WHERE status != 'ok'"), 0);
  EXPECT_GT(Scalar(db, "SELECT value FROM metrics WHERE name = 'hw.chunks_verified'"), 0);
  sqlite3_close(db);
}

// hw.verify failures fail the run (issue 12): a chunk torn under the store's feet (a write the
// device acknowledged but did not finish, injected) is read with verify on: the content check
// names the first wrong byte, exit 3.
TEST(KvtierHwFailure, VerifyFailsARunThatReadsATornChunk) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "verify = true\n");
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() +
                       "/r.sqlite --hw.fault_injection=torn_write_silent@*",
                   &out),
            3)
      << out;
  for (const char* part : {"run failed", "content check failed at byte ", "ssd_read ("}) {
    EXPECT_NE(out.find(part), std::string::npos) << out;
  }
  ExpectFailedRun(dir.path() + "/r.sqlite",
                  {"IoError: ssd_read (", "content check failed at byte ", "chunk 0x"});
}

// `kvtier validate` fails when its hw run fails, and compares nothing.
TEST(KvtierHwFailure, ValidateFailsWhenItsHwRunFails) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "");
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " validate --config " + exp + " --out " + dir.path() +
                       "/r.sqlite --hw.store_capacity=512KiB",
                   &out),
            3)
      << out;
  EXPECT_NE(out.find("did not complete; nothing is compared"), std::string::npos) << out;
  ExpectFailedRun(dir.path() + "/r.sqlite", {"OutOfSpace"});  // and no sim run
}

// `kvtier validate` runs each preset's hw runs --repeats times against one sim run, names the
// io-bound runs apart (the views pair sim and hw runs by experiment), reports every run with
// its load average, and --check turns a missed target into exit 4. Bad flags exit 2.
TEST(KvtierValidate, PresetsRepeatsAndTheCheck) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "");
  const std::string db = dir.path() + "/v.sqlite";
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " validate --config " + exp + " --out " + db +
                       " --repeats 2 --quiet",
                   &out),
            0)
      << out;
  for (const char* part : {"=== preset compute-bound ===", "=== preset io-bound, gpu.flops = "
                           "312TFLOP/s, gpu.efficiency = 0.6, gpu.mem_bw = 2TB/s ===",
                           "per run: median / p90 (load avg)", "ssd_read", "targets (systems",
                           "driving thread: the profile's cost per op", "hw us/op [each run]"}) {
    EXPECT_NE(out.find(part), std::string::npos) << part << "\n" << out;
  }
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  const std::string count = "SELECT COUNT(*) FROM runs WHERE complete = 1 AND ";
  EXPECT_EQ(Text(h, count + "mode = 'hw' AND experiment = 'hw-fail'"), "2");
  EXPECT_EQ(Text(h, count + "mode = 'hw' AND experiment = 'hw-fail-io-bound'"), "2");
  EXPECT_EQ(Text(h, count + "mode = 'sim' AND experiment = 'hw-fail'"), "1");
  EXPECT_EQ(Text(h, count + "mode = 'sim' AND experiment = 'hw-fail-io-bound'"), "1");
  EXPECT_EQ(Text(h, count + "experiment = 'hw-fail-io-bound' AND config LIKE "
                            "'%gpu.efficiency = 0.6%'"),
            "3");
  // Each hw run pairs with its preset's sim run only.
  EXPECT_EQ(Text(h, "SELECT COUNT(DISTINCT hw_run_id) FROM sim_vs_hw WHERE experiment = "
                    "'hw-fail-io-bound'"),
            "2");
  sqlite3_close(h);

  out.clear();
  const int code = RunCmd(Kvtier() + " validate --config " + exp + " --out " + dir.path() +
                              "/c.sqlite --preset io-bound --repeats 1 --check --quiet",
                          &out);
  const bool met = out.find("within 25%: met") != std::string::npos;
  EXPECT_EQ(code, met ? 0 : 4) << out;
  EXPECT_EQ(out.find("=== preset compute-bound"), std::string::npos) << out;

  for (const char* bad : {" --preset fast", " --repeats 0", " --repeats x"}) {
    out.clear();
    EXPECT_EQ(RunCmd(Kvtier() + " validate --config " + exp + " --out " + dir.path() +
                         "/b.sqlite" + bad,
                     &out),
              2)
        << bad << "\n" << out;
  }
}

// --- Reliability regressions (issue 18) ---

// A smollm2 trace of `requests` requests and an experiment running `as` on the host backend
// (a 64 MiB store).
std::string MakeLongExperiment(const std::string& d, int requests) {
  std::string out;
  EXPECT_EQ(testing::GenTinySmollmTrace(Kvtier(), d, requests, &out), 0) << out;
  std::ofstream(d + "/exp.ini")
      << "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\nsystem = as\n"
         "[experiment]\nname = hw-test\n[workload]\ntrace = t.trace\n"
         "[cache]\ngpu_capacity = 4MiB\ncpu_capacity = 16MiB\n"
         "[hw]\nbackend = host\nmax_memory = 256MiB\nstore_capacity = 64MiB\n";
  return d + "/exp.ini";
}

TEST(KvtierHw, StoreDirThatCannotHoldAStoreExitsTwo) {
  testing::ScratchDir dir;
  const std::string d = dir.path();
  const std::string exp = MakeLongExperiment(d, 2);
  std::ofstream(d + "/plain") << "a regular file\n";
  for (const std::string& bad :
       {std::string("/proc/kvtier-store"), d + "/plain", std::string("/proc")}) {
    std::string out;
    EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + d + "/r.sqlite " +
                         "--hw.store_dir=" + bad,
                     &out),
              2)
        << bad << ": " << out;
    EXPECT_NE(out.find("command line: hw.store_dir"), std::string::npos) << out;
    EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
  }
}

// Starts `kvtier hw` on `exp` (in its own process group) and waits until its chunk store
// exists and its run has committed requests.
pid_t StartHw(const std::string& exp, const std::string& db) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execl(KVTIER_CLI, KVTIER_CLI, "hw", "--config", exp.c_str(), "--out", db.c_str(),
            static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 1200; ++i) {
    ::usleep(50000);
    sqlite3* h = nullptr;
    double n = -1;
    if (std::filesystem::exists(db + ".store-as") &&
        sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      n = Scalar(h, "SELECT COUNT(*) FROM requests");
    }
    sqlite3_close(h);
    if (n > 0) break;
  }
  return pid;
}

TEST(KvtierHw, SigtermRemovesTheChunkStoreAndLeavesTheRunIncomplete) {
  testing::ScratchDir dir;
  const std::string d = dir.path(), db = d + "/r.sqlite";
  const pid_t pid = StartHw(MakeLongExperiment(d, 3000), db);
  ASSERT_TRUE(std::filesystem::exists(db + ".store-as")) << "the run never started";
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_FALSE(std::filesystem::exists(db + ".store-as")) << "the 64 MiB store was left behind";
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM runs WHERE complete = 0"), 1);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM run_summary"), 0);
  sqlite3_close(h);
}

TEST(KvtierHw, ChunkStoreOfASigkilledRunIsRemovedByTheNextRun) {
  testing::ScratchDir dir;
  const std::string d = dir.path(), db = d + "/r.sqlite";
  const std::string exp = MakeLongExperiment(d, 3000);
  const pid_t pid = StartHw(exp, db);
  ASSERT_TRUE(std::filesystem::exists(db + ".store-as")) << "the run never started";
  ::kill(-pid, SIGKILL);  // parent and child at once: nothing can clean up
  ::waitpid(pid, nullptr, 0);
  ::usleep(200000);  // the child, reparented, is reaped by init
  ASSERT_TRUE(std::filesystem::exists(db + ".store-as/kvtier-owner"));
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + db +
                       " --systems recomp --run.max_requests=2",
                   &out),
            0)
      << out;
  EXPECT_NE(out.find("removed " + db + ".store-as, the chunk store of a killed run"),
            std::string::npos)
      << out;
  EXPECT_FALSE(std::filesystem::exists(db + ".store-as"));
  EXPECT_FALSE(std::filesystem::exists(db + ".store-recomp"));
}

// --- Fault injection (issue 18; docs/reliability.md "Fault injection") ---

// One injected fault per run, through `--hw.fault_injection`: kvtier hw exits 3, says "run
// failed" naming the operation, the chunk and the errno or CUDA text, and the database shows a
// failed run (status 'failed', the error, the failed transfer) with the injection recorded in
// its config and metrics.
struct CliFault {
  const char* spec;
  const char* kind;  // metric fault.<kind>.injected
  std::vector<const char*> parts;
  friend void PrintTo(const CliFault& f, std::ostream* os) { *os << f.spec; }
};

class KvtierHwFault : public ::testing::TestWithParam<CliFault> {};

TEST_P(KvtierHwFault, IsAFailedRunExitThreeNamingTheChunk) {
  const CliFault& f = GetParam();
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "");
  const std::string db = dir.path() + "/r.sqlite";
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + db +
                       " --hw.fault_injection=" + f.spec,
                   &out),
            3)
      << out;
  EXPECT_NE(out.find(std::string("fault injection on (hw.fault_injection = ") + f.spec + ")"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("kvtier hw (as): run failed: system as, run 1: "), std::string::npos) << out;
  std::vector<std::string> parts(f.parts.begin(), f.parts.end());
  parts.push_back("chunk 0x");
  for (const std::string& part : parts) EXPECT_NE(out.find(part), std::string::npos) << out;
  ExpectFailedRun(db, parts);
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  const double injected =
      Scalar(h, std::string("SELECT value FROM metrics WHERE name = 'fault.") + f.kind +
                    ".injected'");
  if (std::string(f.spec).find("@*") == std::string::npos) {
    EXPECT_EQ(injected, 1);
  } else {
    EXPECT_GE(injected, 1);
  }
  EXPECT_EQ(Scalar(h, std::string("SELECT COUNT(*) FROM runs WHERE config LIKE "
                                  "'%hw.fault_injection = ") + f.spec + "%'"),
            1);
  sqlite3_close(h);
}

INSTANTIATE_TEST_SUITE_P(
    Injected, KvtierHwFault,
    ::testing::Values(
        CliFault{"read_eio@2", "read_eio", {"IoError: ssd_read (", "Input/output error (errno 5)"}},
        CliFault{"short_read@2", "short_read", {"IoError: ssd_read (", ": short read "}},
        CliFault{"write_enospc@1", "write_enospc",
                 {"ssd_write (store, request 0)", "OutOfSpace: ", "No space left on device"}},
        CliFault{"write_eio@3", "write_eio",
                 {"ssd_write (store, request 0)", "IoError: ", "Input/output error (errno 5)"}},
        CliFault{"torn_write@2", "torn_write",
                 {"ssd_write (store, request 0)", "bytes at offset ", "Input/output error"}},
        CliFault{"torn_write_silent@*", "torn_write_silent",
                 {"IoError: ssd_read (", ": checksum mismatch: CRC-32C 0x"}},
        CliFault{"device_h2d@1", "device_h2d",
                 {"CudaError: h2d (", "injected device_h2d: "}}),
    [](const ::testing::TestParamInfo<CliFault>& info) {
      std::string name;
      bool up = true;
      for (const char* c = info.param.kind; *c; ++c) {
        if (*c == '_') {
          up = true;
          continue;
        }
        name += up ? char(std::toupper(*c)) : *c;
        up = false;
      }
      return name;
    });

// Slow I/O is not a failure: every read is held 20 ms and the run completes, each SSD read
// lasting at least that long.
TEST(KvtierHwFaultSlowIo, SlowReadsCompleteAndTheRunSucceeds) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "verify = true\n");
  const std::string db = dir.path() + "/r.sqlite";
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + db +
                       " --hw.fault_injection=slow_read@*=20ms",
                   &out),
            0)
      << out;
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  EXPECT_EQ(Text(h, "SELECT status FROM runs"), "ok");
  EXPECT_EQ(Scalar(h, "SELECT complete FROM runs"), 1);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM requests WHERE status != 'ok'"), 0);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM transfers WHERE status != 'ok'"), 0);
  const double reads = Scalar(h, "SELECT value FROM metrics WHERE name = 'hw.ssd_reads'");
  EXPECT_GT(reads, 0);
  EXPECT_EQ(Scalar(h, "SELECT value FROM metrics WHERE name = 'fault.slow_read.injected'"), reads);
  EXPECT_EQ(Scalar(h, "SELECT value FROM metrics WHERE name = 'fault.events.read'"), reads);
  EXPECT_GT(Scalar(h, "SELECT value FROM metrics WHERE name = 'hw.crc_checked'"), 0);
  EXPECT_GE(Scalar(h, "SELECT MIN(end_s - start_s) FROM transfers WHERE kind = 'ssd_read'"),
            0.020 - 1e-6);
  sqlite3_close(h);
}

// A run killed in the middle of a chunk write (prewarm's 5th), on a persistent store: the run
// stays incomplete ('running', as any killed run), and the next run reopens the store, finds
// no record of the torn chunk, stores it again and completes with every chunk verified.
TEST(KvtierHwFaultTornWrite, AKilledWriteIsNeverAcceptedByTheNextRun) {
  testing::ScratchDir dir;
  const std::string store = dir.path() + "/store";
  const std::string exp = MakeExperiment(
      dir.path(), "store_dir = " + store + "\nstore_capacity = 64MiB\nverify = true\n"
                  "[run]\nprewarm = true\n");
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() +
                       "/killed.sqlite --hw.fault_injection=torn_write_kill@5",
                   &out),
            128 + SIGKILL)
      << out;
  EXPECT_NE(out.find("fault injection: torn_write_kill: chunk 0x"), std::string::npos) << out;
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/killed.sqlite").c_str(), &h), SQLITE_OK);
  EXPECT_EQ(Text(h, "SELECT status FROM runs"), "running");
  EXPECT_EQ(Scalar(h, "SELECT complete FROM runs"), 0);
  sqlite3_close(h);
  out.clear();
  ASSERT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() + "/next.sqlite",
                   &out),
            0)
      << out;
  EXPECT_EQ(out.find("dropped"), std::string::npos) << out;  // no record pointed at the tear
  ASSERT_EQ(sqlite3_open((dir.path() + "/next.sqlite").c_str(), &h), SQLITE_OK);
  EXPECT_EQ(Text(h, "SELECT status FROM runs"), "ok");
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM requests WHERE status != 'ok'"), 0);
  EXPECT_GT(Scalar(h, "SELECT value FROM metrics WHERE name = 'hw.chunks_verified'"), 0);
  EXPECT_GT(Scalar(h, "SELECT value FROM metrics WHERE name = 'hw.crc_checked'"), 0);
  EXPECT_EQ(Scalar(h, "SELECT value FROM metrics WHERE name = 'hw.store_dropped_chunks'"), 0);
  sqlite3_close(h);
}

// A torn write the device acknowledged (prewarm's 3rd chunk) leaves a record pointing at
// half-written bytes. Whatever the first run read, the next run's reopen reads the chunk back,
// drops it on its checksum, says so, stores it again and completes.
TEST(KvtierHwFaultTornWrite, AnAcknowledgedTearIsDroppedWhenTheStoreIsReopened) {
  testing::ScratchDir dir;
  const std::string store = dir.path() + "/store";
  const std::string exp = MakeExperiment(
      dir.path(), "store_dir = " + store + "\nstore_capacity = 64MiB\nverify = true\n"
                  "[run]\nprewarm = true\n");
  std::string out;
  const int first = RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() +
                               "/first.sqlite --hw.fault_injection=torn_write_silent@3",
                           &out);
  // It fails if it read the torn chunk (never silently), and succeeds if it did not.
  if (first != 0) {
    EXPECT_EQ(first, 3) << out;
    EXPECT_NE(out.find("content check failed"), std::string::npos) << out;
  }
  out.clear();
  ASSERT_EQ(RunCmd(Kvtier() + " hw --config " + exp + " --out " + dir.path() + "/next.sqlite",
                   &out),
            0)
      << out;
  EXPECT_NE(out.find("dropped 1 chunk(s) whose bytes did not read back intact, e.g. IoError: "
                     "chunk 0x"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("checksum mismatch"), std::string::npos) << out;
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/next.sqlite").c_str(), &h), SQLITE_OK);
  EXPECT_EQ(Text(h, "SELECT status FROM runs"), "ok");
  EXPECT_EQ(Scalar(h, "SELECT value FROM metrics WHERE name = 'hw.store_dropped_chunks'"), 1);
  EXPECT_EQ(Scalar(h, "SELECT COUNT(*) FROM requests WHERE status != 'ok'"), 0);
  sqlite3_close(h);
}

// A bad plan is bad input: exit 2 naming the key, from `config --check` as from a run.
TEST(KvtierHwFaultPlan, ABadPlanIsRejectedByTheCheckAndTheRun) {
  testing::ScratchDir dir;
  const std::string exp = MakeExperiment(dir.path(), "fault_injection = read_eio@0\n");
  for (const std::string& cmd : {" config --check --config " + exp,
                                " hw --config " + exp + " --out " + dir.path() + "/r.sqlite"}) {
    std::string out;
    EXPECT_EQ(RunCmd(Kvtier() + cmd, &out), 2) << cmd << "\n" << out;
    EXPECT_NE(out.find("exp.ini:15: hw.fault_injection: 'read_eio@0': events are counted from 1"),
              std::string::npos)
        << out;
  }
}

}  // namespace
}  // namespace kvtier::hw
