// `kvtier calibrate --quick` measures this machine and writes a profile that `kvtier config
// --check` accepts as a hardware include.

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

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

TEST(KvtierCalibrate, QuickProfileIsAValidHardwareInclude) {
  testing::ScratchDir dir;
  const std::string ini = dir.path() + "/hardware/calibrated.ini";
  std::string out;
  ASSERT_EQ(RunCmd(Kvtier() + " calibrate --quick --out " + ini, &out), 0) << out;
  std::ifstream f(ini);
  std::stringstream text;
  text << f.rdbuf();
  for (const char* key : {"[hardware]", "source = kvtier calibrate", "[ssd]", "read_bw", "latency",
                          "[cpu]", "memcpy_bw", "gather_bw", "[pcie]", "h2d_bw", "[gpu]"}) {
    EXPECT_NE(text.str().find(key), std::string::npos) << key << " missing in\n" << text.str();
  }
  const std::string exp = dir.path() + "/exp.ini";
  std::ofstream(exp) << "[include]\nmodel = smollm2-135m\nhardware = " << ini
                     << "\nsystem = spec\n";
  out.clear();
  ASSERT_EQ(RunCmd(Kvtier() + " config --config " + exp + " --check", &out), 0) << out;
  EXPECT_NE(out.find("ok"), std::string::npos) << out;
}

TEST(KvtierCalibrate, RejectsBadArguments) {
  std::string out;
  EXPECT_NE(RunCmd(Kvtier() + " calibrate --quick --block 100 --out x.ini", &out), 0) << out;
}

}  // namespace
}  // namespace kvtier::hw
