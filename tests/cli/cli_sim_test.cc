// `kvtier sim` and `kvtier sweep` end to end through the built binary: a tiny generated trace,
// the comparison table, the results file, bad input (exit 2, message naming what is wrong),
// resumable sweeps, and a killed run leaving a consistent file marked incomplete.

#include <gtest/gtest.h>

#include "tests/cli/cli_fixture.h"
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

using Result = kvtier::testing::CliResult;
using kvtier::testing::SourceDir;

// One query's first column as text ("" if no row).
std::string Query(const fs::path& db, const std::string& sql) {
  sqlite3* h = nullptr;
  std::string out;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return out;
}

class SimCliTest : public kvtier::testing::CliFixture {
 protected:
  // A small few-shot trace for OPT-13B: short prefixes so a system runs in well under a second.
  std::string Trace(int requests = 12) {
    const std::string path = (dir_ / "t.kvt").string();
    Result r = Run("trace gen -o " + path + " --requests " + std::to_string(requests) +
                   " --rate 20 --prompts 4 --examples_min 2 --examples_max 3 --example_tokens 200 "
                   "--example_tokens_sd 20 --calibration_tokens 256 --quiet");
    EXPECT_EQ(r.code, 0) << r.err;
    return path;
  }

  std::string Experiment(const std::string& trace, const std::string& model = "opt-13b") {
    const std::string path = (dir_ / "e.ini").string();
    std::ofstream(path) << "[include]\nmodel = " << model
                        << "\nhardware = a100-pcie4-nvme\n[experiment]\nname = t\n"
                           "systems = as,spec\n[workload]\ntrace = "
                        << trace << "\n[run]\nwarmup_requests = 2\n";
    return path;
  }

};

TEST_F(SimCliTest, ComparesSystemsAndWritesCompleteRuns) {
  const std::string e = Experiment(Trace());
  const fs::path db = dir_ / "r.sqlite";
  Result r = Run("sim --config " + e + " --out " + db.string() + " -j 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("mean TTFT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nspec "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nas "), std::string::npos) << r.out;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 1 AND status = 'ok'"), "2");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM run_summary"), "2");
  EXPECT_EQ(Query(db, "SELECT requests FROM run_summary WHERE system = 'spec'"), "10");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM requests WHERE warmup = 1 AND run_id = 1"), "2");
  EXPECT_NE(Query(db, "SELECT config FROM runs WHERE system = 'spec'").find("select.policy = itf"),
            std::string::npos);
}

TEST_F(SimCliTest, ASecondRunReusesTheSelectionsAndDecidesTheSame) {
  const std::string e = Experiment(Trace());
  const fs::path a = dir_ / "a.sqlite", b = dir_ / "b.sqlite";
  ASSERT_EQ(Run("sim --config " + e + " --out " + a.string() + " --systems spec").code, 0);
  Result r = Run("sim --config " + e + " --out " + b.string() + " --systems spec");
  ASSERT_EQ(r.code, 0) << r.err;
  auto metric = [](const fs::path& db, const std::string& name) {
    return Query(db, "SELECT CAST(value AS INTEGER) FROM metrics WHERE name = '" + name + "'");
  };
  EXPECT_EQ(metric(a, "selection_memo_reused_layers"), "0");
  EXPECT_NE(metric(a, "selection_memo_computed_layers"), "0");
  EXPECT_EQ(metric(b, "selection_memo_reused_layers"), metric(a, "selection_memo_computed_layers"));
  EXPECT_EQ(metric(b, "selection_memo_computed_layers"), "0");
  // Same decisions, same simulated times.
  const std::string rows =
      "SELECT group_concat(r, ';') FROM (SELECT printf('%d %d %.17g %.17g %d', request_id, "
      "layer, itf_similarity, end_s, selected_tokens) AS r FROM layers "
      "ORDER BY request_id, layer)";
  EXPECT_FALSE(Query(a, rows).empty());
  EXPECT_EQ(Query(a, rows), Query(b, rows));
  // KVTIER_SELECTION_MEMO=off: nothing remembered, nothing reused.
  setenv("KVTIER_SELECTION_MEMO", "off", 1);
  const fs::path d = dir_ / "d.sqlite";
  ASSERT_EQ(Run("sim --config " + e + " --out " + d.string() + " --systems spec").code, 0);
  EXPECT_EQ(metric(d, "selection_memo_reused_layers"), "");
  EXPECT_EQ(Query(d, rows), Query(a, rows));
}

// H2O's per-head selections have a memo of their own (the heads' union and per-token head
// counts): a second run of an H2O baseline reads every layer from it and decides, loads and
// times every layer as the first run did.
TEST_F(SimCliTest, ASecondH2oRunReusesTheSelectionsAndDecidesTheSame) {
  const std::string e = Experiment(Trace());
  const fs::path a = dir_ / "a.sqlite", b = dir_ / "b.sqlite";
  ASSERT_EQ(Run("sim --config " + e + " --out " + a.string() + " --systems as_h2o_lfu").code, 0);
  Result r = Run("sim --config " + e + " --out " + b.string() + " --systems as_h2o_lfu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("H2O selections of"), std::string::npos) << r.err;
  auto metric = [](const fs::path& db, const std::string& name) {
    return Query(db, "SELECT CAST(value AS INTEGER) FROM metrics WHERE name = '" + name + "'");
  };
  EXPECT_EQ(metric(a, "h2o_memo_reused_layers"), "0");
  EXPECT_NE(metric(a, "h2o_memo_computed_layers"), "0");
  EXPECT_EQ(metric(b, "h2o_memo_reused_layers"), metric(a, "h2o_memo_computed_layers"));
  EXPECT_EQ(metric(b, "h2o_memo_computed_layers"), "0");
  EXPECT_EQ(metric(a, "selection_memo_reused_layers"), "") << "no ITF in an H2O baseline";
  const std::string layers =
      "SELECT group_concat(r, ';') FROM (SELECT printf('%d %d %.17g %d %d', request_id, "
      "layer, end_s, selected_tokens, loaded_chunks) AS r FROM layers "
      "ORDER BY request_id, layer)";
  const std::string transfers =
      "SELECT group_concat(r, ';') FROM (SELECT printf('%d %d %d %.17g', request_id, layer, "
      "bytes, end_s) AS r FROM transfers ORDER BY request_id, layer, start_s, end_s, bytes)";
  EXPECT_FALSE(Query(a, layers).empty());
  EXPECT_EQ(Query(a, layers), Query(b, layers));
  EXPECT_EQ(Query(a, transfers), Query(b, transfers));
  // Without a memo: the same answers.
  setenv("KVTIER_SELECTION_MEMO", "off", 1);
  const fs::path d = dir_ / "d.sqlite";
  ASSERT_EQ(Run("sim --config " + e + " --out " + d.string() + " --systems as_h2o_lfu").code, 0);
  EXPECT_EQ(metric(d, "h2o_memo_reused_layers"), "");
  EXPECT_EQ(Query(d, layers), Query(a, layers));
  EXPECT_EQ(Query(d, transfers), Query(a, transfers));
}

TEST_F(SimCliTest, BadInputExitsTwoAndNamesTheProblem) {
  const std::string trace = Trace(4);
  const std::string e = Experiment(trace);
  const std::string db = (dir_ / "r.sqlite").string();

  Result r = Run("sim --config " + e + " --out " + db + " --systems spec,bogus");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("bogus"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("as_h2o_lfu"), std::string::npos) << "lists the known systems: " << r.err;

  r = Run("sim --config " + e + " --out " + db + " --cache.gpu_capacty=4GiB");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cache.gpu_capacty"), std::string::npos) << r.err;

  r = Run("sim --config " + e + " --out " + db + " --workload.trace=" + (dir_ / "nope.kvt").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("nope.kvt"), std::string::npos) << r.err;

  r = Run("sim --config " + Experiment(trace, "opt-6.7b") + " --out " + db + " --systems as");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("retarget"), std::string::npos) << r.err;
  r = Run("sim --config " + Experiment(trace, "opt-6.7b") + " --out " + db +
          " --systems as --workload.retarget=true");
  EXPECT_EQ(r.code, 0) << r.err;

  r = Run("sim --config " + e + " --out /nonexistent-dir/r.sqlite");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent-dir/r.sqlite"), std::string::npos) << r.err;

  r = Run("sim --config " + e);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
}

// gpu.layer_table: a bad table stops `kvtier sim` before it runs (exit 2, naming the file and
// line); a good one runs, and the kinds it lacks are named on stderr.
TEST_F(SimCliTest, LayerTableBadFileExitsTwoAndGoodOneRuns) {
  const std::string e = Experiment(Trace(4));
  const std::string db = (dir_ / "r.sqlite").string();
  const std::string header = "# model = opt-13b\nkind,new_tokens,context_tokens,heads,seconds\n";
  const std::string bad = Write("bad.csv", header + "layer_prefill,64,512,0,-3ms\n");
  Result r = Run("sim --config " + e + " --out " + db + " --systems as --gpu.layer_table=" + bad);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("bad.csv:3: column 5 (seconds)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gpu.layer_table"), std::string::npos) << r.err;

  r = Run("sim --config " + e + " --out " + db + " --systems as --gpu.layer_table=" +
          (dir_ / "missing.csv").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("missing.csv"), std::string::npos) << r.err;

  const std::string good = Write("good.csv", header + "layer_prefill,64,512,0,3ms\n");
  r = Run("sim --config " + e + " --out " + db + " --systems as --gpu.layer_table=" + good);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("no rows for probe_scores, full_scores, output_layer, decode_layer"),
            std::string::npos)
      << r.err;
}

TEST_F(SimCliTest, SweepRunsTheGridAndResumes) {
  const std::string e = Experiment(Trace(6));
  const std::string db = (dir_ / "s.sqlite").string();
  Result r = Run("sweep --config " + e + " --systems spec --set cache.gpu_capacity=1GiB,4GiB "
                 "--set itf.alpha=0,0.6 --out " + db + " -j 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("4 points (0 done before, 4 to run)"), std::string::npos) << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 1"), "4");
  r = Run("sweep --config " + e + " --systems spec --set cache.gpu_capacity=1GiB,4GiB "
          "--set itf.alpha=0,0.6,1 --out " + db + " -j 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("6 points (4 done before, 2 to run)"), std::string::npos) << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 1"), "6");
}

// Regression (probing, 2026-12-02): a results file that stopped taking writes in the middle of
// a run (the disk filled) ended the run as bad input, exit 2, its run left 'running' as if
// killed. It is a run-time failure: exit 3, the run marked failed with the error, the file
// consistent. Here a file-size limit (ulimit -f, SIGXFSZ ignored) stands in for the full disk.
TEST_F(SimCliTest, AResultsFileThatStopsTakingWritesMidRunFailsTheRunWithExitThree) {
  const std::string e = Experiment(Trace(100));
  const std::string db = (dir_ / "r.sqlite").string();
  const std::string cmd = "bash -c \"trap '' XFSZ; ulimit -f 200; exec '" +
                          std::string(KVTIER_BIN) + "' sim --config " + e +
                          " --systems as --quiet --out " + db + "\" 2>'" +
                          (dir_ / "stderr").string() + "' >/dev/null";
  const int status = std::system(cmd.c_str());
  std::ifstream in(dir_ / "stderr");
  const std::string err(std::istreambuf_iterator<char>(in), {});
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 3) << err;
  EXPECT_NE(err.find("run failed: system as, run 1: results file: " + db + ": "),
            std::string::npos)
      << err;
  EXPECT_EQ(Query(db, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs"), "1");
  EXPECT_EQ(Query(db, "SELECT status || ' ' || complete FROM runs"), "failed 0");
  EXPECT_EQ(Query(db, "SELECT error LIKE 'results file: %' FROM runs"), "1");
}

// Regression (probing, 2026-12-02, third sitting): a trace record corrupted past the header
// (found by its CRC only when the replay reaches it) exited 2 but left the run 'running', as a
// kill leaves one, so a resumed sweep ran the point into the same error again each time. The
// run is now marked failed with the error, exit 2 as before, and a resumed sweep reports it.
TEST_F(SimCliTest, ATraceRecordCorruptedPastTheHeaderExitsTwoAndMarksTheRunFailed) {
  const std::string trace = Trace(100);
  {
    std::fstream f(trace, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(trace) / 2));
    const std::string junk(64, '\xff');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  const std::string e = Experiment(trace);
  const std::string db = (dir_ / "r.sqlite").string();
  Result r = Run("sim --config " + e + " --systems as --quiet --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(trace + ": record "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("CRC mismatch"), std::string::npos) << r.err;
  EXPECT_EQ(Query(db, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(Query(db, "SELECT status || ' ' || complete FROM runs"), "failed 0");
  EXPECT_EQ(Query(db, "SELECT error LIKE '%CRC mismatch%' FROM runs"), "1");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM run_summary"), "0") << "a failed run is not a result";

  const std::string sdb = (dir_ / "s.sqlite").string();
  const std::string sweep =
      "sweep --config " + e + " --systems as --set cache.gpu_capacity=1GiB --out " + sdb;
  r = Run(sweep);
  EXPECT_EQ(r.code, 2) << r.err;
  r = Run(sweep);
  EXPECT_NE(r.err.find("1 point(s) failed before and are not rerun"), std::string::npos)
      << r.err;
  EXPECT_EQ(Query(sdb, "SELECT COUNT(*) FROM runs"), "1") << "not run into the error again";
}

// Regression (issue 18's class): `--set k=1GiB --set k=2GiB` ran one point, labelled with both
// values, at 2GiB; a value listed twice ran the same point twice. Both exit 2 before any run.
TEST_F(SimCliTest, SweepOfAKeySetTwiceOrAValueListedTwiceExitsTwo) {
  const std::string e = Experiment(Trace(2));
  const std::string db = (dir_ / "d.sqlite").string();
  Result r = Run("sweep --config " + e + " --systems as --set cache.gpu_capacity=1GiB "
                 "--set cache.gpu_capacity=2GiB --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--set cache.gpu_capacity: set twice"), std::string::npos) << r.err;
  r = Run("sweep --config " + e + " --systems as --set itf.alpha=0,0.6,0 --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--set itf.alpha: value '0' listed twice"), std::string::npos) << r.err;
  // (2026-12-02) One value written two ways ran the point twice under two configuration hashes.
  for (const auto& [set, message] : std::vector<std::pair<std::string, std::string>>{
           {"select.retention=0.5,0.50", "--set select.retention: value '0.50' is '0.5' again"},
           {"cache.gpu_capacity=1GiB,1024MiB", "value '1024MiB' is '1GiB' again"},
           {"reorder.interval=30s,1min,30000ms", "value '30000ms' is '30s' again"}}) {
    r = Run("sweep --config " + e + " --systems as --set " + set + " --out " + db);
    EXPECT_EQ(r.code, 2) << set << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << set << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists(db));
}

// Regression (probing, 2026-12-01): `--systems as,as` ran `as` twice, two runs of one name in
// one file; `--systems ""` ran the experiment's seven default systems; a repeat in
// experiment.systems the same. Each exits 2 before any run, naming the list and the system.
TEST_F(SimCliTest, SystemsListedTwiceOrAnEmptySystemsListExitTwo) {
  const std::string e = Experiment(Trace(2));
  const std::string db = (dir_ / "d.sqlite").string();
  Result r = Run("sim --config " + e + " --systems as,spec,as --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("command line: --systems: system 'as' listed twice"), std::string::npos)
      << r.err;
  r = Run("sim --config " + e + " --systems ' , ' --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--systems ' , ' names no system (systems: "), std::string::npos) << r.err;
  r = Run("sweep --config " + e + " --experiment.systems=spec,spec --set itf.alpha=0 --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("experiment.systems: system 'spec' listed twice"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(db));
}

// Regression (probing, 2026-12-01): `sweep --status ''` was "internal error: filesystem error:
// cannot make absolute path" (exit 1); `--slurm ''` reached the same call.
TEST_F(SimCliTest, AnEmptySlurmOrStatusDirectoryExitsTwo) {
  Result r = Run("sweep --status ''");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--status: an empty path names no job directory"), std::string::npos)
      << r.err;
  const std::string e = Experiment(Trace(2));
  r = Run("sweep --config " + e + " --systems as --set itf.alpha=0,1 --slurm ''");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--slurm: an empty path names no job directory"), std::string::npos)
      << r.err;
}

// Regression (probing, 2026-12-01): warm-ups covering every request ran to an empty comparison
// table with exit 0; reorder.min_accesses = -1 and reorder.history_weight = 2 passed the check.
TEST_F(SimCliTest, WarmUpsThatLeaveNothingToMeasureAndBadReorderKeysExitTwo) {
  const std::string e = Experiment(Trace(4));  // warmup_requests = 2
  const std::string db = (dir_ / "w.sqlite").string();
  Result r = Run("sim --config " + e + " --systems as --run.warmup_requests=4 --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("run.warmup_requests: 4 warm-up requests leave none of the 4 served"),
            std::string::npos)
      << r.err;
  r = Run("sim --config " + e + " --systems as --run.max_requests=2 --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("e.ini:10: run.warmup_requests: 2 warm-up requests leave none of the 2 "
                       "served (run.max_requests) to measure"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs"), "0");  // refused before its run row
  r = Run("config --config " + e + " --check --reorder.min_accesses=-1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("reorder.min_accesses"), std::string::npos) << r.err;
  r = Run("config --config " + e + " --check --reorder.history_weight=2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("reorder.history_weight: must be in [0, 1)"), std::string::npos) << r.err;
  EXPECT_EQ(Run("sim --config " + e + " --systems as --run.max_requests=3 --out " + db).code, 0);
}

// Regression (probing, 2026-12-01): ssd.capacity was read by nothing (1 MB ran as 2 TB, with no
// word). The SSD still keeps every chunk; the run records what it stored and says when that is
// past the capacity.
TEST_F(SimCliTest, StoringMoreThanTheSsdCapacityWarnsAndRecordsTheStoredBytes) {
  const std::string e = Experiment(Trace(4));
  const fs::path db = dir_ / "c.sqlite";
  Result r = Run("sim --config " + e + " --systems as --ssd.capacity=1MB --out " + db.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: system as stored "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("more than ssd.capacity = 0.001 GB (command line: ssd.capacity); the SSD "
                       "keeps every chunk"),
            std::string::npos)
      << r.err;
  // as stores K and V: 40 layers x 2 x 40 heads x 128 x 2 B = 819,200 B per token of OPT-13B.
  const std::string stored =
      Query(db, "SELECT CAST(value AS INTEGER) FROM metrics WHERE name = 'ssd.stored_bytes'");
  ASSERT_FALSE(stored.empty());
  EXPECT_EQ(std::stoll(stored) % 819200, 0) << stored;
  EXPECT_GT(std::stoll(stored), 0);
  r = Run("sim --config " + e + " --systems as --out " + (dir_ / "d.sqlite").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("ssd.capacity"), std::string::npos) << r.err;
}

// Regression (probing, 2026-12-01, second sitting): simulated times past ~1e10 s are wrong
// (SimGrid's clock no longer resolves microsecond operations there), and were printed as
// results with exit 0. A run whose clock passes 1e9 s (kMaxSimulatedSeconds) now stops with
// exit 2 and stays incomplete: here a GPU of 2 FLOP/s, which every per-key bound allows.
TEST_F(SimCliTest, ASimulatedClockPastABillionSecondsIsAnErrorNotAResult) {
  const std::string e = Experiment(Trace(4));
  const fs::path db = dir_ / "slow.sqlite";
  Result r = Run("sim --config " + e + " --systems as --gpu.flops=2 --gpu.efficiency=1 "
                 "--out " + db.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: the simulated clock reached "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("past the 1e9 s (31.7 years) the simulator resolves"), std::string::npos)
      << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 1"), "0");
}

// A trace without importance (import-mooncake writes lengths and prefixes only) replayed with
// no importance model: a system that selects rows fails naming the key to set and an example
// ("no importance model was named" said neither); one that selects nothing (as, recomp, cake)
// runs, as it did not before, with the same times as with an importance model.
TEST_F(SimCliTest, ATraceWithoutImportanceNamesTheKeyThatGivesIt) {
  const fs::path jsonl = dir_ / "m.jsonl";
  std::ofstream(jsonl) << "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 4, "
                          "\"hash_ids\": [1, 2, 3]}\n"
                          "{\"timestamp\": 50, \"input_length\": 1100, \"output_length\": 4, "
                          "\"hash_ids\": [1, 2, 3]}\n";
  const std::string trace = (dir_ / "m.kvt").string();
  ASSERT_EQ(Run("trace import-mooncake " + jsonl.string() + " -o " + trace).code, 0);
  const std::string e = Experiment(trace);
  Result r = Run("sim --config " + e + " --systems spec --run.warmup_requests=0 --out " +
                 (dir_ / "m.sqlite").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("set workload.importance, e.g. --workload.importance=\"seed=1\""),
            std::string::npos)
      << r.err;
  r = Run("sim --config " + e + " --systems spec --run.warmup_requests=0 "
          "--workload.importance=seed=1 --out " +
          (dir_ / "m2.sqlite").string());
  EXPECT_EQ(r.code, 0) << r.err;
  const fs::path plain = dir_ / "m3.sqlite", with = dir_ / "m4.sqlite";
  ASSERT_EQ(Run("sim --config " + e + " --systems as,recomp,cake --run.warmup_requests=0 --out " +
                plain.string()).code, 0);
  ASSERT_EQ(Run("sim --config " + e + " --systems as,recomp,cake --run.warmup_requests=0 "
                "--workload.importance=seed=1 --out " + with.string()).code, 0);
  const std::string times = "SELECT group_concat(printf('%.12f', ttft_s)) FROM (SELECT ttft_s "
                            "FROM requests JOIN runs USING (run_id) ORDER BY system, request_id)";
  EXPECT_EQ(Query(plain, times), Query(with, times));
  EXPECT_FALSE(Query(plain, times).empty());
}

// Regression: `--set workload.trace=a,b` was accepted but every point ran the INI's trace.
TEST_F(SimCliTest, SweepCanVaryTheTrace) {
  const std::string a = Trace(4);
  const std::string b = (dir_ / "b.kvt").string();
  fs::copy_file(a, (dir_ / "a.kvt"));
  ASSERT_EQ(Run("trace gen -o " + b + " --requests 5 --rate 20 --prompts 2 --examples_min 2 "
                "--examples_max 2 --example_tokens 100 --example_tokens_sd 10 "
                "--calibration_tokens 256 --quiet").code, 0);
  const std::string db = (dir_ / "v.sqlite").string();
  Result r = Run("sweep --config " + Experiment(a) + " --systems as --set workload.trace=" +
                 (dir_ / "a.kvt").string() + "," + b + " --out " + db);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(DISTINCT trace) FROM runs WHERE complete = 1"), "2");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM requests q JOIN runs USING (run_id) "
                      "WHERE runs.trace = '" + b + "'"), "5");
}

TEST_F(SimCliTest, KilledRunLeavesAConsistentIncompleteFile) {
  // Long enough to be running when its first batch commits (SqliteRunLog writes every 256
  // requests or every second).
  const std::string e = Experiment(Trace(3000));
  const fs::path db = dir_ / "k.sqlite";
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: the kill below reaches the simulation child too
    execl(KVTIER_BIN, KVTIER_BIN, "sim", "--config", e.c_str(), "--out", db.c_str(), "--systems",
          "as_h2o_lfu", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Kill the whole process group of the simulation once some requests are committed.
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string n = fs::exists(db) ? Query(db, "SELECT COUNT(*) FROM requests") : "";
    started = !n.empty() && n != "0";
  }
  ::kill(-pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(started) << "the simulation never committed a request";
  EXPECT_EQ(Query(db, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(Query(db, "SELECT complete FROM runs"), "0");
  EXPECT_EQ(Query(db, "SELECT status FROM runs"), "running");  // not 'failed': it was killed
  EXPECT_EQ(Query(db, "SELECT error IS NULL FROM runs"), "1");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM run_summary"), "0") << "incomplete runs are excluded";
}

// --- Reliability regressions (issue 18) ---

// Pids of the processes whose command line contains `needle` (the children of a killed
// `kvtier sim` carry its arguments, the results path among them).
std::vector<pid_t> ProcessesWith(const std::string& needle) {
  std::vector<pid_t> pids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    // A zombie (exited, not yet reaped by the test) has an empty command line.
    if (cmd.find(needle) != std::string::npos) pids.push_back(pid_t(std::stoi(name)));
  }
  return pids;
}

// Starts `kvtier sim` on a long trace with two systems at once and waits until both children
// have begun their runs; returns the parent's pid.
pid_t StartTwoRuns(const std::string& e, const fs::path& db) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl(KVTIER_BIN, KVTIER_BIN, "sim", "--config", e.c_str(), "--out", db.c_str(), "--systems",
          "as,as_h2o_lfu", "-j", "2", static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (fs::exists(db) && Query(db, "SELECT COUNT(*) FROM runs") == "2") break;
  }
  return pid;
}

// Waits up to 10 s until no process mentions `needle`; returns the ones left.
std::vector<pid_t> WaitForNone(const std::string& needle) {
  std::vector<pid_t> left;
  for (int i = 0; i < 200; ++i) {
    left = ProcessesWith(needle);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return left;
}

TEST_F(SimCliTest, SigkilledParentTakesItsChildrenWithIt) {
  const std::string e = Experiment(Trace(3000));
  const fs::path db = dir_ / "orphans.sqlite";
  const pid_t pid = StartTwoRuns(e, db);
  ASSERT_EQ(Query(db, "SELECT COUNT(*) FROM runs"), "2") << "the children never started";
  ::kill(pid, SIGKILL);  // the parent only, as a job scheduler or the OOM killer would
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WaitForNone(db.string()), std::vector<pid_t>{}) << "orphaned children still run";
  EXPECT_EQ(Query(db, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 0"), "2")
      << "an orphan finished and marked its run complete";
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM run_summary"), "0");
}

// Starts `kvtier trace gen --requests N --out OUT` (with SIGHUP ignored, as under nohup, when
// `ignore_sighup`; the disposition survives exec) and returns its pid once `OUT.partial` holds
// bytes, or -1 (the child killed) if it never does.
pid_t StartTraceGen(const fs::path& out, const char* requests, bool ignore_sighup) {
  const std::string config = (SourceDir() / "configs/workloads/fewshot-opt-13b.ini").string();
  const pid_t pid = fork();
  if (pid == 0) {
    if (ignore_sighup) ::signal(SIGHUP, SIG_IGN);
    execl(KVTIER_BIN, KVTIER_BIN, "trace", "gen", "--config", config.c_str(), "--requests",
          requests, "--out", out.c_str(), "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  const fs::path partial = out.string() + ".partial";
  for (int i = 0; i < 2000; ++i) {
    std::error_code ec;
    if (fs::file_size(partial, ec) > 0 && !ec) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Regression (probing, 2026-12-02, third sitting): `trace gen` stopped by SIGTERM left
// `<out>.partial` (160 MB after two seconds of this trace); now the signal removes it and the
// process ends by the signal (traces/trace_io.h).
TEST_F(SimCliTest, SigtermToTraceGenLeavesNoPartialFile) {
  const fs::path out = dir_ / "big.kvt";
  const pid_t pid = StartTraceGen(out, "100000", /*ignore_sighup=*/false);
  ASSERT_GT(pid, 0) << "trace gen never wrote its partial file";
  ::kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_FALSE(fs::exists(out.string() + ".partial")) << "the partial trace was left behind";
  EXPECT_FALSE(fs::exists(out));
}

// The stop handler goes in only where a signal's disposition is the default: under nohup a
// SIGHUP mid-write stays ignored and the trace completes under its name.
TEST_F(SimCliTest, SighupIgnoredAsUnderNohupLetsTraceGenComplete) {
  const fs::path out = dir_ / "nohup.kvt";
  const pid_t pid = StartTraceGen(out, "5000", /*ignore_sighup=*/true);
  ASSERT_GT(pid, 0) << "trace gen never wrote its partial file";
  ::kill(pid, SIGHUP);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out.string() + ".partial"));
}

TEST_F(SimCliTest, SigtermToParentStopsChildrenAndMarksNothingComplete) {
  const std::string e = Experiment(Trace(3000));
  const fs::path db = dir_ / "term.sqlite";
  const pid_t pid = StartTwoRuns(e, db);
  ASSERT_EQ(Query(db, "SELECT COUNT(*) FROM runs"), "2") << "the children never started";
  ::kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_EQ(WaitForNone(db.string()), std::vector<pid_t>{});
  EXPECT_EQ(Query(db, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 0"), "2");
}

TEST_F(SimCliTest, FifoTraceIsRejectedNotAHang) {
  const std::string e = Experiment(Trace(4));
  const std::string fifo = (dir_ / "t.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // It used to hang forever: the trace was opened three times and the FIFO had one writer.
  Result r = Run("sim --config " + e + " --out " + (dir_ / "r.sqlite").string() +
                 " --systems as --workload.trace=" + fifo);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(fifo + ": trace file must be a regular file, not a FIFO"),
            std::string::npos)
      << r.err;
}

TEST_F(SimCliTest, OutOntoANonSqliteFileExitsTwoAndKeepsTheFile) {
  const std::string e = Experiment(Trace(4));
  const std::string notes = Write("notes.txt", "my notes\n");
  Result r = Run("sim --config " + e + " --out " + notes + " --systems as");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(notes + ": not an SQLite database"), std::string::npos) << r.err;
  EXPECT_EQ(kvtier::testing::Slurp(notes), "my notes\n");
  r = Run("sim --config " + e + " --out " + dir_.string() + " --systems as");  // a directory
  EXPECT_EQ(r.code, 2) << r.err;
}

TEST_F(SimCliTest, OutOntoAnOlderSchemaExitsTwoInsteadOfAppending) {
  const std::string e = Experiment(Trace(4));
  const fs::path db = dir_ / "old.sqlite";
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "CREATE TABLE runs (run_id INTEGER PRIMARY KEY);"
                            "CREATE VIEW run_summary AS SELECT run_id FROM runs;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  Result r = Run("sim --config " + e + " --out " + db.string() + " --systems as");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("written by an older kvtier"), std::string::npos) << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs"), "0");
}

TEST_F(SimCliTest, SameNamedModelOfAnotherShapeNeedsRetarget) {
  // A trace generated for an "opt-13b" of 32 layers replayed on configs/models/opt-13b (40).
  const std::string path = (dir_ / "t32.kvt").string();
  ASSERT_EQ(Run("trace gen -o " + path + " --requests 4 --rate 20 --prompts 2 --examples_min 2 "
                "--examples_max 2 --example_tokens 100 --example_tokens_sd 10 "
                "--calibration_tokens 256 --model-name opt-13b --model-layers 32 --quiet").code,
            0);
  const std::string e = Experiment(path);
  Result r = Run("sim --config " + e + " --out " + (dir_ / "r.sqlite").string() + " --systems as");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("with 32 layers, 40 heads, 40 KV heads"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("has 40 layers"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("workload.retarget"), std::string::npos) << r.err;
  r = Run("sim --config " + e + " --out " + (dir_ / "r.sqlite").string() +
          " --systems as --workload.retarget=true");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(SimCliTest, PrefixesLongerThanMaxContextWarnOncePerRun) {
  // OPT-13B's context is 2,048 tokens; every request here has ~2,400 (the cost model
  // extrapolates; the shipped Fig. 3 workload relies on it).
  const std::string path = (dir_ / "long.kvt").string();
  ASSERT_EQ(Run("trace gen -o " + path + " --requests 6 --rate 20 --prompts 1 --tasks 1 "
                "--examples_min 3 --examples_max 3 --example_tokens 800 --example_tokens_sd 1 "
                "--calibration_tokens 256 --quiet").code,
            0);
  Result r = Run("sim --config " + Experiment(path) + " --out " + (dir_ / "r.sqlite").string() +
                 " --systems as,spec");
  EXPECT_EQ(r.code, 0) << r.err;
  std::size_t warnings = 0;
  for (std::size_t at = 0; (at = r.err.find("more than model.max_context = 2048", at)) !=
                           std::string::npos;
       ++at) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 2u) << "one per run (two systems): " << r.err;
}

// What a killed sweep leaves (runs complete = 0, status 'running') is rerun exactly; a point
// whose run failed is reported and rerun only with --rerun-failed.
TEST_F(SimCliTest, ResumedSweepRedoesExactlyTheKilledPointsAndFailedOnesOnlyWhenAsked) {
  const std::string e = Experiment(Trace(6));
  const fs::path db = dir_ / "resume.sqlite";
  const std::string sweep = "sweep --config " + e + " --systems as --set cache.gpu_capacity=1GiB,"
                            "2GiB,4GiB,8GiB --out " + db.string() + " -j 2";
  ASSERT_EQ(Run(sweep).code, 0);
  auto exec = [&](const std::string& sql) {
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sql;
    sqlite3_close(h);
  };
  // Two points as a kill leaves them, one as a run-time failure leaves it.
  exec("UPDATE runs SET complete = 0, status = 'running' WHERE run_id IN (1, 2)");
  exec("UPDATE runs SET complete = 0, status = 'failed', error = 'IoError: injected' "
       "WHERE run_id = 3");
  const std::string killed =
      Query(db, "SELECT group_concat(config_sha256) FROM (SELECT config_sha256 FROM runs "
                "WHERE run_id IN (1, 2) ORDER BY 1)");
  Result r = Run(sweep);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("4 points (1 done before, 2 to run)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 point(s) failed before and are not rerun"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("failed: as cache.gpu_capacity="), std::string::npos) << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 0 AND status = 'running'"), "0")
      << "the killed runs were deleted";
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE status = 'failed'"), "1")
      << "the failed run is kept until --rerun-failed";
  EXPECT_EQ(Query(db, "SELECT group_concat(config_sha256) FROM (SELECT config_sha256 FROM runs "
                      "WHERE run_id > 4 ORDER BY 1)"),
            killed)
      << "exactly the killed points ran again";
  r = Run(sweep + " --rerun-failed");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("4 points (3 done before, 1 to run)"), std::string::npos) << r.err;
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE status = 'failed'"), "0");
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM runs WHERE complete = 1 AND status = 'ok'"), "4");
}

}  // namespace
