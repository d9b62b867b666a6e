#pragma once
// Temporary files and repository paths for the traces tests.
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace kvtier::testing_traces {

inline std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/kvtier_traces_" + std::to_string(::getpid()) + "_" + name;
}
inline std::string SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");
  return s ? s : KVTIER_TEST_SOURCE_DIR;
}
inline std::string BinaryDir() {
  const char* s = std::getenv("KVTIER_BINARY_DIR");
  return s ? s : KVTIER_TEST_BINARY_DIR;
}

}  // namespace kvtier::testing_traces
