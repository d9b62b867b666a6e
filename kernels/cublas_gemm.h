#pragma once
// A minimal cuBLAS fp32 GEMM for projections and the FFN in the CUDA backend, in the row-major
// convention of GemmRef (kernels/reference.h). Only built with CUDA. One handle per object; an
// object is used from one thread at a time (thread-compatible).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/status.h"

namespace kvtier::kernels {

class CublasGemm {
 public:
  // CudaError when cublasCreate fails (e.g. no driver or no device).
  static Status Create(std::unique_ptr<CublasGemm>* out);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // C[m][n] = A[m][k] * B (B stored [k][n], or [n][k] when `transpose_b`); device pointers,
  // asynchronous on `stream`.
  Status Gemm(int32_t m, int32_t n, int32_t k, const float* a, const float* b, bool transpose_b,
              float* c, cudaStream_t stream);

 private:
  CublasGemm() = default;
  void* handle_ = nullptr;  // cublasHandle_t, kept opaque so this header needs no cuBLAS
};

}  // namespace kvtier::kernels
