#include "kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace kvtier::kernels {
namespace {

Status BadShape(const char* op) { return Status::InvalidArgument(std::string(op) + ": bad shape"); }

// One softmax row: probs[j] = softmax_j(q . k_j * scale) for kv head `kvh`.
void SoftmaxRow(const AttentionShape& s, const float* qrow, const float* k, int32_t kvh,
                float* row) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t j = 0; j < s.kv_tokens; ++j) {
    const float* krow = k + (int64_t{j} * s.kv_heads + kvh) * s.head_dim;
    float dot = 0.0f;
    for (int32_t d = 0; d < s.head_dim; ++d) dot += qrow[d] * krow[d];
    row[j] = dot * scale;
    mx = std::max(mx, row[j]);
  }
  float sum = 0.0f;
  for (int32_t j = 0; j < s.kv_tokens; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  for (int32_t j = 0; j < s.kv_tokens; ++j) row[j] /= sum;
}

}  // namespace

Status ProbeScoresRef(const AttentionShape& s, const float* q, const float* k, float* probs,
                      float* colsum) {
  if (!s.valid()) return BadShape("ProbeScoresRef");
  std::vector<float> scratch(probs ? 0 : s.kv_tokens);
  if (colsum) std::fill(colsum, colsum + s.colsum_floats(), 0.0f);
  for (int32_t h = 0; h < s.heads; ++h) {
    const int32_t kvh = h / s.group();
    for (int32_t i = 0; i < s.q_tokens; ++i) {
      float* row = probs ? probs + (int64_t{h} * s.q_tokens + i) * s.kv_tokens : scratch.data();
      SoftmaxRow(s, q + (int64_t{i} * s.heads + h) * s.head_dim, k, kvh, row);
      if (colsum) {
        float* cs = colsum + int64_t{kvh} * s.kv_tokens;
        for (int32_t j = 0; j < s.kv_tokens; ++j) cs[j] += row[j];
      }
    }
  }
  return Status::OK();
}

Status LowBitKeyScoresRef(const LowBitKeyShape& s, const uint32_t* codes, const float* scale,
                          const float* zero, const float* q, float* scores) {
  if (!s.valid()) return BadShape("LowBitKeyScoresRef");
  const float inv = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int32_t group = s.heads / s.kv_heads;
  for (int32_t h = 0; h < s.heads; ++h) {
    const int32_t kvh = h / group;
    for (int32_t t = 0; t < s.tokens; ++t) {
      float dot = 0.0f;
      for (int32_t d = 0; d < s.head_dim; ++d) {
        const int64_t p = s.Param(kvh, t, d);
        const float k = static_cast<float>(s.Code(codes, kvh, t, d)) * scale[p] + zero[p];
        dot += q[int64_t{h} * s.head_dim + d] * k;
      }
      scores[int64_t{h} * s.tokens + t] = dot * inv;
    }
  }
  return Status::OK();
}

Status PackLowBitCodes(const LowBitKeyShape& s, const uint8_t* codes, uint32_t* packed) {
  if (!s.valid()) return BadShape("PackLowBitCodes");
  std::fill(packed, packed + s.code_words(), 0u);
  for (int32_t t = 0; t < s.tokens; ++t) {
    for (int32_t kvh = 0; kvh < s.kv_heads; ++kvh) {
      for (int32_t d = 0; d < s.head_dim; ++d) {
        const uint32_t c = codes[(int64_t{t} * s.kv_heads + kvh) * s.head_dim + d];
        if (c >= (1u << s.bits)) {
          return Status::InvalidArgument("PackLowBitCodes: code " + std::to_string(c) +
                                         " does not fit " + std::to_string(s.bits) + " bits");
        }
        const int32_t g = t / s.group, i = t % s.group;
        packed[((int64_t{kvh} * s.token_groups() + g) * s.head_dim + d) * s.words_per_group() +
               i / s.per_word()] |= c << ((i % s.per_word()) * s.bits);
      }
    }
  }
  return Status::OK();
}

Status TopKRef(const TopKShape& s, const float* scores, int32_t* indices) {
  if (!s.valid()) return BadShape("TopKRef");
  std::vector<int32_t> order(s.cols);
  for (int32_t r = 0; r < s.rows; ++r) {
    const float* row = scores + int64_t{r} * s.cols;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + s.k, order.end(),
                      [row](int32_t a, int32_t b) { return RanksBefore(row[a], a, row[b], b); });
    std::copy(order.begin(), order.begin() + s.k, indices + int64_t{r} * s.k);
  }
  return Status::OK();
}

Status GatherRowsRef(const ChunkedKvLayout& l, const float* const* chunks, const int32_t* tokens,
                     int32_t n, float* out) {
  if (!l.valid() || n < 0) return BadShape("GatherRowsRef");
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= l.tokens()) {
      return Status::InvalidArgument("GatherRowsRef: token " + std::to_string(t) + " outside [0, " +
                                     std::to_string(l.tokens()) + ")");
    }
    const float* src = chunks[t / l.chunk_tokens] + int64_t{t % l.chunk_tokens} * l.row_floats;
    std::copy(src, src + l.row_floats, out + int64_t{i} * l.row_floats);
  }
  return Status::OK();
}

Status AttentionRef(const AttentionShape& s, const float* q, const float* k, const float* v,
                    float* out) {
  if (!s.valid()) return BadShape("AttentionRef");
  std::vector<float> row(s.kv_tokens);
  for (int32_t i = 0; i < s.q_tokens; ++i) {
    for (int32_t h = 0; h < s.heads; ++h) {
      const int32_t kvh = h / s.group();
      SoftmaxRow(s, q + (int64_t{i} * s.heads + h) * s.head_dim, k, kvh, row.data());
      float* o = out + (int64_t{i} * s.heads + h) * s.head_dim;
      std::fill(o, o + s.head_dim, 0.0f);
      for (int32_t j = 0; j < s.kv_tokens; ++j) {
        const float* vrow = v + (int64_t{j} * s.kv_heads + kvh) * s.head_dim;
        for (int32_t d = 0; d < s.head_dim; ++d) o[d] += row[j] * vrow[d];
      }
    }
  }
  return Status::OK();
}

Status GemmRef(int32_t m, int32_t n, int32_t k, const float* a, const float* b, bool transpose_b,
               float* c) {
  if (m <= 0 || n <= 0 || k <= 0) return BadShape("GemmRef");
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int32_t p = 0; p < k; ++p) {
        const float bv = transpose_b ? b[int64_t{j} * k + p] : b[int64_t{p} * n + j];
        acc += a[int64_t{i} * k + p] * bv;
      }
      c[int64_t{i} * n + j] = acc;
    }
  }
  return Status::OK();
}

Status GatherRunsRef(const CopyRun* runs, int64_t n) {
  if (n < 0 || (n > 0 && runs == nullptr)) return Status::InvalidArgument("GatherRunsRef: bad runs");
  for (int64_t i = 0; i < n; ++i) {
    const CopyRun& r = runs[i];
    if (r.bytes == 0) continue;
    if (r.dst == nullptr || r.src == nullptr) {
      return Status::InvalidArgument("GatherRunsRef: run " + std::to_string(i) +
                                     " has a null pointer");
    }
    std::memcpy(r.dst, r.src, r.bytes);
  }
  return Status::OK();
}

}  // namespace kvtier::kernels
