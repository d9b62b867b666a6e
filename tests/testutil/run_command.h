#pragma once
// Runs a shell command for the tests that drive the built `kvtier` binary with popen (the hw
// CLI tests): its exit status, with stdout and stderr merged into one text, in order.

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kvtier::testing {

// Runs `cmd` through the shell with 2>&1, appends what it prints to *out and returns its exit
// status (-1 if it could not be started or did not exit normally).
inline int RunCmd(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) *out += buf;
  const int status = p ? ::pclose(p) : -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace kvtier::testing
