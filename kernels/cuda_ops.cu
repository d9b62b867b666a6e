#include <cmath>
#include <string>

#include "kernels/cuda_ops.h"

namespace kvtier::kernels {
namespace {

constexpr int kThreads = 128;

Status LaunchStatus(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::OK();
  return Status::CudaError(std::string(op) + ": launch failed: " + cudaGetErrorString(err));
}

// Block-wide reduction (max or sum) over kThreads threads; every thread gets the result.
template <bool kMax>
__device__ float BlockReduce(float v) {
  __shared__ float warp_vals[kThreads / 32];
  __shared__ float result;
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = warp_vals[0];
    for (int w = 1; w < kThreads / 32; ++w) r = kMax ? fmaxf(r, warp_vals[w]) : r + warp_vals[w];
    result = r;
  }
  __syncthreads();
  const float r = result;
  __syncthreads();  // `result` / `warp_vals` may be reused by the next call
  return r;
}

// One block per (q token, head): probs row = softmax(q . k_j * scale).
__global__ void SoftmaxRowsKernel(AttentionShape s, const float* q, const float* k, float* probs) {
  const int row = blockIdx.x;  // h * q_tokens + i
  const int h = row / s.q_tokens;
  const int i = row % s.q_tokens;
  const int kvh = h / s.group();
  const float scale = rsqrtf(static_cast<float>(s.head_dim));
  const float* qrow = q + (int64_t{i} * s.heads + h) * s.head_dim;
  float* out = probs + int64_t{row} * s.kv_tokens;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < s.kv_tokens; j += blockDim.x) {
    const float* krow = k + (int64_t{j} * s.kv_heads + kvh) * s.head_dim;
    float dot = 0.0f;
    for (int d = 0; d < s.head_dim; ++d) dot += qrow[d] * krow[d];
    out[j] = dot * scale;
    mx = fmaxf(mx, out[j]);
  }
  mx = BlockReduce<true>(mx);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < s.kv_tokens; j += blockDim.x) {
    out[j] = __expf(out[j] - mx);
    sum += out[j];
  }
  sum = BlockReduce<false>(sum);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < s.kv_tokens; j += blockDim.x) out[j] *= inv;
}

// One thread per (kv head, kv token): deterministic sum over the group's heads and q tokens.
__global__ void ColumnSumsKernel(AttentionShape s, const float* probs, float* colsum) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= s.colsum_floats()) return;
  const int kvh = static_cast<int>(idx / s.kv_tokens);
  const int j = static_cast<int>(idx % s.kv_tokens);
  float acc = 0.0f;
  for (int h = kvh * s.group(); h < (kvh + 1) * s.group(); ++h) {
    for (int i = 0; i < s.q_tokens; ++i)
      acc += probs[(int64_t{h} * s.q_tokens + i) * s.kv_tokens + j];
  }
  colsum[idx] = acc;
}

// One block per row; each element's rank is the number of elements that rank before it.
__global__ void TopKKernel(TopKShape s, const float* scores, int32_t* indices) {
  const float* row = scores + int64_t{blockIdx.x} * s.cols;
  int32_t* out = indices + int64_t{blockIdx.x} * s.k;
  for (int i = threadIdx.x; i < s.cols; i += blockDim.x) {
    const float vi = row[i];
    int rank = 0;
    for (int j = 0; j < s.cols && rank < s.k; ++j) rank += RanksBefore(row[j], j, vi, i) ? 1 : 0;
    if (rank < s.k) out[rank] = i;
  }
}

__global__ void GatherRowsKernel(ChunkedKvLayout l, const float* const* chunks,
                                 const int32_t* tokens, float* out) {
  const int32_t t = tokens[blockIdx.x];
  float* dst = out + int64_t{blockIdx.x} * l.row_floats;
  const bool ok = t >= 0 && t < l.tokens();
  const float* src =
      ok ? chunks[t / l.chunk_tokens] + int64_t{t % l.chunk_tokens} * l.row_floats : nullptr;
  for (int f = threadIdx.x; f < l.row_floats; f += blockDim.x) dst[f] = ok ? src[f] : NAN;
}

// Device gather (transfer.strategy = device_gather): block b copies runs b, b + gridDim.x, ...
// Its threads stride over the run in 16-byte words when dst, src and the length are 16-byte
// aligned (rows of fp16 KV usually are), else in bytes. `runs` and each run's `src` may be
// mapped pinned host memory: every load is then a PCIe read, which is the transfer.
__global__ void GatherRunsKernel(const CopyRun* runs, int64_t n) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const CopyRun r = runs[i];
    const uint64_t align = reinterpret_cast<uint64_t>(r.dst) | reinterpret_cast<uint64_t>(r.src) |
                           r.bytes;
    if ((align & 15u) == 0) {
      uint4* d = static_cast<uint4*>(r.dst);
      const uint4* s = static_cast<const uint4*>(r.src);
      for (uint64_t w = threadIdx.x; w < r.bytes / 16; w += blockDim.x) d[w] = s[w];
    } else {
      unsigned char* d = static_cast<unsigned char*>(r.dst);
      const unsigned char* s = static_cast<const unsigned char*>(r.src);
      for (uint64_t b = threadIdx.x; b < r.bytes; b += blockDim.x) d[b] = s[b];
    }
  }
}

// One block per (q token, head), threads over head_dim: out = probs row . V.
__global__ void ProbsTimesVKernel(AttentionShape s, const float* probs, const float* v,
                                  float* out) {
  const int row = blockIdx.x;  // h * q_tokens + i
  const int h = row / s.q_tokens;
  const int i = row % s.q_tokens;
  const int kvh = h / s.group();
  const float* p = probs + int64_t{row} * s.kv_tokens;
  float* o = out + (int64_t{i} * s.heads + h) * s.head_dim;
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < s.kv_tokens; ++j)
      acc += p[j] * v[(int64_t{j} * s.kv_heads + kvh) * s.head_dim + d];
    o[d] = acc;
  }
}

// One thread per (head, token): the token's low-bit key is dequantized channel by channel
// (code * scale + zero, as the reference does) and dotted with the query. Consecutive threads
// take consecutive tokens of one head, so a warp reads per_word-token-shared code words and
// one group's scale/zero per channel.
__global__ void LowBitKeyScoresKernel(LowBitKeyShape s, const uint32_t* codes, const float* scale,
                                      const float* zero, const float* q, float* scores) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= s.score_floats()) return;
  const int32_t h = static_cast<int32_t>(idx / s.tokens);
  const int32_t t = static_cast<int32_t>(idx % s.tokens);
  const int32_t kvh = h / (s.heads / s.kv_heads);
  const float* qrow = q + int64_t{h} * s.head_dim;
  float dot = 0.0f;
  for (int32_t d = 0; d < s.head_dim; ++d) {
    const int64_t p = s.Param(kvh, t, d);
    const float k = static_cast<float>(s.Code(codes, kvh, t, d)) * scale[p] + zero[p];
    dot += qrow[d] * k;
  }
  scores[idx] = dot * rsqrtf(static_cast<float>(s.head_dim));
}

}  // namespace

Status LowBitKeyScoresCuda(const LowBitKeyShape& s, const uint32_t* codes, const float* scale,
                           const float* zero, const float* q, float* scores, cudaStream_t stream) {
  if (!s.valid()) return Status::InvalidArgument("LowBitKeyScoresCuda: bad shape");
  const int64_t n = s.score_floats();
  LowBitKeyScoresKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                          stream>>>(s, codes, scale, zero, q, scores);
  return LaunchStatus("LowBitKeyScoresCuda");
}

Status ProbeScoresCuda(const AttentionShape& s, const float* q, const float* k, float* probs,
                       float* colsum, cudaStream_t stream) {
  if (!s.valid() || probs == nullptr) return Status::InvalidArgument("ProbeScoresCuda: bad shape");
  SoftmaxRowsKernel<<<s.heads * s.q_tokens, kThreads, 0, stream>>>(s, q, k, probs);
  KVTIER_RETURN_IF_ERROR(LaunchStatus("ProbeScoresCuda softmax"));
  if (colsum != nullptr) {
    const int64_t n = s.colsum_floats();
    ColumnSumsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(s, probs, colsum);
    KVTIER_RETURN_IF_ERROR(LaunchStatus("ProbeScoresCuda column sums"));
  }
  return Status::OK();
}

Status TopKCuda(const TopKShape& s, const float* scores, int32_t* indices, cudaStream_t stream) {
  if (!s.valid()) return Status::InvalidArgument("TopKCuda: bad shape");
  TopKKernel<<<s.rows, 256, 0, stream>>>(s, scores, indices);
  return LaunchStatus("TopKCuda");
}

Status GatherRowsCuda(const ChunkedKvLayout& l, const float* const* chunks, const int32_t* tokens,
                      int32_t n, float* out, cudaStream_t stream) {
  if (!l.valid() || n < 0) return Status::InvalidArgument("GatherRowsCuda: bad layout");
  if (n == 0) return Status::OK();
  GatherRowsKernel<<<n, kThreads, 0, stream>>>(l, chunks, tokens, out);
  return LaunchStatus("GatherRowsCuda");
}

Status GatherRunsCuda(const CopyRun* runs, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && runs == nullptr)) {
    return Status::InvalidArgument("GatherRunsCuda: bad runs");
  }
  if (n == 0) return Status::OK();
  // A block per run up to 65,535 blocks (more runs are grid-strided): one launch either way.
  const unsigned blocks = static_cast<unsigned>(n < 65535 ? n : 65535);
  GatherRunsKernel<<<blocks, kThreads, 0, stream>>>(runs, n);
  return LaunchStatus("GatherRunsCuda");
}

Status AttentionCuda(const AttentionShape& s, const float* q, const float* k, const float* v,
                     float* workspace, float* out, cudaStream_t stream) {
  if (!s.valid() || workspace == nullptr)
    return Status::InvalidArgument("AttentionCuda: bad shape");
  SoftmaxRowsKernel<<<s.heads * s.q_tokens, kThreads, 0, stream>>>(s, q, k, workspace);
  KVTIER_RETURN_IF_ERROR(LaunchStatus("AttentionCuda softmax"));
  ProbsTimesVKernel<<<s.heads * s.q_tokens, kThreads, 0, stream>>>(s, workspace, v, out);
  return LaunchStatus("AttentionCuda P.V");
}

}  // namespace kvtier::kernels
