// `kvtier calibrate --quick` measures this machine and writes a profile that `kvtier config
// --check` accepts as a hardware include.

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/options.h"
#include "models/layer_table.h"
#include "tests/hw/hw_cli_util.h"
#include "tests/hw/hw_test_util.h"
#include "tests/testutil/run_command.h"

namespace kvtier::hw {
namespace {

std::string Kvtier() { return KVTIER_CLI; }  // set by tests/hw/executor.cmake

using kvtier::testing::RunCmd;

TEST(KvtierCalibrate, QuickProfileIsAValidHardwareInclude) {
  testing::ScratchDir dir;
  const std::string ini = dir.path() + "/hardware/calibrated.ini";
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " calibrate --quick --out " + ini, &out), 0) << out;
  std::ifstream f(ini);
  std::stringstream text;
  text << f.rdbuf();
  for (const char* key : {"[hardware]", "source = kvtier calibrate", "[ssd]", "read_bw", "latency",
                          "[cpu]", "memcpy_bw", "gather_bw", "[pcie]", "h2d_bw", "[gpu]",
                          // issue 14's transfer-strategy keys, each with its method in `source`
                          "\ngather_run_cost = ", "\nbatch_latency = ", "\ndescriptor_cost = ",
                          "\ngather_sm_share = ", "pcie.h2d_bw/d2h_bw/latency: fit of the copy curve",
                          "pcie.batch_latency/descriptor_cost: fit", "host emulation",
                          "cpu.gather_bw/gather_run_cost: fit", "; ssd check: whole 64 KiB chunks",
                          // copies through host memory share it (host backend only)
                          "\nshared_copy_bw = ", "cpu.shared_copy_bw: two threads"}) {
    EXPECT_NE(text.str().find(key), std::string::npos) << key << " missing in\n" << text.str();
  }
  // What was measured is printed on stderr: the samples with the fits and their residuals.
  for (const char* table : {"copy curve", "fit: latency", "cpu gathers", "fit: run cost",
                            "batched copies", "ssd read units", "4 x 4 KiB extents / chunk"}) {
    EXPECT_NE(out.find(table), std::string::npos) << table << " missing in\n" << out;
  }
  const std::string exp = dir.path() + "/exp.ini";
  std::ofstream(exp) << "[include]\nmodel = smollm2-135m\nhardware = " << ini
                     << "\nsystem = spec\n";
  out.clear();
  ASSERT_EQ(RunCmd(Kvtier() + " config --config " + exp + " --check", &out), 0) << out;
  EXPECT_NE(out.find("ok"), std::string::npos) << out;
}

// A block that does not divide the arena (24 KiB, smollm2-135m's K/V chunk, into --quick's
// 32 MiB): the cold-copy measurement's source offsets ran up to a block past the arena's end
// (SIGSEGV). Now it measures and writes the profile.
TEST(KvtierCalibrate, BlockThatDoesNotDivideTheArenaStaysInside) {
  testing::ScratchDir dir;
  const std::string ini = dir.path() + "/odd.ini";
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " calibrate --quick --block 24576 --out " + ini, &out), 0) << out;
  std::ifstream f(ini);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("\nmemcpy_bw = "), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("\nshared_copy_bw = "), std::string::npos) << text.str();
}

// --layer-table: the host backend's real compute timed per layer step for the --config model,
// written beside the profile, named by its [gpu] layer_table, and read back by the timer.
TEST(KvtierCalibrate, LayerTableIsWrittenBesideTheProfileAndLoads) {
  testing::ScratchDir dir;
  const std::string exp = dir.path() + "/exp.ini";
  std::ofstream(exp) << "[include]\nmodel = smollm2-135m\nsystem = spec\n[itf]\nprobe_heads = 2\n";
  const std::string ini = dir.path() + "/hardware/box.ini";
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " calibrate --quick --block 65536 --config " + exp +
                       " --layer-table --out " + ini,
                   &out),
            0)
      << out;
  std::ifstream f(ini);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("layer_table = box.layers.csv"), std::string::npos) << text.str();
  const LayerTable table = ReadLayerTable(dir.path() + "/hardware/box.layers.csv");
  EXPECT_EQ(table.meta.at("model"), "smollm2-135m");
  bool kinds[kLayerStepKinds] = {};
  for (const LayerTablePoint& p : table.points) kinds[static_cast<int>(p.kind)] = true;
  for (bool k : kinds) EXPECT_TRUE(k);
  // The profile with its table is a valid include, and the experiment's timer reads it.
  const std::string run = dir.path() + "/run.ini";
  std::ofstream(run) << "[include]\nmodel = smollm2-135m\nhardware = " << ini
                     << "\nsystem = spec\n";
  const ExperimentOptions o = BuildOptions(Config::Load(run, {}));
  const ComputeTimer timer = ComputeTimer::FromOptions(o.model, o.hardware);
  EXPECT_TRUE(timer.has_table());
  EXPECT_TRUE(timer.MissingKinds().empty());
  // Without --config there is no model to measure.
  out.clear();
  EXPECT_EQ(RunCmd(Kvtier() + " calibrate --quick --layer-table --out " + dir.path() + "/x.ini",
                   &out),
            2)
      << out;
  EXPECT_NE(out.find("--config"), std::string::npos) << out;
}

// --driver: the driving thread timed on the Pipeline's own code -- kvtier hw of the
// experiment's systems over its warm-up requests (here 2) -- gives cpu.driver_op_cost and
// cpu.driver_wake, each system's numbers on stderr, and a profile the simulator reads.
TEST(KvtierCalibrate, DriverIsTimedOnTheExperimentsSystems) {
  testing::ScratchDir dir;
  const std::string d = dir.path();
  std::string out;
  ASSERT_EQ(testing::GenTinySmollmTrace(Kvtier(), d, 6, &out), 0) << out;
  std::ofstream(d + "/exp.ini")
      << "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\nsystem = as\n"
         "[experiment]\nname = driver-test\nsystems = as,spec\n[workload]\ntrace = t.trace\n"
         "[cache]\ngpu_capacity = 4MiB\ncpu_capacity = 16MiB\n[run]\nwarmup_requests = 2\n"
         "[hw]\nbackend = host\nmax_memory = 256MiB\n";
  const std::string ini = d + "/hardware/box.ini";
  out.clear();
  ASSERT_EQ(RunCmd(Kvtier() + " calibrate --quick --config " + d + "/exp.ini --driver --out " + ini,
                   &out),
            0)
      << out;
  for (const char* line : {"driver as ", "driver spec ", "us/op", "us wake-up"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << " missing in\n" << out;
  }
  std::ifstream f(ini);
  std::stringstream text;
  text << f.rdbuf();
  for (const char* key : {"\ndriver_op_cost = ", "\ndriver_wake = ", "\ndriver_op_costs = as=",
                          ", spec=", "cpu.driver_op_cost/driver_wake: kvtier hw of exp.ini's 2 "
                          "systems over their first 2 requests"}) {
    EXPECT_NE(text.str().find(key), std::string::npos) << key << " missing in\n" << text.str();
  }
  // Each system runs with its own cost per op, the one its line on stderr gave.
  const std::string run = d + "/run.ini";
  std::ofstream(run) << "[include]\nmodel = smollm2-135m\nhardware = " << ini << "\nsystem = spec\n";
  const ExperimentOptions o = BuildOptions(Config::Load(run, {}));
  EXPECT_GT(o.hardware.cpu_driver_op_cost, 0);
  EXPECT_LT(o.hardware.cpu_driver_op_cost, 0.05);  // seconds per op: a loaded machine, not a hang
  EXPECT_GE(o.hardware.cpu_driver_wake, 0);
  const std::size_t at = out.find("driver spec ");
  ASSERT_NE(at, std::string::npos);
  const std::size_t colon = out.find("awake: ", at);
  ASSERT_NE(colon, std::string::npos);
  const double spec_us = std::stod(out.substr(colon + 7));
  EXPECT_NEAR(o.hardware.cpu_driver_op_cost * 1e6, spec_us, 0.01) << out;
  const Config pooled = Config::Load(run, {"--cpu.driver_op_costs="});
  EXPECT_DOUBLE_EQ(BuildOptions(pooled).hardware.cpu_driver_op_cost,
                   pooled.GetDuration("cpu.driver_op_cost"));
  // The scratch results database is gone; without --config there is nothing to run.
  for (const auto& entry : std::filesystem::directory_iterator(d + "/hardware")) {
    EXPECT_EQ(entry.path().filename().string().rfind("kvtier_driver_", 0), std::string::npos)
        << entry.path();
  }
  out.clear();
  EXPECT_EQ(RunCmd(Kvtier() + " calibrate --quick --driver --out " + d + "/x.ini", &out), 2) << out;
  EXPECT_NE(out.find("--driver: needs --config"), std::string::npos) << out;
}

TEST(KvtierCalibrate, RejectsBadArguments) {
  std::string out;
  EXPECT_NE(RunCmd(Kvtier() + " calibrate --quick --block 100 --out x.ini", &out), 0) << out;
}

// Regression (probing, 2026-12-01): `--out ''` (and a directory) measured for a minute, then
// failed with ": cannot write". Now exit 2 before any measurement, nothing written.
TEST(KvtierCalibrate, AnEmptyOrDirectoryOutExitsTwoBeforeMeasuring) {
  const std::string d = ::testing::TempDir() + "/calib_out_" + std::to_string(::getpid());
  std::filesystem::create_directories(d);
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " calibrate --out ''", &out), 2) << out;
  EXPECT_NE(out.find("--out: an empty path names no file"), std::string::npos) << out;
  EXPECT_EQ(out.find("measuring"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunCmd(Kvtier() + " calibrate --out " + d, &out), 2) << out;
  EXPECT_NE(out.find("--out is a directory"), std::string::npos) << out;
  EXPECT_EQ(out.find("measuring"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::is_empty(d));
  std::filesystem::remove_all(d);
}

// Regression (probing, 2026-12-01, second sitting): as root, access(2) said yes to `--out
// /proc/x.ini` and to a path under a regular file, so calibrate measured for a minute and then
// failed to write; `--out /dev/null` measured /dev (a RAM file system) as the SSD. Now each
// exits 2 before measuring.
TEST(KvtierCalibrate, AnOutUnderProcOrAFileOrNotARegularFileExitsTwoBeforeMeasuring) {
  for (const std::string& path : {std::string("/proc/kvtier-profile.ini"),
                                  std::string("/etc/hostname/kvtier-profile.ini")}) {
    std::string out;
    EXPECT_EQ(RunCmd(Kvtier() + " calibrate --quick --out " + path, &out), 2) << out;
    EXPECT_NE(out.find(path + ": --out cannot be written ("), std::string::npos) << out;
    EXPECT_EQ(out.find("measuring"), std::string::npos) << out;
  }
  std::string out;
  EXPECT_EQ(RunCmd(Kvtier() + " calibrate --quick --out /dev/null", &out), 2) << out;
  EXPECT_NE(out.find("--out is not a regular file"), std::string::npos) << out;
  EXPECT_EQ(out.find("measuring"), std::string::npos) << out;
}

// Regression (probing, 2026-12-02): `--dir FIFO` was an internal error (exit 1) after the first
// measurement; a missing --dir was created and left behind; `--out x.ini --config x.ini` wrote
// the profile over the experiment. Each exits 2 before measuring, the experiment intact.
TEST(KvtierCalibrate, ADirThatIsNoDirectoryOrAnOutThatIsTheConfigExitsTwoBeforeMeasuring) {
  const std::string d = ::testing::TempDir() + "/calib_dir_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0600), 0);
  { std::ofstream(d + "/file") << "x"; }
  const std::string experiment = d + "/x.ini";
  const std::string text = "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\n";
  { std::ofstream(experiment) << text; }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--dir " + d + "/fifo", "--dir " + d + "/fifo: not a directory"},
      {"--dir " + d + "/file", "--dir " + d + "/file: not a directory"},
      {"--dir " + d + "/missing", "--dir " + d + "/missing: no such directory"},
      {"--config " + experiment + " --out " + experiment, "is the --config experiment"},
  };
  for (const auto& [args, message] : cases) {
    std::string out;
    const std::string o = args.find("--out") == std::string::npos ? " --out " + d + "/p.ini" : "";
    EXPECT_EQ(RunCmd(Kvtier() + " calibrate --quick " + args + o, &out), 2)
        << args << ": " << out;
    EXPECT_NE(out.find(message), std::string::npos) << args << ": " << out;
    EXPECT_EQ(out.find("measuring"), std::string::npos) << args << ": " << out;
  }
  EXPECT_FALSE(std::filesystem::exists(d + "/missing"));
  std::ifstream in(experiment);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), text);
  std::filesystem::remove_all(d);
}

// Regression (probing, 2026-12-01, second sitting): a calibration killed while it read its
// scratch file left that file (kvtier_calibrate.dat, 64 MiB quick, 512 MiB otherwise) in the
// measured directory. The file is unlinked as soon as it is open: SIGKILL leaves nothing.
TEST(KvtierCalibrate, AKilledCalibrationLeavesNoScratchFile) {
  const std::string d = ::testing::TempDir() + "/calib_kill_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d + "/m");
  const std::string log = d + "/log";
  std::string out;
  // Killed once it reports the random reads, which read the scratch file.
  ASSERT_EQ(RunCmd("(" + Kvtier() + " calibrate --quick --out " + d + "/m/p.ini > " + log +
                       " 2>&1 & pid=$!; for i in $(seq 600); do grep -q 'ssd: random' " + log +
                       " && break; sleep 0.05; done; kill -9 $pid; wait $pid; "
                       "grep -q 'ssd: random' " + log + ")",
                   &out),
            0)
      << out;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(d + "/m")) {
    left.push_back(e.path().filename().string());
  }
  EXPECT_TRUE(left.empty()) << "left behind: " << (left.empty() ? "" : left.front());
  std::filesystem::remove_all(d);
}

// Regression (probing, 2026-12-01, second sitting): a staging ring too small for the reads in
// flight (hw.ring = 200000 B: 8 pieces at QD 32) failed runs with "content check failed", exit 3,
// though the disk held every byte; a store capacity the file system cannot hold
// (hw.store_capacity = 1e15B) was "internal error", exit 1. Both are bad input, exit 2, before
// any run.
TEST(KvtierHw, ARingTooSmallForTheReadsInFlightOrAStoreLargerThanTheDiskExitsTwo) {
  testing::ScratchDir dir;
  const std::string d = dir.path();
  std::string out;
  ASSERT_EQ(testing::GenTinySmollmTrace(Kvtier(), d, 4, &out), 0) << out;
  std::ofstream(d + "/exp.ini")
      << "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\nsystem = as\n"
         "[workload]\ntrace = t.trace\n[cache]\ngpu_capacity = 4MiB\ncpu_capacity = 16MiB\n"
         "[hw]\nbackend = host\nmax_memory = 256MiB\nallow_buffered = true\n";
  const std::string hw = Kvtier() + " hw --config " + d + "/exp.ini --quiet --out " + d;
  out.clear();
  EXPECT_EQ(RunCmd(hw + "/a.sqlite --hw.ring=200000B", &out), 2) << out;
  EXPECT_NE(out.find("hw.ring = 200000 B holds fewer than ssd.queue_depth + 1 = "),
            std::string::npos)
      << out;
  out.clear();
  EXPECT_EQ(RunCmd(hw + "/b.sqlite --hw.store_capacity=1e15B", &out), 2) << out;
  EXPECT_NE(out.find("hw.store_capacity: chunk store "), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(d + "/b.sqlite.store-as")) << out;
  out.clear();
  EXPECT_EQ(RunCmd(hw + "/c.sqlite --hw.verify=true", &out), 0) << out;
}

}  // namespace
}  // namespace kvtier::hw
