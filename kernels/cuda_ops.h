#pragma once
// Host launchers of the CUDA kernels (kernels/cuda_ops.cu); each mirrors a CPU reference in
// kernels/reference.h with the same layout (kernels/layout.h). Only available when kvtier is
// built with CUDA (KVTIER_KERNELS_HAVE_CUDA=1). All tensor pointers are device pointers; the
// launch is asynchronous on `stream`. A launcher returns InvalidArgument for a bad shape and
// CudaError (with the CUDA error text) when the launch fails; errors during execution surface
// at the caller's next synchronisation. Thread-safe.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"
#include "kernels/layout.h"

namespace kvtier::kernels {

// (a) Softmax rows into `probs` (REQUIRED here: it is also the workspace) and H2O column sums
// into `colsum` (may be null).
Status ProbeScoresCuda(const AttentionShape& shape, const float* q, const float* k, float* probs,
                       float* colsum, cudaStream_t stream);

// (b) Top-k indices per row. O(cols^2 / threads) per row: meant for probe-sized rows (a few
// thousand columns).
Status TopKCuda(const TopKShape& shape, const float* scores, int32_t* indices, cudaStream_t stream);

// (c) Gather. `chunks` is a device array of `layout.num_chunks` device pointers; `tokens` a
// device array of n indices. REQUIRES: every token in [0, layout.tokens()) (not checked on the
// device; an out-of-range token yields a NaN row).
Status GatherRowsCuda(const ChunkedKvLayout& layout, const float* const* chunks,
                      const int32_t* tokens, int32_t n, float* out, cudaStream_t stream);

// (d) Attention over the kept KV. `workspace` holds shape.prob_floats() floats.
Status AttentionCuda(const AttentionShape& shape, const float* q, const float* k, const float* v,
                     float* workspace, float* out, cudaStream_t stream);

// (e) Low-bit key scores of one query (LowBitKeyShape). One thread per (head, token).
Status LowBitKeyScoresCuda(const LowBitKeyShape& shape, const uint32_t* codes, const float* scale,
                           const float* zero, const float* q, float* scores, cudaStream_t stream);

// (f) Device gather of row runs (CopyRun): `runs` is an array of `n` runs that the device can
// read (device memory, or mapped pinned host memory through its device pointer); each run's
// `src` is readable by the device (mapped pinned host memory: the zero-copy read that makes
// this a host-to-device transfer) and its `dst` is device memory. One launch for all runs: a
// block per run (grid-strided), 16-byte words when a run's pointers and length allow, bytes
// otherwise. Runs must not overlap. InvalidArgument for n < 0 or null `runs` with n > 0.
Status GatherRunsCuda(const CopyRun* runs, int64_t n, cudaStream_t stream);

}  // namespace kvtier::kernels
