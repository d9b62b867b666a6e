// The cuda backend (hw/device_backend.h): pinned host arenas, one cudaMalloc per device arena,
// cudaMemcpyAsync on a dedicated stream per direction, cuBLAS GEMMs at the model's shapes on a
// compute stream, each timed with CUDA events mapped to the executor's clock through one anchor
// event per clock reset (notes/hw-path.md 6.5.3). Plain C++ against the CUDA runtime API: built
// only when kvtier is built with CUDA (hw/CMakeLists.txt), no nvcc needed for this file.
// No device-wide synchronisation: each call waits on its own event (or stream) only.
//
// Transfer strategies (docs/hw-mode.md): a batched copy is one cudaMemcpyBatchAsync (the CUDA 13
// signature: no failIdx argument, unlike the 12.8 documentation); a device gather is one launch
// of kernels/ GatherRunsCuda over descriptors in mapped pinned memory, reading the rows through
// the device pointers of the host arenas, which are registered mapped. NEITHER HAS RUN: no GPU
// was available when they were written; they compile against the installed CUDA 13 headers
// and their tests (tests/hw/cuda_strategies_test.cc) skip without a device.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hw/device_backend.h"
#include "hw/posix_util.h"
#include "kernels/cublas_gemm.h"
#include "kernels/cuda_ops.h"
#include "kernels/layout.h"

namespace kvtier::hw {

bool CudaDevicePresent() {
  // Without a driver cudaGetDeviceCount fails (cudaErrorInsufficientDriver) and leaves the
  // count alone (notes/hw-path.md 5): start from 0 and test the return code.
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

namespace {

Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::CudaError(what + ": " + cudaGetErrorString(e));
}

class CudaBackend : public DeviceBackend {
 public:
  CudaBackend(DeviceBackendOptions options, const HostClock* clock)
      : options_(std::move(options)), clock_(clock) {}

  ~CudaBackend() override {
    gemm_.reset();
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (runs_ != nullptr) cudaFreeHost(runs_);
    if (anchor_ != nullptr) cudaEventDestroy(anchor_);
    for (cudaStream_t s : {h2d_, d2h_, compute_}) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }

  Status Init() {
    if (cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&anchor_) != cudaSuccess) {
      return Status::CudaError(std::string("stream/event creation failed: ") +
                               cudaGetErrorString(cudaGetLastError()));
    }
    return kernels::CublasGemm::Create(&gemm_);
  }

  BackendKind kind() const override { return BackendKind::kCuda; }

  Status AllocateHost(const HostArenaOptions& options, std::unique_ptr<HostArena>* out) override {
    std::unique_ptr<HostArena> arena;
    KVTIER_RETURN_IF_ERROR(HostArena::Create(options, &arena));
    // Mapped too: a device gather kernel reads the rows through the arena's device pointer.
    KVTIER_RETURN_IF_ERROR(CudaStatus(
        cudaHostRegister(arena->base(), arena->size_bytes(),
                         cudaHostRegisterPortable | cudaHostRegisterMapped),
        "host arena: cudaHostRegister " + std::to_string(arena->size_bytes()) + " bytes"));
    arena->SetPinned([](std::byte* base) { cudaHostUnregister(base); });
    void* dev = nullptr;
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&dev, arena->base(), 0),
                                      "host arena: cudaHostGetDevicePointer"));
    {
      std::lock_guard<std::mutex> l(mapped_mu_);
      mapped_.push_back({arena->base(), arena->size_bytes(), static_cast<std::byte*>(dev)});
    }
    *out = std::move(arena);
    return Status::OK();
  }

  Status AllocateDevice(Bytes slot_bytes, std::uint32_t slot_count,
                        std::unique_ptr<DeviceArena>* out) override {
    if (slot_bytes == 0 || slot_count == 0) {
      return Status::InvalidArgument("device arena: slot_bytes and slot_count must be > 0");
    }
    const Bytes bytes = DeviceArena::SlotStride(slot_bytes) * slot_count;
    void* p = nullptr;
    KVTIER_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&p, bytes), "device arena: cudaMalloc " + std::to_string(bytes) +
                                              " bytes"));
    *out = DeviceArena::Adopt(static_cast<std::byte*>(p), slot_bytes, slot_count,
                              [](std::byte* base) { cudaFree(base); });
    return Status::OK();
  }

  Status WriteDevice(std::byte* dst, const std::byte* src, Bytes bytes) override {
    return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                      "prewarm copy to the GPU arena");
  }

  Status Copy(CopyDirection direction, std::span<const CopyPiece> pieces, std::uint32_t copies,
              const std::function<void()>& release, Interval* when) override {
    const bool h2d = direction == CopyDirection::kHostToDevice;
    const std::string what = h2d ? "H2D copy failed" : "D2H copy failed";
    cudaStream_t stream = h2d ? h2d_ : d2h_;
    const cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    Timed timed(this, stream);
    Status status = timed.Begin(what);
    for (const CopyPiece& p : pieces) {
      if (!status.ok()) break;
      if (p.bytes == 0) continue;
      status = CudaStatus(cudaMemcpyAsync(p.dst, p.src, p.bytes, kind, stream), what);
    }
    status = timed.End(std::move(status), what, when);  // this op's event only
    if (release) release();
    return status;
  }

  // One cudaMemcpyBatchAsync on the H2D stream, a descriptor per piece; the sources are pinned
  // arenas accessed in stream order.
  Status CopyBatched(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                     Interval* when) override {
    const std::string what = "batched H2D copy failed";
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    for (const CopyPiece& p : pieces) {
      if (p.bytes == 0) continue;
      dsts.push_back(p.dst);
      srcs.push_back(p.src);
      sizes.push_back(p.bytes);
    }
    Timed timed(this, h2d_);
    Status status = timed.Begin(what);
    if (status.ok() && !dsts.empty()) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      std::size_t attr_index = 0;
      // CUDA 13: (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, stream).
      status = CudaStatus(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                               dsts.size(), &attr, &attr_index, 1, h2d_),
                          what);
    }
    status = timed.End(std::move(status), what, when);
    if (release) release();
    return status;
  }

  // One GatherRunsCuda launch on the H2D stream: the runs' sources become device pointers of
  // the mapped arenas, the descriptors go to mapped pinned memory the kernel reads directly.
  Status DeviceGather(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                      Interval* when) override {
    const std::string what = "device gather failed";
    Status status = EnsureRuns(pieces.size());
    std::int64_t n = 0;
    for (const CopyPiece& p : pieces) {
      if (!status.ok()) break;
      if (p.bytes == 0) continue;
      const std::byte* src = DevicePointerOf(p.src, p.bytes);
      if (src == nullptr) {
        status = Status::InvalidArgument(
            "device gather: a source is not in a mapped pinned host arena of this backend");
        break;
      }
      runs_[n++] = kernels::CopyRun{p.dst, src, p.bytes};
    }
    Timed timed(this, h2d_);
    if (status.ok()) status = timed.Begin(what);
    if (status.ok()) status = kernels::GatherRunsCuda(runs_device_, n, h2d_);
    status = timed.End(std::move(status), what, when);
    if (release) release();
    return status;
  }

  Status Gather(std::span<const CopyPiece> pieces) override {
    for (const CopyPiece& p : pieces) {  // host memory: a CPU gather, as on the host backend
      if (p.bytes > 0) std::memcpy(p.dst, p.src, p.bytes);
    }
    return Status::OK();
  }

  // cuBLAS GEMMs at the model's shapes (uninitialised scratch: timing only), attention as
  // per-head GEMMs, timed with events on the compute stream.
  Status Compute(const ComputeOp& c, Seconds /*ready_s*/, Interval* when) override {
    const ModelSpec& model = options_.model;
    const int d = model.hidden, hd = model.head_dim, H = model.heads, KV = model.kv_heads;
    const std::int64_t n = std::max<std::int64_t>(1, c.new_tokens);
    const std::int64_t m = std::max<std::int64_t>(n, c.context_tokens);
    const std::string what = "compute";
    Timed timed(this, compute_);
    Status status = timed.Begin(what);
    auto gemm = [&](std::int64_t mm, std::int64_t nn, std::int64_t kk) {
      if (!status.ok()) return;
      float* a = Scratch(std::size_t(mm * kk + kk * nn + mm * nn));
      if (a == nullptr) {
        status = Status::CudaError("cudaMalloc of compute scratch failed");
        return;
      }
      status = gemm_->Gemm(int32_t(mm), int32_t(nn), int32_t(kk), a, a + mm * kk, false,
                           a + mm * kk + kk * nn, compute_);
    };
    auto layer = [&](std::int64_t nn, std::int64_t mm) {
      gemm(nn, (H + 2 * KV) * hd, d);
      for (int h = 0; h < H; ++h) {
        gemm(nn, mm, hd);  // Q K^T
        gemm(nn, hd, mm);  // P V
      }
      gemm(nn, d, H * hd);
      const int mats = model.family == ModelFamily::kOpt ? 1 : 2;
      for (int i = 0; i < mats; ++i) gemm(nn, model.ffn, d);
      gemm(nn, d, model.ffn);
    };
    switch (c.kind) {
      case ComputeKind::kLayerPrefill: layer(n, m); break;
      case ComputeKind::kChunkPrefill:
        for (int l = 0; l < model.layers; ++l) layer(n, m);
        break;
      case ComputeKind::kDecodeStep:
        if (c.layer >= 0) {
          // One layer of a batched decode step: new_tokens rows, each attending the mean of
          // the context_tokens query-key pairs (core/executor.h).
          const std::int64_t rows = std::max<std::int64_t>(1, c.new_tokens);
          layer(rows, std::max<std::int64_t>(1, (c.context_tokens + rows - 1) / rows));
          break;
        }
        for (int l = 0; l < model.layers; ++l) layer(1, m);
        break;
      case ComputeKind::kProbeScores:
      case ComputeKind::kFullScores: {
        const int heads = (c.heads > 0 ? std::min(c.heads, KV) : KV) * std::max(1, H / KV);
        for (int h = 0; h < std::min(heads, H); ++h) {
          gemm(n, std::max<std::int64_t>(1, c.context_tokens), hd);
        }
        break;
      }
      case ComputeKind::kOutputLayer: gemm(1, model.vocab, d); break;
    }
    return timed.End(std::move(status), what, when);
  }

  Status OnClockReset() override {
    // The anchor: one event on an idle stream, synchronised once (setup time, not the
    // pipeline), so a CUDA event e maps to host time anchor_ns_ + elapsed(anchor, e).
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(anchor_, compute_), "anchor event"));
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(anchor_), "anchor event"));
    anchor_ns_ = MonotonicNowNs();
    return Status::OK();
  }

 private:
  // Start and end events of one op on `stream`, mapped to the executor's clock.
  class Timed {
   public:
    Timed(CudaBackend* backend, cudaStream_t stream) : b_(backend), stream_(stream) {}
    ~Timed() {
      if (e0_ != nullptr) cudaEventDestroy(e0_);
      if (e1_ != nullptr) cudaEventDestroy(e1_);
    }
    Status Begin(const std::string& what) {
      start_fallback_ = b_->clock_->Now();
      KVTIER_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e0_), what));
      KVTIER_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e1_), what));
      return CudaStatus(cudaEventRecord(e0_, stream_), what);
    }
    // Waits for the work queued since Begin; *when from the events, or the host clock when
    // the work failed. Returns `status` or the first error of the end event.
    Status End(Status status, const std::string& what, Interval* when) {
      if (status.ok()) status = CudaStatus(cudaEventRecord(e1_, stream_), what);
      if (status.ok()) status = CudaStatus(cudaEventSynchronize(e1_), what);
      if (!status.ok()) {
        cudaStreamSynchronize(stream_);  // nothing of this op may still be in flight
        *when = {start_fallback_, b_->clock_->Now()};
        return status;
      }
      float a = 0, b = 0;
      cudaEventElapsedTime(&a, b_->anchor_, e0_);
      cudaEventElapsedTime(&b, b_->anchor_, e1_);
      const Seconds base = b_->clock_->ToSeconds(b_->anchor_ns_);
      *when = {base + a * 1e-3, base + b * 1e-3};
      return CudaStatus(cudaGetLastError(), what);
    }

   private:
    CudaBackend* b_;
    cudaStream_t stream_;
    cudaEvent_t e0_ = nullptr, e1_ = nullptr;
    Seconds start_fallback_ = 0;
  };

  // The device pointer of host memory [p, p + bytes) inside a mapped arena, or null.
  const std::byte* DevicePointerOf(const std::byte* p, Bytes bytes) {
    std::lock_guard<std::mutex> l(mapped_mu_);
    for (auto it = mapped_.rbegin(); it != mapped_.rend(); ++it) {  // the latest mapping wins
      if (p >= it->host && p + bytes <= it->host + it->bytes) return it->device + (p - it->host);
    }
    return nullptr;
  }

  // Room for `n` run descriptors in mapped pinned memory (H2D lane only).
  Status EnsureRuns(std::size_t n) {
    if (n <= runs_capacity_) return Status::OK();
    if (runs_ != nullptr) cudaFreeHost(runs_);
    runs_ = nullptr;
    runs_device_ = nullptr;
    runs_capacity_ = 0;
    const std::size_t want = std::max<std::size_t>(n, 1024);
    void* host = nullptr;
    KVTIER_RETURN_IF_ERROR(CudaStatus(
        cudaHostAlloc(&host, want * sizeof(kernels::CopyRun), cudaHostAllocMapped),
        "device gather: cudaHostAlloc of the run descriptors"));
    runs_ = static_cast<kernels::CopyRun*>(host);
    void* dev = nullptr;
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&dev, host, 0),
                                      "device gather: cudaHostGetDevicePointer"));
    runs_device_ = static_cast<const kernels::CopyRun*>(dev);
    runs_capacity_ = want;
    return Status::OK();
  }

  float* Scratch(std::size_t floats) {
    if (floats > scratch_floats_) {
      if (scratch_ != nullptr) cudaFree(scratch_);
      scratch_ = nullptr;
      scratch_floats_ = 0;
      if (cudaMalloc(reinterpret_cast<void**>(&scratch_), floats * sizeof(float)) != cudaSuccess) {
        return nullptr;
      }
      scratch_floats_ = floats;
    }
    return scratch_;
  }

  DeviceBackendOptions options_;
  const HostClock* clock_;
  cudaStream_t h2d_ = nullptr, d2h_ = nullptr, compute_ = nullptr;
  cudaEvent_t anchor_ = nullptr;
  std::int64_t anchor_ns_ = 0;
  std::unique_ptr<kernels::CublasGemm> gemm_;
  float* scratch_ = nullptr;  // compute lane only
  std::size_t scratch_floats_ = 0;
  // Host arenas registered mapped: host base, size, device pointer (device gather sources).
  struct Mapped {
    std::byte* host;
    Bytes bytes;
    std::byte* device;
  };
  std::mutex mapped_mu_;
  std::vector<Mapped> mapped_;
  // Run descriptors of the device gather in mapped pinned memory (H2D lane only).
  kernels::CopyRun* runs_ = nullptr;
  const kernels::CopyRun* runs_device_ = nullptr;
  std::size_t runs_capacity_ = 0;
};

}  // namespace

Status CreateCudaBackend(DeviceBackendOptions options, const HostClock* clock,
                         std::unique_ptr<DeviceBackend>* out) {
  if (!CudaDevicePresent()) {
    return Status::Unavailable("hw.backend = cuda, but no CUDA device is present");
  }
  auto backend = std::make_unique<CudaBackend>(std::move(options), clock);
  KVTIER_RETURN_IF_ERROR(backend->Init());
  *out = std::move(backend);
  return Status::OK();
}

}  // namespace kvtier::hw
