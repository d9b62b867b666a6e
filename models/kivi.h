#pragma once
// KIVI low-bit KV quantization (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for
// KV Cache", ICML 2024) with SpeCache's improved 1-bit zero-point and scale (Jie et al.,
// "SpeCache", ICML 2025, §3.4), as the low-bit GPU copy of the KV cache that SpeCache decodes
// with. kvtier simulates the quantization on the CPU: a KiviCache holds, for every quantized
// element, its dequantized value X' = Q(X) * s + z (what attention reads), so the forward pass
// (models/llama.h, LowBitAttention) needs no low-bit arithmetic.
//
// The layout KIVI uses (and this file follows), for group size g and residual length R:
//   keys   per-channel: a group is g consecutive tokens of one channel (of one KV head); the
//          group's min and max give its zero-point and scale. Keys are quantized R at a time:
//          with n tokens cached, tokens [0, floor(n / R) * R) are low-bit and the rest (fewer
//          than R) stay in full precision (KIVI Algorithm 1: prefill quantizes L - L mod R,
//          decoding quantizes the residual once it holds R tokens). R must be a multiple of g.
//   values per-token: a group is g consecutive channels of one token (of one KV head; g is
//          capped at head_dim). The most recent R tokens stay in full precision: tokens
//          [0, max(0, n - R)) are low-bit (KIVI quantizes the oldest residual value when the
//          residual exceeds R).
// So the low-bit copy is a pure function of the full-precision cache and n: KiviCache::Sync
// quantizes whatever became low-bit since the last call.
//
// Quantization of one group X (SpeCache eq. 2 / eq. 3), B bits, rounding half up, codes clamped
// to [0, 2^B - 1]:
//   Q(X) = round((X - z) / s),  X' = Q(X) * s + z
//   original KIVI (eq. 2):        z = min X,                 s = (max X - min X) / (2^B - 1)
//   improved 1-bit (eq. 3):       z = (3 min X + max X) / 4, s = (max X - min X) / 2
// Eq. 3 maps [min, mid) to (3 min + max) / 4 and [mid, max] to (min + 3 max) / 4, the midpoints
// of the two halves, instead of min and max. It only changes 1-bit quantization; 2-bit is
// always eq. 2. A group with max == min has s = 0 and every X' = z (= X).
// Scales and zero-points are kept in float32 (KIVI stores fp16; the difference is far below
// the quantization step). Bytes() prices them at 16 bits, as the GPU copy would hold them.
//
// Thread safety: a KiviCache is a plain value; Sync mutates it. The free functions are pure.

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier {

struct KvCache;

struct KiviConfig {
  int bits = 2;               // 1 or 2
  int group = 32;             // g
  int residual = 64;          // R: a multiple of `group`
  bool improved_1bit = true;  // SpeCache eq. 3 for 1-bit (false: original KIVI eq. 2)

  // Throws InputError naming the bad field ("kivi: bits 3 must be 1 or 2", ...). `head_dim`
  // (when > 0) must be a multiple of the value group min(group, head_dim).
  void Validate(int head_dim = 0) const;
  // "2-bit g=32 R=64" (+ " original" for the unimproved 1-bit).
  std::string ToString() const;
};

// The zero-point and scale of one group.
struct QuantParams {
  float zero = 0;
  float scale = 0;
};

// z and s of a group whose values lie in [lo, hi] (eq. 2, or eq. 3 for improved 1-bit).
QuantParams KiviParams(float lo, float hi, int bits, bool improved_1bit);

// round((x - z) / s) clamped to [0, 2^bits - 1] (0 when s == 0). Rounds half up.
int KiviCode(float x, const QuantParams& p, int bits);

// Q * s + z.
inline float KiviDequant(int code, const QuantParams& p) { return code * p.scale + p.zero; }

// Quantizes n values x[0], x[stride], ... as one group (min/max over them) and writes the
// dequantized values to out[0], out[stride], ... (out may equal x). Returns the group's
// parameters; `codes` (n entries, may be null) receives the codes.
QuantParams KiviFakeQuantize(const float* x, int n, int stride, int bits, bool improved_1bit,
                             float* out, std::uint8_t* codes = nullptr);

// Positions [0, KeyQuantizedTokens(n, R)) of a cache with n tokens hold low-bit keys.
inline int KeyQuantizedTokens(int n, int residual) { return n / residual * residual; }
// Positions [0, ValueQuantizedTokens(n, R)) hold low-bit values.
inline int ValueQuantizedTokens(int n, int residual) { return n > residual ? n - residual : 0; }
// Positions [0, LowBitTokens(n, R)) have a low-bit key or value: the candidates SpeCache may
// fetch in 16 bits (the rest are in the full-precision residual on the GPU already).
inline int LowBitTokens(int n, int residual) {
  const int k = KeyQuantizedTokens(n, residual), v = ValueQuantizedTokens(n, residual);
  return k > v ? k : v;
}

// The low-bit copy of a KvCache: dequantized keys and values of its quantized positions, same
// layout as KvCache ([layer] -> [token][kv_head][head_dim]); entries of positions not yet
// quantized are unspecified.
class KiviCache {
 public:
  KiviCache() = default;
  // REQUIRES: config validated for head_dim.
  KiviCache(const KiviConfig& config, int n_layers, int n_kv_heads, int head_dim);

  const KiviConfig& config() const { return config_; }
  int key_tokens() const { return key_tokens_; }      // low-bit keys: positions [0, key_tokens)
  int value_tokens() const { return value_tokens_; }  // low-bit values: [0, value_tokens)
  int low_bit_tokens() const { return key_tokens_ > value_tokens_ ? key_tokens_ : value_tokens_; }

  // Quantizes the positions of `full` that became low-bit since the last call (the rules
  // above for n = full.n_tokens). REQUIRES: full shaped like this cache, and every position
  // already quantized unchanged in `full` since (call Truncate when the KvCache is truncated).
  void Sync(const KvCache& full);
  // Forgets quantized positions that a KvCache truncated to n tokens no longer has (those at
  // or after the low-bit limits for n); the next Sync requantizes them from the new tokens.
  void Truncate(int n);

  const float* K(int layer, int token, int kv_head) const {
    return k_[layer].data() + (static_cast<size_t>(token) * n_kv_heads_ + kv_head) * head_dim_;
  }
  const float* V(int layer, int token, int kv_head) const {
    return v_[layer].data() + (static_cast<size_t>(token) * n_kv_heads_ + kv_head) * head_dim_;
  }

  // Bytes the GPU copy of `n` cached tokens would take, per layer summed: low-bit codes of the
  // quantized positions, a 16-bit zero-point and scale per group, and 16-bit K and V for the
  // residual positions (what is not quantized).
  static std::uint64_t GpuBytes(const KiviConfig& config, int n, int n_layers, int n_kv_heads,
                                int head_dim);

 private:
  KiviConfig config_;
  int n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  int key_tokens_ = 0, value_tokens_ = 0;
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace kvtier
