#pragma once
// FaultInjector: injects the faults of a FaultPlan (core/fault_plan.h, key hw.fault_injection)
// into one HwExecutor's I/O and device calls, at the three seams the hardware path already has:
//
//   SSD reads      WrapIoEngine: an IoEngine decorator. A faulted request is still issued to the
//                  real engine (so its queueing and completion thread are exercised) and its
//                  result replaced on completion: read_eio delivers nothing (bytes 0, the
//                  buffer poisoned) with the status a real EIO gives (ReadErrnoStatus);
//                  short_read delivers the first half (rounded down to 512 B; the rest
//                  poisoned) with a short-read status (ShortReadStatus); slow_read holds the
//                  intact result on a timer thread for the delay, then delivers it.
//   chunk writes   write_hook(): a ChunkWriteHook (hw/chunk_store.h) through which the chunk
//                  store writes a chunk's extent: write_enospc / write_eio return the errno
//                  before any byte lands; the torn_write kinds really write the extent's first
//                  half (rounded down to 4 KiB: the file is O_DIRECT) and then return EIO
//                  (torn_write), kill the process with SIGKILL (torn_write_kill), or report
//                  success (torn_write_silent).
//   device calls   WrapBackend: a DeviceBackendWrapper (hw/device_backend.h) failing the chosen
//                  call with Status::CudaError, as a failed cudaMemcpyAsync or kernel would
//                  (buffers released, nothing copied).
//
// Nothing is retried: a faulted operation fails exactly as a real failure would, and the
// executor turns it into a failed run (issue 12). A run without a plan never creates an
// injector, so none of this is on its path.
//
// Thread safety: the counters are atomic; the wrappers may be called from any thread the real
// engine, store and backend are called from. The injector must outlive everything it wrapped.

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/fault_plan.h"
#include "hw/chunk_store.h"
#include "hw/device_backend.h"
#include "hw/io_engine.h"

namespace kvtier::hw {

class FaultInjector : public ChunkWriteHook {
 public:
  explicit FaultInjector(FaultPlan plan);
  ~FaultInjector() override;

  const FaultPlan& plan() const { return plan_; }

  // Counts one event of `cls` and returns the rule that applies to it (the first listed), or
  // nullptr. What the wrappers call; public for tests.
  const FaultRule* Next(FaultClass cls);

  // Events seen per class, faults injected per kind, so far.
  std::uint64_t events(FaultClass cls) const;
  std::uint64_t injected(FaultKind kind) const;

  // The decorators. Each takes ownership of what it wraps.
  std::unique_ptr<IoEngine> WrapIoEngine(std::unique_ptr<IoEngine> engine);
  std::unique_ptr<DeviceBackend> WrapBackend(std::unique_ptr<DeviceBackend> backend);
  // For ChunkStoreOptions::write_hook (this object).
  ChunkWriteHook* write_hook() { return this; }

  int WriteExtent(ChunkId id, int fd, std::span<const std::byte> extent,
                  std::uint64_t offset) override;

 private:
  const FaultPlan plan_;
  std::atomic<std::uint64_t> events_[kNumFaultClasses] = {};
  std::atomic<std::uint64_t> injected_[kNumFaultKinds] = {};
};

}  // namespace kvtier::hw
