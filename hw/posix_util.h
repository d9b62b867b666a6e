#pragma once
// Small POSIX helpers shared by the hw/ building blocks: errno text, the CLOCK_MONOTONIC clock
// every I/O timestamp uses, an owning file descriptor, and page-aligned heap buffers for
// O_DIRECT. All functions are thread-safe.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvtier::hw {

// strerror text plus the symbolic number, e.g. "No space left on device (errno 28)".
std::string ErrnoText(int err);

// CLOCK_MONOTONIC in nanoseconds: the host clock of every request stamp.
int64_t MonotonicNowNs();

// Sleeps until CLOCK_MONOTONIC reaches `target_ns`: a kernel sleep for all but the last 60 us,
// then a spin (a sleep alone overshoots by the timer slack, 50 us by default, plus the VM's
// wake-up latency; a spin alone would steal one of the two cores from the I/O threads).
// Callers' threads should set a 1 ns timer slack first (PreciseTimers).
void SleepUntilNs(int64_t target_ns);
// Linux rounds a normal thread's sleeps up by a 50 us timer slack; threads that time things
// set it to 1 ns with this.
void PreciseTimers();

// pwrite of all `bytes` at `offset`, continuing after partial writes and EINTR. Returns 0, or the
// errno that stopped it (EIO for a write that makes no progress); some bytes may have landed.
int PwriteAll(int fd, const void* buf, size_t bytes, uint64_t offset);

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct FreeDeleter {
  void operator()(void* p) const;
};
// A heap buffer aligned to `alignment` (a power of two, >= sizeof(void*)).
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;
// Returns nullptr when the allocation fails. The contents are zeroed.
AlignedBuffer AllocateAligned(size_t bytes, size_t alignment);

inline constexpr uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
inline constexpr bool IsAligned(uint64_t x, uint64_t a) { return x % a == 0; }

}  // namespace kvtier::hw
