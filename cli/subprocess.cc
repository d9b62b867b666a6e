#include "cli/subprocess.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "core/errors.h"

namespace kvtier::cli {
namespace {

// Forks; the child sets up its output with `child_io` and execs argv. Returns the child's pid
// or -1.
template <class ChildIo>
pid_t Start(const std::vector<std::string>& argv, ChildIo child_io) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);  // nothing buffered here is written twice by the child
  const pid_t pid = fork();
  if (pid == 0) {
    child_io();
    execvp(args[0], args.data());
    _exit(127);  // not found or not executable
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

int Spawn(const std::vector<std::string>& argv, bool silent) {
  const pid_t pid = Start(argv, [silent] {
    if (!silent) return;
    std::FILE* null = std::freopen("/dev/null", "w", stdout);
    if (null != nullptr) dup2(fileno(stdout), STDERR_FILENO);
  });
  return pid < 0 ? -1 : Wait(pid);
}

int Capture(const std::vector<std::string>& argv, std::string* output) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = Start(argv, [&fds] {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
  });
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return -1;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    output->append(buf, std::size_t(n));
  }
  close(fds[0]);
  return Wait(pid);
}

std::string SelfPath(const std::string& what) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    throw InputError(what + ": cannot find the kvtier binary (/proc/self/exe): " + ec.message());
  }
  return self.string();
}

}  // namespace kvtier::cli
