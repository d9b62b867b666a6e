#pragma once
// Plain layout structs shared by the CUDA kernels (kernels/cuda_ops.cu) and their CPU
// references (kernels/reference.h), FlashInfer style: the host plans with these, the device and
// the reference read the same fields. All tensors are dense, row-major fp32.
//
//   Q       [q_tokens][heads][head_dim]
//   K, V    [kv_tokens][kv_heads][head_dim]          (GQA: query head h uses kv head
//                                                      h / (heads / kv_heads))
//   probs   [heads][q_tokens][kv_tokens]              softmax(Q K^T / sqrt(head_dim)) rows,
//                                                      no causal mask
//   colsum  [kv_heads][kv_tokens]                     H2O column sums: sum of probs over the
//                                                      query heads of the group and all q tokens
//   out     [q_tokens][heads][head_dim]

#include <cstdint>

#if defined(__CUDACC__)
#define KVTIER_HOST_DEVICE __host__ __device__
#else
#define KVTIER_HOST_DEVICE
#endif

namespace kvtier::kernels {

struct AttentionShape {
  int32_t q_tokens = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t kv_tokens = 0;

  KVTIER_HOST_DEVICE int32_t group() const { return heads / kv_heads; }
  KVTIER_HOST_DEVICE bool valid() const {
    return q_tokens > 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && kv_tokens > 0 &&
           heads % kv_heads == 0;
  }
  KVTIER_HOST_DEVICE int64_t q_floats() const { return int64_t{q_tokens} * heads * head_dim; }
  KVTIER_HOST_DEVICE int64_t kv_floats() const { return int64_t{kv_tokens} * kv_heads * head_dim; }
  KVTIER_HOST_DEVICE int64_t prob_floats() const { return int64_t{heads} * q_tokens * kv_tokens; }
  KVTIER_HOST_DEVICE int64_t colsum_floats() const { return int64_t{kv_heads} * kv_tokens; }
};

// Top-k of each row of a [rows][cols] score matrix -> indices [rows][k], best first; equal
// scores rank by lower index; NaN ranks below every number (even -inf).
struct TopKShape {
  int32_t rows = 0;
  int32_t cols = 0;
  int32_t k = 0;
  KVTIER_HOST_DEVICE bool valid() const { return rows > 0 && cols > 0 && k > 0 && k <= cols; }
};

// A token-major chunked K (or V) cache: chunk c holds tokens [c*chunk_tokens, (c+1)*chunk_tokens)
// as [chunk_tokens][row_floats] (row_floats = kv_heads * head_dim). Gathering a list of global
// token indices yields a contiguous [n][row_floats] tensor.
struct ChunkedKvLayout {
  int32_t chunk_tokens = 0;
  int32_t row_floats = 0;
  int32_t num_chunks = 0;
  KVTIER_HOST_DEVICE bool valid() const {
    return chunk_tokens > 0 && row_floats > 0 && num_chunks > 0;
  }
  KVTIER_HOST_DEVICE int64_t tokens() const { return int64_t{chunk_tokens} * num_chunks; }
};

// Low-bit keys in KIVI's per-channel layout (models/kivi.h; SpeCache keeps them on the GPU to
// score the speculative token): tokens come in groups of `group` consecutive tokens; per (KV
// head, token group, channel) a float zero-point and scale, and the group's `group` codes
// packed LSB first into 32-bit words (token t of the group in bits [(t % per_word) * bits, +bits)
// of word t / per_word, per_word = 32 / bits). A key element is code * scale + zero.
//   codes        [kv_heads][token_groups][head_dim][words_per_group]   uint32
//   scale, zero  [kv_heads][token_groups][head_dim]                    float
//   q            [heads][head_dim]                                     one query token
//   scores       [heads][tokens]       q . k'_t / sqrt(head_dim): attention logits, no softmax
// Query head h reads KV head h / (heads / kv_heads).
struct LowBitKeyShape {
  int32_t bits = 2;       // 1 or 2
  int32_t group = 32;     // tokens per quantization group; group * bits a multiple of 32
  int32_t tokens = 0;     // a multiple of group
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;

  KVTIER_HOST_DEVICE bool valid() const {
    return (bits == 1 || bits == 2) && group > 0 && (group * bits) % 32 == 0 && tokens > 0 &&
           tokens % group == 0 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
           head_dim > 0;
  }
  KVTIER_HOST_DEVICE int32_t token_groups() const { return tokens / group; }
  KVTIER_HOST_DEVICE int32_t per_word() const { return 32 / bits; }
  KVTIER_HOST_DEVICE int32_t words_per_group() const { return group * bits / 32; }
  KVTIER_HOST_DEVICE int64_t code_words() const {
    return int64_t{kv_heads} * token_groups() * head_dim * words_per_group();
  }
  KVTIER_HOST_DEVICE int64_t param_floats() const {
    return int64_t{kv_heads} * token_groups() * head_dim;
  }
  KVTIER_HOST_DEVICE int64_t score_floats() const { return int64_t{heads} * tokens; }
  // The code of (kv head, token, channel) in `codes`.
  KVTIER_HOST_DEVICE uint32_t Code(const uint32_t* codes, int32_t kvh, int32_t t,
                                   int32_t d) const {
    const int32_t g = t / group, i = t % group;
    const uint32_t word =
        codes[((int64_t{kvh} * token_groups() + g) * head_dim + d) * words_per_group() +
              i / per_word()];
    return (word >> ((i % per_word()) * bits)) & ((1u << bits) - 1u);
  }
  // Index of (kv head, token's group, channel) in scale / zero.
  KVTIER_HOST_DEVICE int64_t Param(int32_t kvh, int32_t t, int32_t d) const {
    return (int64_t{kvh} * token_groups() + t / group) * head_dim + d;
  }
};

// Row ordering used by top-k (reference and kernel): true when (a, i) ranks before (b, j).
KVTIER_HOST_DEVICE inline bool RanksBefore(float a, int32_t i, float b, int32_t j) {
  const bool a_nan = a != a;
  const bool b_nan = b != b;
  if (a_nan != b_nan) return b_nan;  // every number ranks before NaN
  if (a_nan) return i < j;
  return a > b || (a == b && i < j);
}


// One contiguous run of a row gather (transfer.strategy = device_gather): `bytes` bytes from
// `src` to `dst`. The kernel (kernels/cuda_ops.h GatherRunsCuda) reads `src` from mapped
// (zero-copy) pinned host memory through its device pointer and writes device memory; the CPU
// reference (GatherRunsRef) memcpy's the same runs, which is what the host backend does.
struct CopyRun {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};

}  // namespace kvtier::kernels
