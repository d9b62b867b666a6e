// KIVI quantization and the low-bit cache copy (see kivi.h).

#include "models/kivi.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/errors.h"
#include "models/llama.h"

namespace kvtier {

void KiviConfig::Validate(int head_dim) const {
  if (bits != 1 && bits != 2) {
    throw InputError("kivi: bits " + std::to_string(bits) + " must be 1 or 2");
  }
  if (group < 1) throw InputError("kivi: group size " + std::to_string(group) + " must be >= 1");
  if (residual < group || residual % group != 0) {
    throw InputError("kivi: residual length " + std::to_string(residual) +
                     " must be a positive multiple of the group size " + std::to_string(group) +
                     " (keys are quantized in whole per-channel groups)");
  }
  if (head_dim > 0 && head_dim % std::min(group, head_dim) != 0) {
    throw InputError("kivi: head_dim " + std::to_string(head_dim) +
                     " is not a multiple of the value group size " + std::to_string(group));
  }
}

std::string KiviConfig::ToString() const {
  std::string s = std::to_string(bits) + "-bit g=" + std::to_string(group) +
                  " R=" + std::to_string(residual);
  if (bits == 1 && !improved_1bit) s += " original";
  return s;
}

QuantParams KiviParams(float lo, float hi, int bits, bool improved_1bit) {
  QuantParams p;
  if (bits == 1 && improved_1bit) {
    // SpeCache eq. 3: the midpoints of [min, mid) and [mid, max].
    p.zero = (3.0f * lo + hi) / 4.0f;
    p.scale = (hi - lo) / 2.0f;
  } else {
    // KIVI / SpeCache eq. 2.
    p.zero = lo;
    p.scale = (hi - lo) / static_cast<float>((1 << bits) - 1);
  }
  return p;
}

int KiviCode(float x, const QuantParams& p, int bits) {
  if (!(p.scale > 0)) return 0;
  const int top = (1 << bits) - 1;
  const float q = std::floor((x - p.zero) / p.scale + 0.5f);
  return q <= 0 ? 0 : (q >= static_cast<float>(top) ? top : static_cast<int>(q));
}

QuantParams KiviFakeQuantize(const float* x, int n, int stride, int bits, bool improved_1bit,
                             float* out, std::uint8_t* codes) {
  KVTIER_CHECK(n >= 1, "KiviFakeQuantize of an empty group");
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[static_cast<size_t>(i) * stride]);
    hi = std::max(hi, x[static_cast<size_t>(i) * stride]);
  }
  const QuantParams p = KiviParams(lo, hi, bits, improved_1bit);
  for (int i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(i) * stride;
    const int c = KiviCode(x[at], p, bits);
    if (codes != nullptr) codes[i] = static_cast<std::uint8_t>(c);
    out[at] = KiviDequant(c, p);
  }
  return p;
}

KiviCache::KiviCache(const KiviConfig& config, int n_layers, int n_kv_heads, int head_dim)
    : config_(config),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      k_(n_layers),
      v_(n_layers) {}

void KiviCache::Truncate(int n) {
  key_tokens_ = std::min(key_tokens_, KeyQuantizedTokens(n, config_.residual));
  value_tokens_ = std::min(value_tokens_, ValueQuantizedTokens(n, config_.residual));
}

void KiviCache::Sync(const KvCache& full) {
  KVTIER_CHECK(full.n_layers == n_layers_ && full.n_kv_heads == n_kv_heads_ &&
                   full.head_dim == head_dim_,
               "KiviCache::Sync with a cache of another shape");
  const int n = full.n_tokens;
  const int key_to = KeyQuantizedTokens(n, config_.residual);
  const int value_to = ValueQuantizedTokens(n, config_.residual);
  const int g = config_.group, gv = std::min(config_.group, head_dim_);
  const int bits = config_.bits;
  const bool improved = config_.improved_1bit;
  const size_t row = static_cast<size_t>(n_kv_heads_) * head_dim_;  // floats per token
  for (int l = 0; l < n_layers_; ++l) {
    const size_t need = static_cast<size_t>(std::max(key_to, value_to)) * row;
    if (k_[l].size() < need) {
      k_[l].resize(need);
      v_[l].resize(need);
    }
    // Keys: per channel, groups of g tokens ([key_tokens_, key_to) is whole groups: both are
    // multiples of R, a multiple of g).
    for (int t0 = key_tokens_; t0 < key_to; t0 += g) {
      for (size_t c = 0; c < row; ++c) {  // every (KV head, channel)
        const size_t at = static_cast<size_t>(t0) * row + c;
        KiviFakeQuantize(full.k[l].data() + at, g, static_cast<int>(row), bits, improved,
                         k_[l].data() + at);
      }
    }
    // Values: per token, groups of gv channels of one KV head.
    for (int t = value_tokens_; t < value_to; ++t) {
      for (size_t c0 = 0; c0 < row; c0 += gv) {
        const size_t at = static_cast<size_t>(t) * row + c0;
        KiviFakeQuantize(full.v[l].data() + at, gv, 1, bits, improved, v_[l].data() + at);
      }
    }
  }
  key_tokens_ = std::max(key_tokens_, key_to);
  value_tokens_ = std::max(value_tokens_, value_to);
}

std::uint64_t KiviCache::GpuBytes(const KiviConfig& config, int n, int n_layers, int n_kv_heads,
                                  int head_dim) {
  const std::uint64_t qk = KeyQuantizedTokens(n, config.residual);
  const std::uint64_t qv = ValueQuantizedTokens(n, config.residual);
  const std::uint64_t gv = std::min(config.group, head_dim);
  const std::uint64_t d = head_dim;
  std::uint64_t bits = (qk + qv) * d * config.bits;         // codes
  bits += (qk / config.group) * d * 32;                      // key groups: fp16 zero + scale
  bits += qv * (d / gv) * 32;                                // value groups
  bits += ((n - qk) + (n - qv)) * d * 16;                    // 16-bit residual K and V
  return (bits * n_layers * n_kv_heads + 7) / 8;
}

}  // namespace kvtier
