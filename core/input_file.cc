#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"

namespace kvtier {
namespace {

[[noreturn]] void Throw(InputKind kind, const std::string& msg) {
  switch (kind) {
    case InputKind::kConfig: throw ConfigError(msg);
    case InputKind::kTrace: throw TraceError(msg);
    case InputKind::kModel: throw ModelFileError(msg);
    case InputKind::kOther: break;
  }
  throw InputError(msg);
}

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

std::string ReadInputFile(const std::string& path, std::size_t max_bytes, const char* what,
                          InputKind kind) {
  // Directories open fine with O_RDONLY and then fail every read with EISDIR; say so up front
  // (before the open, which would block on a FIFO without a writer — that is the user's pipe).
  // An empty path ("--text ''", an unset variable) read as ": cannot open --text: No such file".
  if (path.empty()) Throw(kind, std::string(what) + ": an empty path names no file");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    Throw(kind, path + ": " + what + " is a directory, not a file");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    Throw(kind, path + ": cannot open " + what + ": " + std::strerror(errno));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      Throw(kind, path + ": cannot read " + what + ": " + std::strerror(err));
    }
    if (n == 0) break;
    if (out.size() + std::size_t(n) > max_bytes) {
      ::close(fd);
      Throw(kind, path + ": " + what + " is larger than " + std::to_string(max_bytes >> 20) +
                      " MiB (is it the right file?)");
    }
    out.append(buf, std::size_t(n));
  }
  ::close(fd);
  return out;
}

void RequireRegularFile(const std::string& path, const char* what, InputKind kind) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // the caller's open names the errno
  if (!S_ISREG(st.st_mode)) {
    Throw(kind, path + ": " + what + " must be a regular file, not " +
                    FileTypeName(st.st_mode));
  }
}

}  // namespace kvtier
