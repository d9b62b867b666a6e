#pragma once
// The CUDA half of `kvtier calibrate` (hw/calibrate.h): on a machine with a CUDA device it
// measures the device's transfer strategies into `r`, replacing the host backend's values:
//
//   pcie.h2d_bw, pcie.latency   cudaMemcpyAsync H2D curve 256 B .. 64 MiB from a
//                               cudaHostRegister'ed HostArena (as hw/cuda_backend.cc pins
//                               it), wall time of N calls + one stream sync; FitCopyCurve
//   pcie.d2h_bw                 64 MiB D2H copies
//   pcie.batch_latency, pcie.descriptor_cost
//                               cudaMemcpyBatchAsync (CUDA 13 signature: no failIdx) of
//                               1..1024 descriptors of 256 B and 4 KiB, srcAccessOrder
//                               Stream; FitBatch
//   gpu.gather_bw               a gather kernel (hw/calibrate_gather.cu: one block per SM
//                               striding over the runs, 16-byte words) reading rows of
//                               64-row chunks from mapped pinned memory
//                               (cudaHostAllocMapped) into device memory
//   gpu.gather_sm_share         slowdown of a cuBLAS fp32 GEMM while that kernel runs on
//                               another stream: t_beside / t_alone - 1, clamped to [0, 1]
//   gpu.mem_bw                  device-to-device cudaMemcpyAsync (read + write)
//   gpu.name                    cudaGetDeviceProperties
//
// These use calibrate's own minimal calls, not the cuda backend's batched copy and gather
// kernel (issue 14 part A2, built at the same time): the numbers are the API's and a plain
// kernel's. Compiled whenever nvcc is found; run only where CudaDevicePresent(). On a build
// without CUDA (hw/calibrate_no_cuda.cc) it returns Unavailable. Not thread-safe.

#include "core/status.h"
#include "hw/calibrate.h"

namespace kvtier::hw {

Status CalibrateCuda(const CalibrateOptions& options, CalibrateResult* r);

}  // namespace kvtier::hw
