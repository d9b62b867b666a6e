#include "hw/posix_util.h"

#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <cstring>

namespace kvtier::hw {

std::string ErrnoText(int err) {
  char buf[128];
  // GNU strerror_r returns the message pointer (which may not be `buf`).
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return std::string(msg) + " (errno " + std::to_string(err) + ")";
}

int PwriteAll(int fd, const void* buf, size_t bytes, uint64_t offset) {
  const auto* p = static_cast<const std::byte*>(buf);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return 0;
}

int64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void SleepUntilNs(int64_t target_ns) {
  constexpr int64_t kSpinNs = 60000;
  int64_t now = MonotonicNowNs();
  if (target_ns - now > kSpinNs) {
    timespec ts;
    const int64_t wake = target_ns - kSpinNs;
    ts.tv_sec = wake / 1000000000;
    ts.tv_nsec = wake % 1000000000;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
    }
  }
  while (MonotonicNowNs() < target_ns) {
  }
}

void PreciseTimers() { prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); }

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void FreeDeleter::operator()(void* p) const { std::free(p); }

AlignedBuffer AllocateAligned(size_t bytes, size_t alignment) {
  void* p = nullptr;
  if (posix_memalign(&p, alignment, bytes == 0 ? alignment : bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);
  return AlignedBuffer(static_cast<std::byte*>(p));
}

}  // namespace kvtier::hw
