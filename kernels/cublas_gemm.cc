#include "kernels/cublas_gemm.h"

#include <cublas_v2.h>

#include <string>

namespace kvtier::kernels {
namespace {

Status CublasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return Status::CudaError(std::string(what) + ": " + cublasGetStatusName(st) + " (" +
                           cublasGetStatusString(st) + ")");
}

}  // namespace

Status CublasGemm::Create(std::unique_ptr<CublasGemm>* out) {
  cublasHandle_t handle = nullptr;
  KVTIER_RETURN_IF_ERROR(CublasStatus(cublasCreate(&handle), "cublasCreate"));
  std::unique_ptr<CublasGemm> g(new CublasGemm());
  g->handle_ = handle;
  *out = std::move(g);
  return Status::OK();
}

CublasGemm::~CublasGemm() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

Status CublasGemm::Gemm(int32_t m, int32_t n, int32_t k, const float* a, const float* b,
                        bool transpose_b, float* c, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0) return Status::InvalidArgument("CublasGemm: bad shape");
  auto h = static_cast<cublasHandle_t>(handle_);
  KVTIER_RETURN_IF_ERROR(CublasStatus(cublasSetStream(h, stream), "cublasSetStream"));
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands, no copies.
  const float alpha = 1.0f;
  const float beta = 0.0f;
  return CublasStatus(cublasSgemm(h, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, m, k,
                                  &alpha, b, transpose_b ? k : n, a, k, &beta, c, n),
                      "cublasSgemm");
}

}  // namespace kvtier::kernels
