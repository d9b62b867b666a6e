#pragma once
// DeviceBackend: what differs between running the hw path on the host alone and on a CUDA
// device, behind one interface (notes/hw-path.md 6.6), so that HwExecutor (hw/hw_executor.h)
// keeps only the scheduling -- lanes, dependencies, residency, rings -- and never asks which
// device it runs on. What a backend does:
//
//   memory      host arenas (pinned with cudaHostRegister on cuda, so an H2D copy from a slot
//               is a DMA) and device arenas (one cudaMalloc on cuda; on host a separate
//               mapping standing in for device memory, never one small hot buffer: notes 2.5);
//   copies      H2D / D2H of a list of pieces -- one per chunk, one per run of rows, or one
//               per kind of a staged (gathered) layer -- on the direction's stream: memcpy
//               paced to the configured link on host, cudaMemcpyAsync on a dedicated stream
//               on cuda, one DMA call per piece (transfer.strategy, docs/hw-mode.md);
//   batched     H2D of many pieces in ONE call, a descriptor per piece: cudaMemcpyBatchAsync
//               on cuda; on host the same pieces memcpy'd, paced as the simulator charges it;
//   device      H2D of many row runs by ONE gather kernel reading mapped (zero-copy) pinned
//   gather      host memory on cuda; on host the same runs memcpy'd, paced as charged;
//   gathers     selected rows of chunks in host memory into a contiguous buffer (both
//               backends gather on the CPU: the rows are in host memory);
//   compute     one ComputeOp: the cost model's duration slept (`modeled`) or Eigen at the
//               model's shapes (`real`) on host; cuBLAS GEMMs at the model's shapes on cuda;
//   timestamps  the copies and compute report when they ran in executor seconds (HostClock);
//               cuda maps its events to host time through one anchor event per clock reset.
//
// Every call returns a Status: a CUDA error is a failed operation, never a crash, and a test
// injects failures at this interface with DeviceBackendWrapper (HwExecutorOptions::
// wrap_backend). CreateDeviceBackend picks the implementation: hw/host_backend.cc always,
// hw/cuda_backend.cc only when kvtier is built with CUDA (hw/no_cuda_backend.cc otherwise).
//
// Thread safety: a backend serves one HwExecutor. Allocation, WriteDevice and OnClockReset are
// called during setup, with no lane running; then Copy(kHostToDevice), CopyBatched and
// DeviceGather (the H2D lane), Copy(kDeviceToHost), Gather and Compute are each called from
// their own lane thread, one call at a time per lane, concurrently across lanes.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/options.h"
#include "core/status.h"
#include "hw/arena.h"
#include "hw/posix_util.h"
#include "models/layer_table.h"

namespace kvtier::hw {

enum class BackendKind { kAuto, kHost, kCuda };
enum class ComputeMode { kModeled, kReal };
std::string_view DeviceBackendName(BackendKind b);  // "auto" | "host" | "cuda"
std::string_view ComputeModeName(ComputeMode m);    // "modeled" | "real"

// True when kvtier was built with CUDA and cudaGetDeviceCount reports at least one device.
bool CudaDevicePresent();

// The executor's clock: host CLOCK_MONOTONIC seconds since Reset (the start of the run).
// Thread-safe.
class HostClock {
 public:
  HostClock() { Reset(); }
  void Reset() { t0_ns_.store(MonotonicNowNs()); }
  std::int64_t t0_ns() const { return t0_ns_.load(); }
  Seconds ToSeconds(std::int64_t monotonic_ns) const {
    return double(monotonic_ns - t0_ns_.load()) * 1e-9;
  }
  Seconds Now() const { return ToSeconds(MonotonicNowNs()); }

 private:
  std::atomic<std::int64_t> t0_ns_{0};
};

// When a copy or compute step ran, in executor seconds.
struct Interval {
  Seconds start_s = 0;
  Seconds end_s = 0;
};

enum class CopyDirection : std::uint8_t { kHostToDevice, kDeviceToHost };

// One contiguous copy. `dst` and `src` are host or device pointers as the direction says;
// pieces of 0 bytes are skipped.
struct CopyPiece {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  Bytes bytes = 0;
};

// Runs of rows (DESIGN-14): a run is a maximal sequence of consecutive stored rows in the
// order given (rows r, r+1, r+2, ...); a chunk's sorted rows split into runs at every gap, and a
// whole chunk is one run. The simulator charges per run; hw issues one piece per run.
std::uint32_t CountRowRuns(std::span<const std::uint16_t> rows);

// The pieces of `rows` of one chunk, one per run: row r starts at r * row_stride of `src`
// (`src_bytes` long); the runs go back to back from `dst` (`dst_bytes` of room). `bytes` (the
// op's bytes of this chunk: the rows' bytes, less than rows x stride when only some heads of a
// row are selected) is shared among the rows evenly -- row i of n ends at floor((i + 1) x
// bytes / n) -- so the pieces cover exactly `bytes`, each run copying its rows' share from its
// first row's offset. Appends one piece per run to *pieces, stopping at the first run that
// does not fit in the source or the destination; returns the bytes the appended pieces cover.
Bytes AppendRunPieces(const std::byte* src, Bytes src_bytes, std::span<const std::uint16_t> rows,
                      Bytes row_stride, Bytes bytes, std::byte* dst, Bytes dst_bytes,
                      std::vector<CopyPiece>* pieces);

struct DeviceBackendOptions {
  ModelSpec model;
  HardwareOptions hardware;              // pcie.* for pacing
  std::optional<ComputeTimer> timer;     // modeled compute (host): REQUIRED for kHost
  ComputeMode compute = ComputeMode::kModeled;
  bool pace_pcie = true;                 // host: copies take at least bytes / bw + latency each
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // kHost or kCuda.
  virtual BackendKind kind() const = 0;

  // ---- memory (setup) ----

  // A host arena as `options` describe, pinned for the device when it has one (pinned() then).
  // OutOfSpace when the mapping fails, CudaError when pinning fails.
  virtual Status AllocateHost(const HostArenaOptions& options,
                              std::unique_ptr<HostArena>* out) = 0;
  // A device arena of `slot_count` slots of at least `slot_bytes` (DeviceArena::SlotStride).
  // REQUIRES: slot_bytes > 0, slot_count > 0. OutOfSpace / CudaError when it cannot be had.
  virtual Status AllocateDevice(Bytes slot_bytes, std::uint32_t slot_count,
                                std::unique_ptr<DeviceArena>* out) = 0;
  // Copies `bytes` of host memory to device memory at `dst` and returns when they are there.
  // Setup only (prewarm), untimed.
  virtual Status WriteDevice(std::byte* dst, const std::byte* src, Bytes bytes) = 0;

  // ---- work (one lane each) ----

  // Copies `pieces` in order on the stream of `direction`; returns when the copy is over,
  // with *when (its start, and its end: on host no earlier than the paced end, bytes / bw +
  // `copies` x pcie.latency after the start). `copies` is how many copies the op stands for
  // (its pieces, or the I/Os of a bytes-only op). `release`, when set, is called once, as
  // soon as the buffers are no longer in use -- every byte in place, or the copy failed --
  // before any pacing wait, so the caller can hand them on early. A failed copy returns
  // CudaError with the CUDA text; *when is still filled in.
  virtual Status Copy(CopyDirection direction, std::span<const CopyPiece> pieces,
                      std::uint32_t copies, const std::function<void()>& release,
                      Interval* when) = 0;
  // Copies `pieces` host to device in ONE batched-copy call on the H2D stream, one descriptor
  // per piece (cudaMemcpyBatchAsync; the order of the pieces inside the batch is not
  // guaranteed, so pieces must not overlap). On host: the pieces memcpy'd, and (pace_pcie) the
  // call lasts at least bytes / pcie.h2d_bw + pcie.batch_latency + pieces x
  // pcie.descriptor_cost, the simulator's charge for one batched call. `release` and *when as
  // for Copy.
  virtual Status CopyBatched(std::span<const CopyPiece> pieces,
                             const std::function<void()>& release, Interval* when) = 0;
  // Copies `pieces` (row runs) host to device with ONE gather kernel on the H2D stream that
  // reads the sources as mapped (zero-copy) pinned host memory. REQUIRES (cuda): every source
  // lies in a host arena this backend allocated (those are mapped), else InvalidArgument. On
  // host: the runs memcpy'd, and (pace_pcie) the call lasts at least bytes / min(pcie.h2d_bw,
  // gpu.gather_bw) + gpu.kernel_overhead, the simulator's charge; modeled compute that runs
  // while it does is slowed by gpu.gather_sm_share of the overlap (the kernel's SM use).
  // `release` and *when as for Copy.
  virtual Status DeviceGather(std::span<const CopyPiece> pieces,
                              const std::function<void()>& release, Interval* when) = 0;
  // Copies `pieces` (host memory to host memory: selected rows into a gather buffer, one
  // memcpy per piece) and returns when they are in place.
  virtual Status Gather(std::span<const CopyPiece> pieces) = 0;
  // Runs one compute step and returns when it is over, with *when. `ready_s` (executor clock)
  // is when the step became ready to run -- its dependencies done -- before the hand-off to
  // the thread that runs it. Modeled compute on the host ends the modeled duration after it,
  // the hand-off standing in for the step's launch (HostBackend); a real device ignores it.
  virtual Status Compute(const ComputeOp& op, Seconds ready_s, Interval* when) = 0;

  // The executor's clock was reset (HostClock::Reset): the backend re-anchors its device
  // timestamps to it. Setup only.
  virtual Status OnClockReset() = 0;
};

// A DeviceBackend that forwards every call to `target` (owned): derive from it and override
// one method to inject a failure or trace the calls (tests: HwExecutorOptions::wrap_backend).
class DeviceBackendWrapper : public DeviceBackend {
 public:
  explicit DeviceBackendWrapper(std::unique_ptr<DeviceBackend> target)
      : target_(std::move(target)) {}
  DeviceBackend* target() const { return target_.get(); }

  BackendKind kind() const override { return target_->kind(); }
  Status AllocateHost(const HostArenaOptions& options, std::unique_ptr<HostArena>* out) override {
    return target_->AllocateHost(options, out);
  }
  Status AllocateDevice(Bytes slot_bytes, std::uint32_t slot_count,
                        std::unique_ptr<DeviceArena>* out) override {
    return target_->AllocateDevice(slot_bytes, slot_count, out);
  }
  Status WriteDevice(std::byte* dst, const std::byte* src, Bytes bytes) override {
    return target_->WriteDevice(dst, src, bytes);
  }
  Status Copy(CopyDirection direction, std::span<const CopyPiece> pieces, std::uint32_t copies,
              const std::function<void()>& release, Interval* when) override {
    return target_->Copy(direction, pieces, copies, release, when);
  }
  Status CopyBatched(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                     Interval* when) override {
    return target_->CopyBatched(pieces, release, when);
  }
  Status DeviceGather(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                      Interval* when) override {
    return target_->DeviceGather(pieces, release, when);
  }
  Status Gather(std::span<const CopyPiece> pieces) override { return target_->Gather(pieces); }
  Status Compute(const ComputeOp& op, Seconds ready_s, Interval* when) override {
    return target_->Compute(op, ready_s, when);
  }
  Status OnClockReset() override { return target_->OnClockReset(); }

 private:
  std::unique_ptr<DeviceBackend> target_;
};

// The backend `kind` names (kAuto: cuda when a device is present, else host), timed by
// `clock` (not owned; outlives the backend). kCuda without a device, or in a build without
// CUDA, is Unavailable; a CUDA setup failure (streams, cuBLAS) is CudaError.
Status CreateDeviceBackend(BackendKind kind, DeviceBackendOptions options, const HostClock* clock,
                           std::unique_ptr<DeviceBackend>* out);

// The implementations (CreateDeviceBackend picks one).
Status CreateHostBackend(DeviceBackendOptions options, const HostClock* clock,
                         std::unique_ptr<DeviceBackend>* out);
Status CreateCudaBackend(DeviceBackendOptions options, const HostClock* clock,
                         std::unique_ptr<DeviceBackend>* out);

}  // namespace kvtier::hw
