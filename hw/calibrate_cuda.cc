// The CUDA half of `kvtier calibrate` (hw/calibrate_cuda.h). Written against the CUDA 13
// runtime headers installed here; no GPU was present where it was written, so it has compiled
// but not run (docs/hw-mode.md says so until a GPU machine runs it).

#include "hw/calibrate_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "hw/arena.h"
#include "hw/calibrate_gather.h"
#include "hw/posix_util.h"
#include "kernels/cublas_gemm.h"

namespace kvtier::hw {
namespace {

Status Cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::CudaError("calibrate: " + what + ": " + cudaGetErrorString(e));
}

// cuda_runtime_api.h has only the void** forms (the typed templates live in cuda_runtime.h).
template <class T>
cudaError_t DeviceAlloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double WallSeconds(std::int64_t t0) { return double(MonotonicNowNs() - t0) * 1e-9; }

std::uint64_t CycleOffset(std::uint64_t i, std::uint64_t size, std::uint64_t arena) {
  const std::uint64_t step = RoundUp(size, 4096) + 4096;
  const std::uint64_t slots = std::max<std::uint64_t>(1, (arena - size) / step);
  return (i % slots) * step;
}

// Everything allocated here, released in reverse on every path.
struct Resources {
  std::unique_ptr<HostArena> pinned;   // cudaHostRegister'ed, as the cuda backend pins arenas
  unsigned char* mapped = nullptr;     // cudaHostAllocMapped (zero-copy) for the gather kernel
  unsigned char* dev = nullptr;
  unsigned char* dev2 = nullptr;
  CalibrateGatherRun* runs = nullptr;  // device array
  float* gemm = nullptr;               // A, B, C of the GEMM
  cudaStream_t s = nullptr, s2 = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ~Resources() {
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    if (s2) cudaStreamDestroy(s2);
    if (gemm) cudaFree(gemm);
    if (runs) cudaFree(runs);
    if (dev2) cudaFree(dev2);
    if (dev) cudaFree(dev);
    if (mapped) cudaFreeHost(mapped);
  }
};

}  // namespace

Status CalibrateCuda(const CalibrateOptions& o, CalibrateResult* r) {
  const bool q = o.quick;
  cudaDeviceProp prop{};
  KVTIER_RETURN_IF_ERROR(Cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties"));
  r->backend = "cuda";
  r->gpu_name = prop.name;
  const std::uint64_t big = q ? (64ull << 20) : (256ull << 20);
  Resources res;
  {
    HostArenaOptions ho;
    ho.slot_bytes = big;
    ho.slot_count = 1;
    KVTIER_RETURN_IF_ERROR(HostArena::Create(ho, &res.pinned));
    KVTIER_RETURN_IF_ERROR(Cuda(cudaHostRegister(res.pinned->base(), res.pinned->size_bytes(),
                                                 cudaHostRegisterPortable),
                                "cudaHostRegister"));
    res.pinned->SetPinned([](std::byte* base) { cudaHostUnregister(base); });
  }
  unsigned char* host = reinterpret_cast<unsigned char*>(res.pinned->base());
  KVTIER_RETURN_IF_ERROR(Cuda(DeviceAlloc(&res.dev, big), "cudaMalloc"));
  KVTIER_RETURN_IF_ERROR(Cuda(DeviceAlloc(&res.dev2, big), "cudaMalloc"));
  KVTIER_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&res.s, cudaStreamNonBlocking), "stream"));
  KVTIER_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&res.s2, cudaStreamNonBlocking), "stream"));
  KVTIER_RETURN_IF_ERROR(Cuda(cudaEventCreate(&res.e0), "event"));
  KVTIER_RETURN_IF_ERROR(Cuda(cudaEventCreate(&res.e1), "event"));
  const int reps = q ? 1 : 3;
  auto sync = [&](cudaStream_t st) { return Cuda(cudaStreamSynchronize(st), "sync"); };

  // --- cudaMemcpyAsync H2D curve: N calls then one sync, wall time (issue + execution: what a
  // stream of per-row copies costs).
  r->copy_curve.clear();
  const std::uint64_t budget = q ? (64ull << 20) : (1024ull << 20);
  for (std::uint64_t size = 256; size <= (q ? (4ull << 20) : (64ull << 20)); size *= 4) {
    const std::uint64_t calls = std::clamp<std::uint64_t>(budget / size, 8, q ? 2000 : 20000);
    std::vector<double> t;
    for (int rep = 0; rep < reps + 1; ++rep) {  // the first is a warm-up
      const std::int64_t t0 = MonotonicNowNs();
      for (std::uint64_t i = 0; i < calls; ++i) {
        KVTIER_RETURN_IF_ERROR(Cuda(
            cudaMemcpyAsync(res.dev + CycleOffset(i * 7 + 3, size, big),
                            host + CycleOffset(i, size, big), size, cudaMemcpyHostToDevice, res.s),
            "cudaMemcpyAsync"));
      }
      KVTIER_RETURN_IF_ERROR(sync(res.s));
      if (rep > 0) t.push_back(WallSeconds(t0));
    }
    r->copy_curve.push_back({double(size), double(calls), Median(t)});
  }
  r->copy_fit = FitCopyCurve(r->copy_curve);
  r->copy_method = "cudaMemcpyAsync H2D from a cudaHostRegister'ed arena, N calls + one sync";
  if (r->copy_fit.ok) {
    r->h2d_bw = r->copy_fit.bw;
    r->pcie_latency_s = std::max(0.0, r->copy_fit.latency_s);
  }
  {
    const std::uint64_t size = q ? (16ull << 20) : (64ull << 20);
    std::vector<double> t;
    for (int rep = 0; rep < reps + 1; ++rep) {
      const std::int64_t t0 = MonotonicNowNs();
      for (std::uint64_t off = 0; off + size <= big; off += size) {
        KVTIER_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(host + off, res.dev + off, size,
                                                    cudaMemcpyDeviceToHost, res.s),
                                    "cudaMemcpyAsync D2H"));
      }
      KVTIER_RETURN_IF_ERROR(sync(res.s));
      if (rep > 0) t.push_back(WallSeconds(t0));
    }
    r->d2h_bw = double(big / size * size) / Median(t);
  }

  // --- cudaMemcpyBatchAsync: M calls of n descriptors then one sync; per call = wall / M.
  r->batches.clear();
  {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t attr_index = 0;
    std::uint64_t cursor = 0;
    for (std::uint64_t size : {std::uint64_t(256), std::uint64_t(4096)}) {
      for (int n : {1, 4, 16, 64, 256, 1024}) {
        const int calls = q ? std::max(5, 2000 / n) : std::max(20, 20000 / n);
        std::vector<void*> dsts(std::size_t(n) * std::size_t(calls));
        std::vector<const void*> srcs(dsts.size());
        std::vector<std::size_t> sizes(dsts.size(), size);
        for (std::size_t i = 0; i < dsts.size(); ++i, ++cursor) {
          dsts[i] = res.dev + CycleOffset(cursor * 7 + 3, size, big);
          srcs[i] = host + CycleOffset(cursor, size, big);
        }
        std::vector<double> t;
        for (int rep = 0; rep < reps + 1; ++rep) {
          const std::int64_t t0 = MonotonicNowNs();
          for (int c = 0; c < calls; ++c) {
            const std::size_t at = std::size_t(c) * std::size_t(n);
            KVTIER_RETURN_IF_ERROR(
                Cuda(cudaMemcpyBatchAsync(dsts.data() + at, srcs.data() + at, sizes.data() + at,
                                          std::size_t(n), &attr, &attr_index, 1, res.s),
                     "cudaMemcpyBatchAsync"));
          }
          KVTIER_RETURN_IF_ERROR(sync(res.s));
          if (rep > 0) t.push_back(WallSeconds(t0) / calls);
        }
        r->batches.push_back({double(n), double(n) * double(size), Median(t)});
      }
    }
    r->batch_fit = FitBatch(r->batches);
    r->batch_method = "cudaMemcpyBatchAsync (srcAccessOrder Stream), M calls + one sync";
    r->batch_latency_s = r->batch_fit.ok ? std::max(0.0, r->batch_fit.batch_latency_s) : 0;
    r->descriptor_cost_s = r->batch_fit.ok ? std::max(0.0, r->batch_fit.descriptor_cost_s) : 0;
  }

  // --- Gather kernel over mapped pinned memory: 4 KiB rows, 16 of each 64-row chunk.
  const int blocks = std::max(1, prop.multiProcessorCount);
  const int threads = 512;
  double gather_s = 0;
  int n_runs = 0;
  {
    KVTIER_RETURN_IF_ERROR(Cuda(cudaHostAlloc(reinterpret_cast<void**>(&res.mapped), big, cudaHostAllocMapped),
                                "cudaHostAlloc(mapped)"));
    unsigned char* mapped_dev = nullptr;
    KVTIER_RETURN_IF_ERROR(
        Cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped_dev), res.mapped, 0),
             "cudaHostGetDevicePointer"));
    const std::uint64_t row = 4096, chunk = 64 * row;
    std::vector<CalibrateGatherRun> runs;
    std::uint64_t out = 0;
    for (std::uint64_t c = 0; c + chunk <= big; c += chunk) {
      for (int k = 0; k < 16; ++k) {
        runs.push_back({c + std::uint64_t(k) * 4 * row, out, row});
        out += row;
      }
    }
    n_runs = int(runs.size());
    KVTIER_RETURN_IF_ERROR(
        Cuda(DeviceAlloc(&res.runs, runs.size() * sizeof(CalibrateGatherRun)), "cudaMalloc"));
    KVTIER_RETURN_IF_ERROR(Cuda(cudaMemcpy(res.runs, runs.data(),
                                           runs.size() * sizeof(CalibrateGatherRun),
                                           cudaMemcpyHostToDevice),
                                "cudaMemcpy runs"));
    std::vector<double> t;
    for (int rep = 0; rep < reps + 1; ++rep) {
      KVTIER_RETURN_IF_ERROR(Cuda(cudaEventRecord(res.e0, res.s), "event"));
      KVTIER_RETURN_IF_ERROR(Cuda(LaunchCalibrateGather(mapped_dev, res.dev2, res.runs, n_runs,
                                                        blocks, threads, res.s),
                                  "gather kernel"));
      KVTIER_RETURN_IF_ERROR(Cuda(cudaEventRecord(res.e1, res.s), "event"));
      KVTIER_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(res.e1), "event sync"));
      float ms = 0;
      cudaEventElapsedTime(&ms, res.e0, res.e1);
      if (rep > 0) t.push_back(double(ms) * 1e-3);
    }
    gather_s = Median(t);
    r->gpu_gather_bw = double(out) / gather_s;

    // --- SM share: a cuBLAS fp32 GEMM alone, then with the gather kernel running beside it
    // on another stream (launched first, enough launches to outlast the GEMMs).
    std::unique_ptr<kernels::CublasGemm> gemm;
    KVTIER_RETURN_IF_ERROR(kernels::CublasGemm::Create(&gemm));
    const int n = q ? 2048 : 4096;
    const std::size_t elems = std::size_t(n) * std::size_t(n);
    KVTIER_RETURN_IF_ERROR(Cuda(DeviceAlloc(&res.gemm, 3 * elems * sizeof(float)), "cudaMalloc"));
    KVTIER_RETURN_IF_ERROR(Cuda(cudaMemset(res.gemm, 0, 3 * elems * sizeof(float)), "memset"));
    const int gemms = q ? 5 : 20;
    auto time_gemms = [&](double* seconds) -> Status {
      KVTIER_RETURN_IF_ERROR(Cuda(cudaEventRecord(res.e0, res.s), "event"));
      for (int i = 0; i < gemms; ++i) {
        KVTIER_RETURN_IF_ERROR(gemm->Gemm(n, n, n, res.gemm, res.gemm + elems, false,
                                          res.gemm + 2 * elems, res.s));
      }
      KVTIER_RETURN_IF_ERROR(Cuda(cudaEventRecord(res.e1, res.s), "event"));
      KVTIER_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(res.e1), "event sync"));
      float ms = 0;
      cudaEventElapsedTime(&ms, res.e0, res.e1);
      *seconds = double(ms) * 1e-3;
      return Status::OK();
    };
    double alone = 0, beside = 0;
    KVTIER_RETURN_IF_ERROR(time_gemms(&alone));  // warm-up (cuBLAS heuristics, clocks)
    KVTIER_RETURN_IF_ERROR(time_gemms(&alone));
    const int launches = int(std::ceil(alone / gather_s)) + 2;
    for (int i = 0; i < launches; ++i) {
      KVTIER_RETURN_IF_ERROR(Cuda(LaunchCalibrateGather(mapped_dev, res.dev2, res.runs, n_runs,
                                                        blocks, threads, res.s2),
                                  "gather kernel"));
    }
    KVTIER_RETURN_IF_ERROR(time_gemms(&beside));
    KVTIER_RETURN_IF_ERROR(sync(res.s2));
    r->gpu_gather_sm_share = std::clamp(beside / alone - 1, 0.0, 1.0);
    char b[400];
    std::snprintf(b, sizeof b,
                  "gather kernel (%d blocks x %d threads, 16-byte words) over cudaHostAllocMapped "
                  "memory, 4 KiB rows, 16 of each 64-row chunk: %.3f GB/s; sm_share = slowdown "
                  "of %d fp32 cuBLAS %dx%dx%d GEMMs beside it: %.3f ms vs %.3f ms alone",
                  blocks, threads, r->gpu_gather_bw / 1e9, gemms, n, n, n, beside * 1e3,
                  alone * 1e3);
    r->device_gather_method = b;
  }

  // --- Device memory bandwidth: device-to-device copy (read + write).
  {
    KVTIER_RETURN_IF_ERROR(Cuda(cudaEventRecord(res.e0, res.s), "event"));
    KVTIER_RETURN_IF_ERROR(
        Cuda(cudaMemcpyAsync(res.dev2, res.dev, big, cudaMemcpyDeviceToDevice, res.s), "D2D"));
    KVTIER_RETURN_IF_ERROR(Cuda(cudaEventRecord(res.e1, res.s), "event"));
    KVTIER_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(res.e1), "event sync"));
    float ms = 0;
    cudaEventElapsedTime(&ms, res.e0, res.e1);
    r->mem_bw = 2.0 * double(big) / (double(ms) * 1e-3);
  }
  r->gemm_flops = 0;  // the fp32 cuBLAS rate is not the fp16 rate the model uses: keep datasheet
  return Status::OK();
}

}  // namespace kvtier::hw
