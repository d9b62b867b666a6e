#pragma once
// Shared by the CLI tests: runs the built `kvtier` binary (KVTIER_BIN, compiled in) in a
// per-test temporary directory, with KVTIER_CONFIG_DIR pointing at the source tree's configs/.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kvtier::testing {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::filesystem::path SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");
  return s ? std::filesystem::path(s) : std::filesystem::path(KVTIER_SOURCE_DIR_FALLBACK);
}

class CliFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvtier_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    setenv("KVTIER_CONFIG_DIR", (SourceDir() / "configs").c_str(), 1);
    // Selection memos of this test's runs stay in its directory, never in ~/.cache.
    setenv("KVTIER_SELECTION_MEMO", (dir_ / "selections").c_str(), 1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `text` to `name` in the test directory; returns its path.
  std::string Write(const std::string& name, const std::string& text) {
    const std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // Runs `kvtier <args>`; args are passed through the shell as written.
  CliResult Run(const std::string& args) {
    const std::filesystem::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd = std::string("'") + KVTIER_BIN + "' " + args + " >'" + out.string() +
                            "' 2>'" + err.string() + "'";
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  std::filesystem::path dir_;
};

}  // namespace kvtier::testing
