#include "traces/trace_format.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/errors.h"

namespace kvtier {

const char* ImportanceKindName(ImportanceKind kind) {
  switch (kind) {
    case ImportanceKind::kNone:
      return "none";
    case ImportanceKind::kExplicit:
      return "explicit";
    case ImportanceKind::kProcedural:
      return "procedural";
  }
  return "?";
}

std::string TraceHeader::Meta(const std::string& key, const std::string& fallback) const {
  for (const auto& [k, v] : metadata) {
    if (k == key) return v;
  }
  return fallback;
}

std::uint64_t ExplicitScores::EncodedBytes() const {
  return std::uint64_t(rows()) * (8 + std::uint64_t(tokens) * (bits == 8 ? 1 : 2));
}

void ExplicitScores::Row(int layer, int head, std::int64_t n, float* out) const {
  KVTIER_DCHECK(layer >= 0 && layer < layers && head >= 0 && head < kv_heads, "row out of range");
  KVTIER_DCHECK(n <= tokens, "more tokens than recorded");
  const std::int64_t r = std::int64_t(layer) * kv_heads + head;
  const float l = lo[r];
  const float step = (hi[r] - lo[r]) / float(bits == 8 ? 254 : 65534);
  const std::uint16_t* c = codes.data() + r * tokens;
  for (std::int64_t t = 0; t < n; ++t) {
    out[t] = c[t] == 0 ? 0.0f : std::exp2(l + float(c[t] - 1) * step);
  }
}

ExplicitScores ExplicitScores::Quantize(int layers, int kv_heads, std::int64_t tokens,
                                        std::span<const float> scores, int bits) {
  KVTIER_CHECK(bits == 8 || bits == 16, "bits must be 8 or 16");
  KVTIER_CHECK(std::int64_t(scores.size()) == std::int64_t(layers) * kv_heads * tokens,
               "scores size != layers * kv_heads * tokens");
  ExplicitScores e;
  e.layers = layers;
  e.kv_heads = kv_heads;
  e.tokens = tokens;
  e.bits = bits;
  const std::int64_t rows = e.rows();
  e.lo.assign(rows, 0);
  e.hi.assign(rows, 0);
  e.codes.assign(rows * tokens, 0);
  const double levels = bits == 8 ? 254 : 65534;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = scores.data() + r * tokens;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (!std::isfinite(s[t]) || s[t] < 0) {
        throw InputError("explicit scores: layer " + std::to_string(r / kv_heads) + " head " +
                         std::to_string(r % kv_heads) + " token " + std::to_string(t) +
                         ": score is not a finite non-negative number");
      }
      if (s[t] > 0) {
        const double l2 = std::log2(double(s[t]));
        lo = std::min(lo, l2);
        hi = std::max(hi, l2);
      }
    }
    if (lo > hi) lo = hi = 0;  // all zero
    e.lo[r] = float(lo);
    e.hi[r] = float(hi);
    // Quantize against the float-rounded range the reader will use.
    const double flo = e.lo[r], fhi = e.hi[r];
    const double scale = fhi > flo ? levels / (fhi - flo) : 0;
    std::uint16_t* c = e.codes.data() + r * tokens;
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (s[t] <= 0) continue;
      const double q = std::round((std::log2(double(s[t])) - flo) * scale);
      c[t] = static_cast<std::uint16_t>(1 + std::clamp(q, 0.0, levels));
    }
  }
  return e;
}

void TraceRecord::Clear() {
  request.id = 0;
  request.arrival_s = 0;
  request.prefix.clear();
  request.tokens_per_symbol = 1;
  request.query_tokens = 0;
  request.output_tokens = 0;
  prefix_kind = PrefixKind::kTokens;
  query_ids.clear();
  importance = ImportanceKind::kNone;
  query_key = 0;
  explicit_scores.layers = explicit_scores.kv_heads = 0;
  explicit_scores.tokens = 0;
  decode_topk.reset();
  decode_sets.reset();
}

}  // namespace kvtier
