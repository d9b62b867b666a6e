#pragma once
// Runs the built `kvtier` binary for the record/eval CLI tests: exit code, stdout, stderr.

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
  std::string out, err;
};

inline std::string SlurpFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `kvtier <args>` from `cwd` with stdout/stderr captured in files under `dir`.
inline CliResult RunKvtier(const std::filesystem::path& dir, const std::string& args,
                           const std::filesystem::path& cwd = std::filesystem::current_path()) {
  const auto out = dir / "stdout", err = dir / "stderr";
  const std::string cmd = "cd '" + cwd.string() + "' && '" + std::string(KVTIER_BIN) + "' " + args +
                          " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = SlurpFile(out);
  r.err = SlurpFile(err);
  return r;
}

inline std::filesystem::path SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");
  return s ? std::filesystem::path(s) : std::filesystem::path(KVTIER_TEST_SOURCE_DIR);
}

}  // namespace kvtier::testing
