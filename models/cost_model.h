#pragma once
// Cost model: FLOPs and HBM bytes of the compute steps a prefill or decode runs, derived from
// a ModelSpec alone, and a roofline duration for them on a HardwareOptions profile. The
// executors turn every ComputeOp into a duration with ComputeTimer (models/layer_table.h),
// which is ComputeSeconds unless the profile names a measured layer table; `kvtier model`
// uses these functions to compare recomputing a prefix with loading its KV (the trade-off of
// SPEC Fig. 3). Pure functions of their arguments; thread-safe.
//
// Conventions (the tests in tests/models/cost_model_test.cc check them by hand calculation):
//   - n = tokens whose hidden states are computed ("new"), m = tokens attended to, m >= n:
//     m = kept prefix + new tokens. The new tokens attend to the whole kept prefix and
//     causally among themselves, so one head scores n*(m - n) + n*(n + 1)/2 query-key pairs
//     (AttentionPairs). A decode step is n = 1.
//   - A multiply-add is 2 FLOPs; a GEMM of [n x in] by [in x out] is 2*n*in*out FLOPs.
//   - Projections: Q and O are heads*head_dim wide, K and V kv_heads*head_dim (GQA).
//   - Attention: QK^T and PV are 2*pairs*head_dim FLOPs per query head each, plus softmax.
//   - FFN: OPT has two matrices hidden x ffn (ReLU); Llama three (gate, up, down; SwiGLU).
//   - Norms, residual adds, biases, RoPE and activations are counted with small per-element
//     constants (cost_model.cc); they are a fraction of a percent of a layer's FLOPs.
//   - Bytes are HBM traffic: every weight read once per layer step (dtype_bytes each), the KV
//     of all m context tokens read by attention, the KV of the n new tokens written, and each
//     GEMM's input and output activations read and written once (dtype_bytes each).
//   - Score steps (ITF probe, H2O full scores) count KV heads: `heads` probe KV heads, each
//     with its heads/kv_heads query heads, scoring n queries against m keys (no causal mask:
//     the keys are the stored prefix), then softmax and a top-k pass over the scores.

#include <cstdint>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/options.h"
#include "core/types.h"

namespace kvtier {

// FLOPs and bytes of some work, split by where they come from so tests and tables can show
// the parts. Values are doubles: whole-model totals exceed 2^32 but stay far below 2^53, so
// integer counts are exact.
struct WorkCost {
  double projection_flops = 0;  // Q, K, V, O GEMMs
  double attention_flops = 0;   // QK^T, PV, softmax (score steps: q.k, softmax, top-k)
  double ffn_flops = 0;         // FFN GEMMs and activation
  double other_flops = 0;       // norms, residual adds, biases, RoPE, LM head
  double weight_bytes = 0;      // parameters read
  double kv_read_bytes = 0;     // K and V (or probe K) read
  double kv_write_bytes = 0;    // K and V of the new tokens written
  double activation_bytes = 0;  // hidden states and intermediates read and written

  double Flops() const { return projection_flops + attention_flops + ffn_flops + other_flops; }
  double TotalBytes() const {
    return weight_bytes + kv_read_bytes + kv_write_bytes + activation_bytes;
  }
  WorkCost& operator+=(const WorkCost& other);
  friend WorkCost operator+(WorkCost a, const WorkCost& b) { return a += b; }
  // Every field times `factor` (e.g. one layer times the number of layers).
  friend WorkCost operator*(double factor, WorkCost cost);
};

// KV sizes of a model for a chunk size and a number of probe heads (ModelSpec's helpers).
struct KvSizes {
  Bytes per_token = 0;        // K + V of one token, all layers
  Bytes per_token_layer = 0;  // K + V of one token, one layer
  Bytes k_chunk = 0;          // one K chunk: chunk_tokens tokens, one layer, all KV heads
  Bytes v_chunk = 0;          // one V chunk (same size as a K chunk)
  Bytes probe_chunk = 0;      // one probe-K chunk: keys of the probe heads only
};
// REQUIRES: chunk_tokens >= 1, 0 <= probe_heads <= model.kv_heads.
KvSizes ComputeKvSizes(const ModelSpec& model, int chunk_tokens, int probe_heads);

// Query-key pairs one head scores when n new tokens attend to m context tokens, the new ones
// causally among themselves: n*(m - n) + n*(n + 1)/2. REQUIRES: 0 <= n <= m.
double AttentionPairs(std::int64_t n, std::int64_t m);

// One transformer layer's prefill of n tokens attending to m tokens. REQUIRES: 0 <= n <= m.
WorkCost LayerPrefillCost(const ModelSpec& model, std::int64_t n, std::int64_t m);
// One decode step of one layer: LayerPrefillCost(model, 1, m). REQUIRES: m >= 1.
WorkCost LayerDecodeCost(const ModelSpec& model, std::int64_t m);
// Final norm and LM head (hidden x vocab) for `rows` positions (prefill: the last one; a
// batched decode step: one per row), the weights read once. REQUIRES: rows >= 1.
WorkCost OutputLayerCost(const ModelSpec& model, std::int64_t rows = 1);
// One layer of a batched decode step (core/decode_engine.h): `rows` token rows through the layer's
// GEMMs (the weights read once for all of them), attention over `pairs` query-key pairs per
// query head (summed over the rows), and the KV bytes attention reads and writes given in the
// system's format (`kv_read_bytes`, `kv_write_bytes`). `part` splits the layer as
// specache_nospec runs it:
//   kWhole   everything LayerPrefillCost counts for n = rows, with `pairs` attention pairs;
//   kScores  QKV projections (+ RoPE or their biases), the first norm, QK^T over `pairs` with
//            softmax and a top-k pass per KV head; weights of Q, K, V and the norm;
//   kAttend  QK^T, softmax and PV over `pairs`, O, the FFN, the second norm and the residual
//            adds; weights of O, the FFN and the norm.
// kScores + kAttend = kWhole plus the second QK^T pass and the top-k (the nospec re-attention).
// REQUIRES: rows >= 1, pairs >= 0.
WorkCost DecodeLayerCost(const ModelSpec& model, std::int64_t rows, double pairs,
                         double kv_read_bytes, double kv_write_bytes, DecodePart part);
// Attention scores of `kv_heads_scored` KV heads (with their query-head groups) for n
// queries against m keys, with softmax and top-k. REQUIRES: 1 <= kv_heads_scored <= kv_heads.
WorkCost ScoresCost(const ModelSpec& model, int kv_heads_scored, std::int64_t n, std::int64_t m);

// The FLOPs and bytes of one ComputeOp, all its layers included:
//   kLayerPrefill  LayerPrefillCost(new_tokens, context_tokens)             one layer step
//   kProbeScores   ScoresCost(heads, new_tokens, context_tokens)            one layer step
//   kFullScores    ScoresCost(heads or all kv_heads, ...)                   one layer step
//   kChunkPrefill  layers x LayerPrefillCost(new_tokens, context_tokens)    `layers` steps
//   kOutputLayer   OutputLayerCost(max(1, new_tokens))                      one step
//   kDecodeStep    layer -1: layers x LayerDecodeCost(context_tokens) + output layer,
//                  layers + 1 steps; layer >= 0: DecodeLayerCost(new_tokens,
//                  context_tokens, kv_read_bytes, kv_write_bytes, decode_part), one step
// For kProbeScores `heads` must be set (the probe KV heads); for kFullScores 0 means all.
// REQUIRES: 0 <= new_tokens <= context_tokens.
WorkCost ComputeCost(const ModelSpec& model, const ComputeOp& op);
// Kernel launches ("layer steps") an op pays gpu.kernel_overhead for, as listed above.
int LayerSteps(const ModelSpec& model, const ComputeOp& op);

// Roofline time of `cost` without overheads:
//   max(flops / (gpu_flops * gpu_efficiency), bytes / gpu_mem_bw).
Seconds RooflineSeconds(const WorkCost& cost, const HardwareOptions& hw);

// Duration of `op` on `hw`: for each layer step, RooflineSeconds of that step's work plus
// gpu.kernel_overhead (the key table documents it as a fixed cost per layer step, so an
// all-layer op pays it once per layer). Pure roofline: ignores gpu.layer_table; the executors
// time ops with ComputeTimer (models/layer_table.h), which corrects this with a measured table
// when the profile names one. REQUIRES: as ComputeCost.
Seconds ComputeSeconds(const ModelSpec& model, const HardwareOptions& hw, const ComputeOp& op);

// Time to recompute a whole prefix of `tokens` tokens from scratch: a kChunkPrefill of all
// of them (n = m = tokens) plus the output layer. What ReComp pays (SPEC §III, Fig. 3).
Seconds PrefixRecomputeSeconds(const ModelSpec& model, const HardwareOptions& hw,
                               std::int64_t tokens);

}  // namespace kvtier
