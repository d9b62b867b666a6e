#include "hw/calibrate_gather.h"

namespace kvtier::hw {
namespace {

__global__ void CalibrateGatherKernel(const unsigned char* src, unsigned char* dst,
                                      const CalibrateGatherRun* runs, int n) {
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const CalibrateGatherRun run = runs[r];
    const unsigned char* s = src + run.src_offset;
    unsigned char* d = dst + run.dst_offset;
    if (((run.src_offset | run.dst_offset | run.bytes) & 15) == 0 &&
        ((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15) ==
            0) {
      const uint4* s4 = reinterpret_cast<const uint4*>(s);
      uint4* d4 = reinterpret_cast<uint4*>(d);
      const std::uint64_t words = run.bytes / 16;
      for (std::uint64_t i = threadIdx.x; i < words; i += blockDim.x) d4[i] = s4[i];
    } else {
      for (std::uint64_t i = threadIdx.x; i < run.bytes; i += blockDim.x) d[i] = s[i];
    }
  }
}

}  // namespace

cudaError_t LaunchCalibrateGather(const unsigned char* src, unsigned char* dst,
                                  const CalibrateGatherRun* runs, int n, int blocks, int threads,
                                  cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  CalibrateGatherKernel<<<blocks, threads, 0, stream>>>(src, dst, runs, n);
  return cudaGetLastError();
}

}  // namespace kvtier::hw
