#pragma once
// CPU references of the hw path's attention-side ops (layouts in kernels/layout.h). They are the
// host backend's implementation and the ground truth the CUDA kernels are tested against.
// Plain C++, single-threaded, fp32 accumulation. Thread-safe (no shared state). Each returns
// InvalidArgument for an invalid shape or an out-of-range index; pointers are host pointers.

#include <cstdint>

#include "core/status.h"
#include "kernels/layout.h"

namespace kvtier::kernels {

// (a) Probe scores and H2O column sums. `probs` ([heads][q_tokens][kv_tokens]) may be null when
// only the column sums are wanted; `colsum` ([kv_heads][kv_tokens]) may be null too.
Status ProbeScoresRef(const AttentionShape& shape, const float* q, const float* k, float* probs,
                      float* colsum);

// (b) Top-k indices per row (best first, ties by lower index, NaN last).
Status TopKRef(const TopKShape& shape, const float* scores, int32_t* indices);

// (c) out[i] = row `tokens[i]` of the chunked cache; `chunks[c]` points at chunk c.
Status GatherRowsRef(const ChunkedKvLayout& layout, const float* const* chunks,
                     const int32_t* tokens, int32_t n, float* out);

// (d) out = softmax(Q K^T / sqrt(head_dim)) V over the kept KV (no mask).
Status AttentionRef(const AttentionShape& shape, const float* q, const float* k, const float* v,
                    float* out);

// (e) Attention logits of one query against low-bit keys (LowBitKeyShape): scores[h][t] =
// sum_d q[h][d] * (code * scale + zero) / sqrt(head_dim).
Status LowBitKeyScoresRef(const LowBitKeyShape& shape, const uint32_t* codes, const float* scale,
                          const float* zero, const float* q, float* scores);

// Packs codes ([tokens][kv_heads][head_dim], one code per byte, each < 2^bits) into the
// LowBitKeyShape word layout. InvalidArgument for a bad shape or a code out of range.
Status PackLowBitCodes(const LowBitKeyShape& shape, const uint8_t* codes, uint32_t* packed);

// (f) The device gather's runs (CopyRun), each a memcpy of `bytes` from src to dst, in order.
// InvalidArgument when a run of > 0 bytes has a null pointer. Runs must not overlap.
Status GatherRunsRef(const CopyRun* runs, int64_t n);

// C[m][n] = A[m][k] * B, with B stored [k][n], or [n][k] when `transpose_b` (a weight matrix
// applied as x W^T). For projections / FFN in the host backend.
Status GemmRef(int32_t m, int32_t n, int32_t k, const float* a, const float* b, bool transpose_b,
               float* c);

}  // namespace kvtier::kernels
