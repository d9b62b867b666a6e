// GPU tests of the CUDA transfer strategies (label gpu): the device-gather kernel against its
// CPU reference, and the cuda backend's per-run copies, batched copy (cudaMemcpyBatchAsync) and
// device gather (a kernel over mapped pinned memory) moving the same bytes to the same places.
// Fresh random inputs, poisoned outputs. They skip (GTEST_SKIP) where no CUDA device is present:
// as of this writing they have never run on a GPU (none was available; docs/hw-mode.md).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "hw/device_backend.h"
#include "kernels/cuda_ops.h"
#include "kernels/reference.h"

namespace kvtier::hw {
namespace {

bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Runs over a source of `src_bytes` into a destination: random lengths (some 16-byte multiples
// at 16-byte offsets, some odd), disjoint destinations back to back.
std::vector<kernels::CopyRun> RandomRuns(std::mt19937& rng, std::byte* src, Bytes src_bytes,
                                         std::byte* dst, Bytes dst_bytes, int n) {
  std::vector<kernels::CopyRun> runs;
  Bytes out = 0;
  for (int i = 0; i < n; ++i) {
    const bool aligned = rng() % 2 == 0;
    Bytes len = 1 + rng() % 3000;
    Bytes off = rng() % (src_bytes - len);
    if (aligned) {
      len = (len + 15) / 16 * 16;
      off = off / 16 * 16;
      out = (out + 15) / 16 * 16;
    }
    if (off + len > src_bytes || out + len > dst_bytes) break;
    runs.push_back({dst + out, src + off, len});
    out += len;
  }
  return runs;
}

TEST(CudaGatherRuns, KernelMatchesTheCpuReference) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const std::uint32_t seed = std::random_device{}();
  RecordProperty("seed", int(seed));
  std::mt19937 rng(seed);
  constexpr Bytes kSrc = 1 << 20, kDst = 1 << 20;
  // Source and descriptors in mapped pinned host memory (the kernel reads them over PCIe).
  void* src_h = nullptr;
  ASSERT_EQ(cudaHostAlloc(&src_h, kSrc, cudaHostAllocMapped), cudaSuccess);
  auto* src = static_cast<std::byte*>(src_h);
  for (Bytes i = 0; i < kSrc; ++i) src[i] = std::byte(rng());
  void* src_d = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&src_d, src_h, 0), cudaSuccess);
  void* dst_d = nullptr;
  ASSERT_EQ(cudaMalloc(&dst_d, kDst), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst_d, 0xEE, kDst), cudaSuccess);  // poisoned
  std::vector<std::byte> ref(kDst, std::byte{0xEE});
  // The same runs twice: over the device pointers (kernel) and the host copies (reference).
  std::mt19937 plan(seed + 1);
  std::vector<kernels::CopyRun> dev_runs =
      RandomRuns(plan, static_cast<std::byte*>(src_d), kSrc, static_cast<std::byte*>(dst_d),
                 kDst, 700);
  plan.seed(seed + 1);
  std::vector<kernels::CopyRun> ref_runs = RandomRuns(plan, src, kSrc, ref.data(), kDst, 700);
  ASSERT_EQ(dev_runs.size(), ref_runs.size());
  void* runs_h = nullptr;
  ASSERT_EQ(cudaHostAlloc(&runs_h, dev_runs.size() * sizeof(kernels::CopyRun), cudaHostAllocMapped),
            cudaSuccess);
  std::memcpy(runs_h, dev_runs.data(), dev_runs.size() * sizeof(kernels::CopyRun));
  void* runs_d = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&runs_d, runs_h, 0), cudaSuccess);
  ASSERT_TRUE(kernels::GatherRunsCuda(static_cast<const kernels::CopyRun*>(runs_d),
                                      std::int64_t(dev_runs.size()), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(kernels::GatherRunsRef(ref_runs.data(), std::int64_t(ref_runs.size())).ok());
  std::vector<std::byte> got(kDst);
  ASSERT_EQ(cudaMemcpy(got.data(), dst_d, kDst, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, ref);
  cudaFree(dst_d);
  cudaFreeHost(runs_h);
  cudaFreeHost(src_h);
}

TEST(CudaBackendStrategies, PerRunBatchedAndDeviceGatherMoveTheSameBytes) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  DeviceBackendOptions o;
  o.model.name = "t";
  o.model.layers = 1;
  o.model.hidden = 64;
  o.model.heads = 4;
  o.model.kv_heads = 4;
  o.model.head_dim = 16;
  o.model.ffn = 128;
  o.model.vocab = 10;
  o.model.dtype_bytes = 2;
  HostClock clock;
  std::unique_ptr<DeviceBackend> b;
  const Status created = CreateCudaBackend(o, &clock, &b);
  ASSERT_TRUE(created.ok()) << created.ToString();
  ASSERT_TRUE(b->OnClockReset().ok());
  constexpr Bytes kChunk = 64 * 1024, kRow = 1024;
  std::unique_ptr<HostArena> host;
  ASSERT_TRUE(b->AllocateHost({kChunk, 1, false, true}, &host).ok());
  ASSERT_TRUE(host->pinned());
  std::mt19937 rng(std::random_device{}());
  for (Bytes i = 0; i < kChunk; ++i) host->slot(0)[i] = std::byte(rng());
  std::unique_ptr<DeviceArena> dev;
  ASSERT_TRUE(b->AllocateDevice(kChunk, 3, &dev).ok());
  ASSERT_EQ(cudaMemset(dev->slot(0), 0xEE, DeviceArena::SlotStride(kChunk) * 3), cudaSuccess);
  std::vector<std::uint16_t> rows;
  for (std::uint16_t r = 0; r < 64; ++r) {
    if (rng() % 3 != 0) rows.push_back(r);
  }
  auto pieces = [&](std::uint32_t slot) {
    std::vector<CopyPiece> p;
    AppendRunPieces(host->slot(0), kChunk, rows, kRow, rows.size() * kRow, dev->slot(slot), kChunk,
                    &p);
    return p;
  };
  Interval when;
  const std::vector<CopyPiece> per_run = pieces(0);
  Status s = b->Copy(CopyDirection::kHostToDevice, per_run, std::uint32_t(per_run.size()), {},
                     &when);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = b->CopyBatched(pieces(1), {}, &when);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = b->DeviceGather(pieces(2), {}, &when);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // The CPU reference: the runs' bytes back to back, the rest poisoned.
  std::vector<std::byte> want(kChunk, std::byte{0xEE});
  std::vector<kernels::CopyRun> runs;
  for (const CopyPiece& p : per_run) {
    runs.push_back({want.data() + (p.dst - dev->slot(0)), p.src, p.bytes});
  }
  ASSERT_TRUE(kernels::GatherRunsRef(runs.data(), std::int64_t(runs.size())).ok());
  for (std::uint32_t slot = 0; slot < 3; ++slot) {
    std::vector<std::byte> got(kChunk);
    ASSERT_EQ(cudaMemcpy(got.data(), dev->slot(slot), kChunk, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, want) << "slot " << slot << " (0 per-run, 1 batched, 2 device gather)";
  }
  // A device gather from memory that is not a mapped arena is refused, not a crash.
  std::vector<std::byte> plain(kRow);
  const CopyPiece stray[] = {{dev->slot(0), plain.data(), kRow}};
  s = b->DeviceGather(stray, {}, &when);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace kvtier::hw
