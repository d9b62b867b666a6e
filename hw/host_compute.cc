#include "hw/host_compute.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>

namespace kvtier::hw {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct HostCompute::Impl {
  ModelSpec model;
  Mat w_qkv, w_o, w_up, w_down, w_gate;  // one layer's weights, shared by every layer
  Mat kv_k, kv_v;                        // keys / values for up to kv_rows tokens (per kv head)
  Mat lm_head;                           // [hidden x vocab]

  void EnsureKv(std::int64_t m) {
    const int kvw = model.kv_heads * model.head_dim;
    if (kv_k.rows() >= m) return;
    kv_k = Mat::Random(m, kvw);
    kv_v = Mat::Random(m, kvw);
  }

  // Scores of `heads_used` query heads (n queries) against m keys, softmax; optionally times V.
  double Attention(std::int64_t n, std::int64_t m, int heads_used, bool with_v, const Mat& q) {
    if (n <= 0 || m <= 0) return 0;
    EnsureKv(m);
    const int hd = model.head_dim;
    const int group = std::max(1, model.heads / model.kv_heads);
    double flops = 0;
    Mat scores(n, m);
    Mat out(n, hd);
    for (int h = 0; h < heads_used; ++h) {
      const int kvh = std::min(model.kv_heads - 1, h / group);
      auto qh = q.block(0, (h % model.heads) * hd, n, hd);
      auto kh = kv_k.block(0, kvh * hd, m, hd);
      scores.noalias() = qh * kh.transpose();
      flops += 2.0 * double(n) * double(m) * hd;
      for (Eigen::Index r = 0; r < scores.rows(); ++r) {
        auto row = scores.row(r);
        const float mx = row.maxCoeff();
        row = (row.array() - mx).exp();
        row /= row.sum();
      }
      flops += 5.0 * double(n) * double(m);
      if (with_v) {
        auto vh = kv_v.block(0, kvh * hd, m, hd);
        out.noalias() = scores * vh;
        flops += 2.0 * double(n) * double(m) * hd;
      }
    }
    return flops;
  }

  // One layer for n rows attending m keys each. A decode layer split in two (DecodePart):
  // `scores` = QKV and the attention scores only, `attend` = attention with V, O and the FFN.
  double Layer(std::int64_t n, std::int64_t m, bool scores = true, bool attend = true) {
    if (n <= 0) return 0;
    const int d = model.hidden;
    double flops = 0;
    Mat q;
    if (scores) {
      Mat x = Mat::Random(n, d);
      Mat qkv = x * w_qkv;
      flops += 2.0 * double(n) * d * double(w_qkv.cols());
      q = qkv.leftCols(model.heads * model.head_dim);
    } else {
      q = Mat::Random(n, model.heads * model.head_dim);
    }
    flops += Attention(n, m, model.heads, attend, q);
    if (!attend) return flops;
    Mat attn = Mat::Random(n, model.heads * model.head_dim);
    Mat o = attn * w_o;
    flops += 2.0 * double(n) * double(w_o.rows()) * d;
    Mat up = o * w_up;
    flops += 2.0 * double(n) * d * model.ffn;
    if (model.family == ModelFamily::kLlama) {
      Mat gate = o * w_gate;
      flops += 2.0 * double(n) * d * model.ffn;
      up.array() *= gate.array() / (1.0f + (-gate.array()).exp());
    } else {
      up = up.cwiseMax(0.0f);
    }
    Mat down = up * w_down;
    flops += 2.0 * double(n) * model.ffn * d;
    volatile float sink = down(0, 0);
    (void)sink;
    return flops;
  }
};

HostCompute::HostCompute(const ModelSpec& model, unsigned seed) : impl_(std::make_unique<Impl>()) {
  std::srand(seed);
  Impl& m = *impl_;
  m.model = model;
  const int d = model.hidden, hd = model.head_dim;
  m.w_qkv = Mat::Random(d, (model.heads + 2 * model.kv_heads) * hd) * 0.02f;
  m.w_o = Mat::Random(model.heads * hd, d) * 0.02f;
  m.w_up = Mat::Random(d, model.ffn) * 0.02f;
  m.w_down = Mat::Random(model.ffn, d) * 0.02f;
  if (model.family == ModelFamily::kLlama) m.w_gate = Mat::Random(d, model.ffn) * 0.02f;
}

HostCompute::~HostCompute() = default;

double HostCompute::Run(const ComputeOp& op) {
  Impl& m = *impl_;
  const std::int64_t n = op.new_tokens, ctx = std::max(op.context_tokens, op.new_tokens);
  switch (op.kind) {
    case ComputeKind::kLayerPrefill: return m.Layer(n, ctx);
    case ComputeKind::kChunkPrefill: {
      double f = 0;
      for (int l = 0; l < m.model.layers; ++l) f += m.Layer(n, ctx);
      return f;
    }
    case ComputeKind::kProbeScores:
    case ComputeKind::kFullScores: {
      const int kv_heads = op.heads > 0 ? std::min(op.heads, m.model.kv_heads) : m.model.kv_heads;
      const int group = std::max(1, m.model.heads / m.model.kv_heads);
      Mat q = Mat::Random(std::max<std::int64_t>(1, n), m.model.heads * m.model.head_dim);
      return m.Attention(std::max<std::int64_t>(1, n), std::max<std::int64_t>(1, op.context_tokens),
                         std::min(m.model.heads, kv_heads * group), false, q);
    }
    case ComputeKind::kOutputLayer: {
      if (m.lm_head.size() == 0) m.lm_head = Mat::Random(m.model.hidden, m.model.vocab) * 0.02f;
      Mat x = Mat::Random(1, m.model.hidden);
      Mat logits = x * m.lm_head;
      volatile float sink = logits(0, 0);
      (void)sink;
      return 2.0 * m.model.hidden * double(m.model.vocab);
    }
    case ComputeKind::kDecodeStep: {
      if (op.layer >= 0) {
        // One layer of a batched decode step (core/executor.h): new_tokens rows whose query-key
        // pairs per query head sum to context_tokens; each row attends their mean.
        const std::int64_t rows = std::max<std::int64_t>(1, op.new_tokens);
        const std::int64_t keys = std::max<std::int64_t>(1, (op.context_tokens + rows - 1) / rows);
        return m.Layer(rows, keys, op.decode_part != DecodePart::kAttend,
                       op.decode_part != DecodePart::kScores);
      }
      double f = 0;
      for (int l = 0; l < m.model.layers; ++l) f += m.Layer(1, std::max<std::int64_t>(1, ctx));
      return f;
    }
  }
  return 0;
}

double HostCompute::MeasureGemmFlops(int m, int n, int k, int reps) {
  Mat a = Mat::Random(m, k), b = Mat::Random(k, n), c(m, n);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile float sink = c(0, 0);
    (void)sink;
    if (s > 0) best = std::max(best, 2.0 * m * double(n) * k / s);
  }
  return best;
}

}  // namespace kvtier::hw
