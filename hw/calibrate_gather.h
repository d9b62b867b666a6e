#pragma once
// The gather kernel `kvtier calibrate` times on a CUDA device (hw/calibrate_cuda.h): copies
// runs of bytes from (mapped, zero-copy) host memory into device memory. A minimal kernel of
// calibrate's own, kept apart from the backend's; C++17 and CUDA headers only (nvcc compiles
// hw/calibrate_gather.cu).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::hw {

// One run: `bytes` from src + src_offset to dst + dst_offset.
struct CalibrateGatherRun {
  std::uint64_t src_offset;
  std::uint64_t dst_offset;
  std::uint64_t bytes;
};

// Launches `blocks` blocks of `threads` threads; each block copies runs blockIdx.x,
// blockIdx.x + gridDim.x, ... (16-byte words when the run and both ends are 16-byte aligned,
// bytes otherwise). `src` is a device pointer to mapped host memory (cudaHostGetDevicePointer),
// `runs` a device array of `n` runs. Asynchronous on `stream`; returns the launch error.
cudaError_t LaunchCalibrateGather(const unsigned char* src, unsigned char* dst,
                                  const CalibrateGatherRun* runs, int n, int blocks, int threads,
                                  cudaStream_t stream);

}  // namespace kvtier::hw
