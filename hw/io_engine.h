#pragma once
// IoEngine: asynchronous O_DIRECT reads of chunk extents from one data file (the ChunkStore's
// read_fd()), with priority classes and in-flight caps (notes/hw-path.md section 6.2).
//
// Two backends share this interface and the same scheduler:
//   - io_uring: one ring-owner thread. Submit() puts the request on an intake queue and writes an
//     eventfd; the ring keeps a read of that eventfd armed, so the thread blocks in exactly one
//     place (io_uring_submit_and_wait) and wakes on completions or new work. SubmitBatch() queues
//     all its requests at once and wakes the thread once, so one io_uring_submit carries them all
//     (as far as the in-flight caps admit). Completions are posted to the submitting task's
//     task_work by the kernel, which is why only the ring thread submits. The data file is a
//     registered (fixed) file; destinations inside `fixed_buffers` use read_fixed.
//   - pread: a pool of `pread_threads` workers doing blocking pread. Chosen when io_uring is
//     unavailable (ENOSYS/EPERM at ring setup) with Backend::kAuto, or forced with kPread.
//
// Scheduling. Requests are queued per class: demand > probe (ITF probe keys) > prefetch, FIFO
// inside a class, strict priority between classes (a lower class never starts while a higher
// one waits). Reads longer than `max_io_bytes` are split into sub-IOs. At most
// `max_ops_in_flight` sub-IOs and `max_bytes_in_flight` bytes are in flight (a single sub-IO is
// always admitted when nothing is in flight). Prefetch only uses the leftover budget: it starts
// only while the in-flight totals stay within `prefetch_max_ops` / `prefetch_max_bytes`, so
// some depth is always free for demand reads that arrive later.
//
// Completion. Every submitted request completes exactly once, through its callback (run on the
// engine's thread or a pool worker: keep it short and never call back into Submit's blocking
// paths) or through the future of SubmitWithFuture. A short read, an errno, or a misaligned
// request completes with a non-OK Status naming the chunk id and the errno text. Each result
// carries host CLOCK_MONOTONIC stamps: enqueue (Submit), submit (first sub-IO handed to the
// kernel or a worker), complete (last sub-IO finished).
//
// Lifetime: the destination buffer and the fd must outlive the request. The destructor stops
// intake and waits until every request already submitted has completed.
// Thread safety: Submit, SubmitWithFuture, Pause, Resume and stats are thread-safe.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace kvtier::hw {

enum class IoClass : uint8_t { kDemand = 0, kProbe = 1, kPrefetch = 2 };
inline constexpr int kNumIoClasses = 3;
std::string_view IoClassName(IoClass c);

// Host CLOCK_MONOTONIC nanoseconds (hw/posix_util.h MonotonicNowNs).
struct IoStamps {
  int64_t enqueue_ns = 0;
  int64_t submit_ns = 0;
  int64_t complete_ns = 0;
};

struct ReadResult {
  ChunkId chunk_id;
  uint64_t tag = 0;
  IoClass io_class = IoClass::kDemand;
  uint64_t bytes = 0;  // Bytes read (== the request's length when status is OK).
  Status status;
  IoStamps stamps;
};

struct ReadRequest {
  ChunkId chunk_id;  // Named in error messages; echoed in the result.
  uint64_t tag = 0;  // Caller's id (e.g. request id); echoed in the result.
  IoClass io_class = IoClass::kDemand;
  uint64_t offset = 0;  // File offset. REQUIRES: multiple of the engine's alignment.
  uint64_t length = 0;  // REQUIRES: > 0 and a multiple of the engine's alignment.
  void* dst = nullptr;  // REQUIRES: aligned; `length` writable bytes; valid until completion.
  std::function<void(const ReadResult&)> on_complete;  // May be empty.
};

struct IoEngineOptions {
  enum class Backend { kAuto, kIoUring, kPread };
  Backend backend = Backend::kAuto;
  uint32_t max_ops_in_flight = 32;
  uint64_t max_bytes_in_flight = 8ull << 20;
  uint32_t prefetch_max_ops = 24;            // <= max_ops_in_flight
  uint64_t prefetch_max_bytes = 6ull << 20;  // <= max_bytes_in_flight
  uint64_t max_io_bytes = 1ull << 20;        // Sub-IO size; a multiple of `alignment`.
  uint32_t alignment = 4096;                 // Offsets, lengths and buffers.
  uint32_t pread_threads = 8;                // pread backend only.
  bool register_file = true;                 // io_uring only: IOSQE_FIXED_FILE.
  std::vector<iovec> fixed_buffers;          // io_uring only: each <= 1 GiB, anonymous memory.
  bool start_paused = false;                 // Queue requests until Resume().
};

struct IoEngineStats {
  uint64_t completed[kNumIoClasses] = {};
  uint64_t failed = 0;
  uint64_t sub_ios = 0;
  uint64_t fixed_buffer_reads = 0;      // Sub-IOs that used read_fixed.
  uint64_t submit_calls = 0;            // io_uring: submissions that carried reads (pread: 0).
  uint32_t max_ops_in_flight_seen = 0;  // High-water marks, to check the caps.
  uint64_t max_bytes_in_flight_seen = 0;
};

// The Status a read of `length` bytes at `offset` of chunk `chunk` completes with when it failed
// with errno `err` (ReadErrnoStatus), or delivered only `got` bytes (ShortReadStatus): IoError
// naming the chunk, the bytes, the offset and the errno text. The engines use them, and so does
// the fault injection (hw/fault_injection.h), so an injected failure reads like a real one.
Status ReadErrnoStatus(ChunkId chunk, uint64_t length, uint64_t offset, int err);
Status ShortReadStatus(ChunkId chunk, uint64_t got, uint64_t length, uint64_t offset);

class IoEngine {
 public:
  // Creates an engine reading `fd` (not owned). Unavailable when Backend::kIoUring is forced and
  // io_uring cannot be set up; InvalidArgument for inconsistent options.
  static Status Create(int fd, const IoEngineOptions& options, std::unique_ptr<IoEngine>* out);

  virtual ~IoEngine() = default;

  // Queues `request`; it completes exactly once through `request.on_complete`.
  virtual void Submit(ReadRequest request) = 0;
  // Queues every request of `requests` at once (one intake, one wake-up of the engine): the
  // reads of one operation go to the kernel together. Each completes exactly once as Submit's.
  virtual void SubmitBatch(std::vector<ReadRequest> requests) = 0;
  // Same, but the result arrives through the returned future (`on_complete` is replaced).
  std::future<ReadResult> SubmitWithFuture(ReadRequest request);

  // Stops / restarts starting queued sub-IOs (in-flight ones still finish). Lets a caller (or
  // a test) queue a batch and release it at once.
  virtual void Pause() = 0;
  virtual void Resume() = 0;

  virtual IoEngineOptions::Backend backend() const = 0;
  std::string_view backend_name() const;
  virtual IoEngineStats stats() const = 0;
};

}  // namespace kvtier::hw
