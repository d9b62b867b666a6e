#include "models/cost_model.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace kvtier {
namespace {

// Small per-element FLOP counts. They are approximate by nature (a fused kernel does them
// in registers); what matters is that they stay small next to the GEMMs.
constexpr double kLayerNormFlops = 8;  // mean, variance, normalise, scale, shift
constexpr double kRmsNormFlops = 4;    // square-sum, rsqrt-scale, weight
constexpr double kSoftmaxFlops = 5;    // scale, max, exp, sum, divide (per score)
constexpr double kRopeFlops = 3;       // per element of q and k (rotate pairs: 2 mul + add)
constexpr double kReluFlops = 1;       // per FFN element
constexpr double kSwiGluFlops = 5;     // silu(gate) ~4, times up 1
constexpr double kTopKFlops = 4;       // per key: compare/insert into a small heap
constexpr double kScoreBytes = 4;      // fp32 accumulated score per key and KV head

double NormFlops(const ModelSpec& m) {
  return m.family == ModelFamily::kOpt ? kLayerNormFlops : kRmsNormFlops;
}
// Parameters of one norm: LayerNorm has weight and bias, RMSNorm only a weight.
double NormParams(const ModelSpec& m) {
  return (m.family == ModelFamily::kOpt ? 2.0 : 1.0) * m.hidden;
}
// Number of hidden x ffn matrices: OPT fc1, fc2; Llama gate, up, down.
int FfnMatrices(const ModelSpec& m) { return m.family == ModelFamily::kOpt ? 2 : 3; }

void CheckTokens(std::int64_t n, std::int64_t m) {
  KVTIER_CHECK(n >= 0 && n <= m, "cost model: need 0 <= new_tokens <= context_tokens");
}

}  // namespace

WorkCost& WorkCost::operator+=(const WorkCost& o) {
  projection_flops += o.projection_flops;
  attention_flops += o.attention_flops;
  ffn_flops += o.ffn_flops;
  other_flops += o.other_flops;
  weight_bytes += o.weight_bytes;
  kv_read_bytes += o.kv_read_bytes;
  kv_write_bytes += o.kv_write_bytes;
  activation_bytes += o.activation_bytes;
  return *this;
}

WorkCost operator*(double f, WorkCost c) {
  c.projection_flops *= f;
  c.attention_flops *= f;
  c.ffn_flops *= f;
  c.other_flops *= f;
  c.weight_bytes *= f;
  c.kv_read_bytes *= f;
  c.kv_write_bytes *= f;
  c.activation_bytes *= f;
  return c;
}

KvSizes ComputeKvSizes(const ModelSpec& model, int chunk_tokens, int probe_heads) {
  KVTIER_CHECK(chunk_tokens >= 1, "chunk_tokens must be >= 1");
  KVTIER_CHECK(probe_heads >= 0 && probe_heads <= model.kv_heads, "probe heads in [0, kv_heads]");
  KvSizes s;
  s.per_token = model.KvBytesPerToken();
  s.per_token_layer = 2 * model.KBytesPerTokenLayer();
  s.k_chunk = model.ChunkBytes(chunk_tokens);
  s.v_chunk = model.ChunkBytes(chunk_tokens);
  s.probe_chunk = model.ProbeChunkBytes(chunk_tokens, probe_heads);
  return s;
}

double AttentionPairs(std::int64_t n, std::int64_t m) {
  CheckTokens(n, m);
  // Each new token sees the m - n kept tokens, and new token i (1-based) sees i new tokens.
  return static_cast<double>(n) * static_cast<double>(m - n) +
         static_cast<double>(n) * static_cast<double>(n + 1) / 2;
}

WorkCost LayerPrefillCost(const ModelSpec& model, std::int64_t n_tokens, std::int64_t m_tokens) {
  CheckTokens(n_tokens, m_tokens);
  WorkCost c;
  if (n_tokens == 0) return c;  // nothing to compute
  const double n = static_cast<double>(n_tokens);
  const double m = static_cast<double>(m_tokens);
  const double h = model.hidden;
  const double q_width = static_cast<double>(model.heads) * model.head_dim;
  const double kv_width = static_cast<double>(model.kv_heads) * model.head_dim;
  const double ffn = model.ffn;
  const double dtype = model.dtype_bytes;
  const int mats = FfnMatrices(model);
  const bool opt = model.family == ModelFamily::kOpt;

  // Projections: Q [h x q_width], K and V [h x kv_width] each, O [q_width x h].
  c.projection_flops = 2 * n * h * (q_width + 2 * kv_width) + 2 * n * q_width * h;
  // Attention per query head: QK^T 2*pairs*head_dim, PV 2*pairs*head_dim, softmax per score.
  const double pairs = AttentionPairs(n_tokens, m_tokens);
  c.attention_flops = model.heads * pairs * (4.0 * model.head_dim + kSoftmaxFlops);
  // FFN: `mats` GEMMs of n x h x ffn, plus the activation (ReLU or SwiGLU) per element.
  c.ffn_flops = mats * 2 * n * h * ffn + n * ffn * (opt ? kReluFlops : kSwiGluFlops);
  // Two norms, two residual adds; OPT adds biases, Llama rotates q and k (RoPE).
  c.other_flops = 2 * n * h * NormFlops(model) + 2 * n * h;
  if (opt) {
    c.other_flops += n * (q_width + 2 * kv_width + h + ffn + h);
  } else {
    c.other_flops += kRopeFlops * n * (q_width + kv_width);
  }

  // Weights, each read once (ModelSpec::LayerParams: the matrices, two norms, OPT's biases).
  c.weight_bytes = model.LayerParams() * dtype;
  // Attention reads K and V of every context token (the new ones after they are written).
  c.kv_read_bytes = m * static_cast<double>(2 * model.KBytesPerTokenLayer());
  c.kv_write_bytes = n * static_cast<double>(2 * model.KBytesPerTokenLayer());
  // Activations read and written, in elements of n tokens:
  //   norm1 h + h; QKV in h, out q+2kv; attention Q in, out q+q; O in q, out h;
  //   residual 2h in, h out; norm2 h + h; FFN in h, out (mats-1)*ffn; activation in
  //   (mats-1)*ffn, out ffn; down in ffn, out h; residual 2h + h.
  const double elems = (2 * h) + (h + q_width + 2 * kv_width) + (2 * q_width) + (q_width + h) +
                       (3 * h) + (2 * h) + (h + (mats - 1) * ffn) + ((mats - 1) * ffn + ffn) +
                       (ffn + h) + (3 * h);
  c.activation_bytes = n * elems * dtype;
  return c;
}

WorkCost LayerDecodeCost(const ModelSpec& model, std::int64_t m) {
  KVTIER_CHECK(m >= 1, "a decode step attends to at least its own token");
  return LayerPrefillCost(model, 1, m);
}

WorkCost OutputLayerCost(const ModelSpec& model, std::int64_t rows) {
  KVTIER_CHECK(rows >= 1, "the output layer computes at least one row");
  const double r = static_cast<double>(rows);
  const double h = model.hidden;
  const double vocab = model.vocab;
  WorkCost c;
  c.other_flops = r * h * NormFlops(model) + 2 * r * h * vocab;  // final norm + LM head GEMV
  c.weight_bytes = (NormParams(model) + h * vocab) * model.dtype_bytes;
  // Per row: norm in/out, head in, logits. (r = 1 gives the prefill's values exactly.)
  c.activation_bytes = r * (2 * h + h + vocab) * model.dtype_bytes;
  return c;
}

WorkCost DecodeLayerCost(const ModelSpec& model, std::int64_t rows, double pairs,
                         double kv_read_bytes, double kv_write_bytes, DecodePart part) {
  KVTIER_CHECK(rows >= 1 && pairs >= 0, "a decode layer needs rows >= 1 and pairs >= 0");
  const double n = static_cast<double>(rows);
  const double h = model.hidden;
  const double q_width = static_cast<double>(model.heads) * model.head_dim;
  const double kv_width = static_cast<double>(model.kv_heads) * model.head_dim;
  const double ffn = model.ffn;
  const double dtype = model.dtype_bytes;
  const int mats = FfnMatrices(model);
  const bool opt = model.family == ModelFamily::kOpt;
  const double norm_params = NormParams(model);
  // The same terms as LayerPrefillCost, split into the scores half and the attend half.
  const double qkv_flops = 2 * n * h * (q_width + 2 * kv_width);
  const double o_flops = 2 * n * q_width * h;
  const double ffn_flops = mats * 2 * n * h * ffn + n * ffn * (opt ? kReluFlops : kSwiGluFlops);
  const double qkv_other = n * h * NormFlops(model) +
                           (opt ? n * (q_width + 2 * kv_width) : kRopeFlops * n * (q_width + kv_width));
  const double rest_other = n * h * NormFlops(model) + 2 * n * h + (opt ? n * (h + ffn + h) : 0);
  const double qkv_params = h * (q_width + 2 * kv_width) + norm_params + (opt ? q_width + 2 * kv_width : 0);
  const double rest_params = model.LayerParams() - qkv_params;
  // Activation elements per row (LayerPrefillCost's list): norm1 and QKV belong to the scores
  // half, the rest to the attend half.
  const double qkv_elems = (2 * h) + (h + q_width + 2 * kv_width);
  const double rest_elems = (2 * q_width) + (q_width + h) + (3 * h) + (2 * h) +
                            (h + (mats - 1) * ffn) + ((mats - 1) * ffn + ffn) + (ffn + h) + (3 * h);
  WorkCost c;
  c.kv_read_bytes = kv_read_bytes;
  switch (part) {
    case DecodePart::kWhole:
      c.projection_flops = qkv_flops + o_flops;
      c.attention_flops = model.heads * pairs * (4.0 * model.head_dim + kSoftmaxFlops);
      c.ffn_flops = ffn_flops;
      c.other_flops = qkv_other + rest_other;
      c.weight_bytes = model.LayerParams() * dtype;
      c.kv_write_bytes = kv_write_bytes;
      c.activation_bytes = n * (qkv_elems + rest_elems) * dtype;
      break;
    case DecodePart::kScores:
      c.projection_flops = qkv_flops;
      c.attention_flops = model.heads * pairs * (2.0 * model.head_dim + kSoftmaxFlops) +
                          model.kv_heads * pairs * kTopKFlops;
      c.other_flops = qkv_other;
      c.weight_bytes = qkv_params * dtype;
      c.activation_bytes = n * qkv_elems * dtype;
      break;
    case DecodePart::kAttend:
      c.projection_flops = o_flops;
      c.attention_flops = model.heads * pairs * (4.0 * model.head_dim + kSoftmaxFlops);
      c.ffn_flops = ffn_flops;
      c.other_flops = rest_other;
      c.weight_bytes = rest_params * dtype;
      c.kv_write_bytes = kv_write_bytes;
      c.activation_bytes = n * rest_elems * dtype;
      break;
  }
  return c;
}

WorkCost ScoresCost(const ModelSpec& model, int kv_heads_scored, std::int64_t n_tokens,
                    std::int64_t m_tokens) {
  KVTIER_CHECK(kv_heads_scored >= 1 && kv_heads_scored <= model.kv_heads,
               "scored heads must be in [1, kv_heads]");
  KVTIER_CHECK(n_tokens >= 0 && m_tokens >= 0, "token counts must be >= 0");
  const double n = static_cast<double>(n_tokens);
  const double m = static_cast<double>(m_tokens);
  const double group = static_cast<double>(model.heads) / model.kv_heads;
  const double query_heads = kv_heads_scored * group;
  WorkCost c;
  // Per query head: q.k for n x m pairs, softmax per score, and summing the n rows into one
  // score per key (H2O's accumulated attention). Then top-k over m keys per KV head.
  c.attention_flops = query_heads * n * m * (2.0 * model.head_dim + kSoftmaxFlops + 1) +
                      kv_heads_scored * m * kTopKFlops;
  c.kv_read_bytes = m * kv_heads_scored * static_cast<double>(model.RowBytes());
  c.activation_bytes = n * query_heads * static_cast<double>(model.RowBytes()) +
                       kv_heads_scored * m * kScoreBytes;
  return c;
}

WorkCost ComputeCost(const ModelSpec& model, const ComputeOp& op) {
  // Prefill steps attend causally among their new tokens (n <= m). Score steps do not: their
  // n query rows (new prefix + query) score m reused keys, and n may exceed m.
  switch (op.kind) {
    case ComputeKind::kLayerPrefill:
      CheckTokens(op.new_tokens, op.context_tokens);
      return LayerPrefillCost(model, op.new_tokens, op.context_tokens);
    case ComputeKind::kProbeScores:
      KVTIER_CHECK(op.heads >= 1, "kProbeScores needs the number of probe heads");
      return ScoresCost(model, op.heads, op.new_tokens, op.context_tokens);
    case ComputeKind::kFullScores:
      return ScoresCost(model, op.heads == 0 ? model.kv_heads : op.heads, op.new_tokens,
                        op.context_tokens);
    case ComputeKind::kChunkPrefill:
      CheckTokens(op.new_tokens, op.context_tokens);
      return static_cast<double>(model.layers) *
             LayerPrefillCost(model, op.new_tokens, op.context_tokens);
    case ComputeKind::kOutputLayer:
      return OutputLayerCost(model, std::max<std::int64_t>(1, op.new_tokens));
    case ComputeKind::kDecodeStep:
      if (op.layer >= 0) {
        return DecodeLayerCost(model, op.new_tokens, static_cast<double>(op.context_tokens),
                               static_cast<double>(op.kv_read_bytes),
                               static_cast<double>(op.kv_write_bytes), op.decode_part);
      }
      return static_cast<double>(model.layers) * LayerDecodeCost(model, op.context_tokens) +
             OutputLayerCost(model);
  }
  KVTIER_CHECK(false, "unknown ComputeKind");
  return {};
}

int LayerSteps(const ModelSpec& model, const ComputeOp& op) {
  switch (op.kind) {
    case ComputeKind::kChunkPrefill:
      return model.layers;
    case ComputeKind::kDecodeStep:
      return op.layer >= 0 ? 1 : model.layers + 1;
    default:
      return 1;
  }
}

Seconds RooflineSeconds(const WorkCost& cost, const HardwareOptions& hw) {
  // Roofline: a step is bound by either its arithmetic or its memory traffic.
  const Seconds compute = cost.Flops() / (hw.gpu_flops * hw.gpu_efficiency);
  const Seconds memory = cost.TotalBytes() / hw.gpu_mem_bw;
  return std::max(compute, memory);
}

Seconds ComputeSeconds(const ModelSpec& model, const HardwareOptions& hw, const ComputeOp& op) {
  const Seconds overhead = hw.gpu_kernel_overhead;
  switch (op.kind) {
    case ComputeKind::kChunkPrefill: {
      // Every layer is its own roofline step (the layers are identical).
      WorkCost layer = LayerPrefillCost(model, op.new_tokens, op.context_tokens);
      return model.layers * (RooflineSeconds(layer, hw) + overhead);
    }
    case ComputeKind::kDecodeStep: {
      if (op.layer >= 0) return RooflineSeconds(ComputeCost(model, op), hw) + overhead;
      WorkCost layer = LayerDecodeCost(model, op.context_tokens);
      return model.layers * (RooflineSeconds(layer, hw) + overhead) +
             RooflineSeconds(OutputLayerCost(model), hw) + overhead;
    }
    default:
      return RooflineSeconds(ComputeCost(model, op), hw) + overhead;
  }
}

Seconds PrefixRecomputeSeconds(const ModelSpec& model, const HardwareOptions& hw,
                               std::int64_t tokens) {
  ComputeOp prefill;
  prefill.kind = ComputeKind::kChunkPrefill;
  prefill.new_tokens = tokens;
  prefill.context_tokens = tokens;
  ComputeOp head;
  head.kind = ComputeKind::kOutputLayer;
  return ComputeSeconds(model, hw, prefill) + ComputeSeconds(model, hw, head);
}

}  // namespace kvtier
