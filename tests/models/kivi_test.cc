// KIVI quantization (models/kivi.h) against hand-computed values: eq. 2 at 2 and 1 bits, the
// improved 1-bit eq. 3, the per-channel key / per-token value grouping and the residual window
// of KiviCache, and the GPU byte count.

#include "models/kivi.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/errors.h"
#include "kernels/reference.h"
#include "models/llama.h"

namespace kvtier {
namespace {

std::vector<float> Fake(std::vector<float> x, int bits, bool improved,
                        std::vector<std::uint8_t>* codes = nullptr) {
  std::vector<std::uint8_t> c(x.size());
  KiviFakeQuantize(x.data(), static_cast<int>(x.size()), 1, bits, improved, x.data(), c.data());
  if (codes) *codes = c;
  return x;
}

TEST(KiviQuant, TwoBitIsEquationTwo) {
  // min -1, max 2: z = -1, s = 1; (x - z) / s = 0, 1.2, 1.5, 3 -> codes 0, 1, 2 (half up), 3.
  std::vector<std::uint8_t> codes;
  EXPECT_EQ(Fake({-1, 0.2f, 0.5f, 2}, 2, true, &codes), (std::vector<float>{-1, 0, 1, 2}));
  EXPECT_EQ(codes, (std::vector<std::uint8_t>{0, 1, 2, 3}));
  // The improved flag changes nothing at 2 bits.
  EXPECT_EQ(Fake({-1, 0.2f, 0.5f, 2}, 2, false), (std::vector<float>{-1, 0, 1, 2}));
  const QuantParams p = KiviParams(-1, 2, 2, true);
  EXPECT_FLOAT_EQ(p.zero, -1);
  EXPECT_FLOAT_EQ(p.scale, 1);
}

TEST(KiviQuant, ImprovedOneBitMapsHalvesToTheirMidpoints) {
  // Eq. 3 for min -1, max 2: z = (3 * -1 + 2) / 4 = -0.25, s = 3 / 2 = 1.5. [min, mid = 0.5)
  // -> -0.25 = (3 min + max) / 4; [mid, max] -> 1.25 = (min + 3 max) / 4.
  const QuantParams p = KiviParams(-1, 2, 1, true);
  EXPECT_FLOAT_EQ(p.zero, -0.25f);
  EXPECT_FLOAT_EQ(p.scale, 1.5f);
  std::vector<std::uint8_t> codes;
  EXPECT_EQ(Fake({-1, 0.2f, 0.5f, 2, 0.49f}, 1, true, &codes),
            (std::vector<float>{-0.25f, -0.25f, 1.25f, 1.25f, -0.25f}));
  EXPECT_EQ(codes, (std::vector<std::uint8_t>{0, 0, 1, 1, 0}));
}

TEST(KiviQuant, OriginalOneBitMapsToMinAndMax) {
  // Eq. 2 at 1 bit: z = -1, s = 3: values land on min or max (the "unusually large magnitude"
  // SpeCache §3.4 fixes).
  EXPECT_EQ(Fake({-1, 0.2f, 0.5f, 2}, 1, false), (std::vector<float>{-1, -1, 2, 2}));
}

TEST(KiviQuant, ConstantGroupIsExact) {
  EXPECT_EQ(Fake({0.75f, 0.75f, 0.75f}, 1, true), (std::vector<float>{0.75f, 0.75f, 0.75f}));
  EXPECT_EQ(Fake({0.75f, 0.75f, 0.75f}, 2, true), (std::vector<float>{0.75f, 0.75f, 0.75f}));
  EXPECT_EQ(KiviCode(5.0f, QuantParams{1.0f, 0.0f}, 2), 0);
}

TEST(KiviQuant, ConfigValidation) {
  KiviConfig c;
  EXPECT_NO_THROW(c.Validate(64));
  c.bits = 3;
  EXPECT_THROW(c.Validate(), InputError);
  c = KiviConfig();
  c.residual = 48;  // not a multiple of 32
  EXPECT_THROW(c.Validate(), InputError);
  c = KiviConfig();
  c.group = 24;
  c.residual = 48;
  EXPECT_THROW(c.Validate(64), InputError);  // 64 channels do not split into groups of 24
  c.group = 128;
  c.residual = 128;
  EXPECT_NO_THROW(c.Validate(64));  // the value group is capped at head_dim
  EXPECT_EQ(KiviConfig().ToString(), "2-bit g=32 R=64");
}

// One layer, one KV head, head_dim 4: key k[t][c] = t * 4 + c (distinct), value v[t][c] = t -
// c * c (per-token spread).
KvCache Linear(int n) {
  KvCache c;
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.n_tokens = n;
  c.k.assign(1, {});
  c.v.assign(1, {});
  for (int t = 0; t < n; ++t) {
    for (int ch = 0; ch < 4; ++ch) {
      c.k[0].push_back(static_cast<float>(t * 4 + ch) + (t % 4 == 1 ? 2.0f : 0.0f));
      c.v[0].push_back(static_cast<float>(t - ch * ch));
    }
  }
  return c;
}

TEST(KiviCacheTest, KeysPerChannelValuesPerTokenWithResidual) {
  KiviConfig cfg;
  cfg.bits = 2;
  cfg.group = 4;
  cfg.residual = 4;
  KiviCache q(cfg, 1, 1, 4);
  KvCache full = Linear(9);
  q.Sync(full);
  // n = 9, R = 4: keys quantized below floor(9 / 4) * 4 = 8, values below 9 - 4 = 5.
  EXPECT_EQ(q.key_tokens(), 8);
  EXPECT_EQ(q.value_tokens(), 5);
  EXPECT_EQ(q.low_bit_tokens(), 8);
  // Key channel 0 over tokens 0-3 is {0, 6, 8, 12} (token 1 has +2): min 0, max 12, s = 4:
  // codes 0, round(1.5) = 2, 2, 3 -> {0, 8, 8, 12}.
  const float want0[4] = {0, 8, 8, 12};
  for (int t = 0; t < 4; ++t) EXPECT_FLOAT_EQ(q.K(0, t, 0)[0], want0[t]) << "token " << t;
  // Channel 3 over tokens 4-7 is {19, 25, 27, 31} (token 5 has +2): z = 19, s = 4: codes 0,
  // round(1.5) = 2, 2, 3 -> {19, 27, 27, 31}.
  const float want3[4] = {19, 27, 27, 31};
  for (int t = 4; t < 8; ++t) EXPECT_FLOAT_EQ(q.K(0, t, 0)[3], want3[t - 4]) << "token " << t;
  // Token 2's value {2, 1, -2, -7}: per token over its 4 channels: min -7, max 2, s = 3:
  // codes round(3) = 3, round(2.67) = 3, round(1.67) = 2, 0 -> {2, 2, -1, -7}.
  const float want_v[4] = {2, 2, -1, -7};
  for (int ch = 0; ch < 4; ++ch) EXPECT_FLOAT_EQ(q.V(0, 2, 0)[ch], want_v[ch]) << "channel " << ch;

  // One more token: values below 6 now, keys unchanged until the residual holds R = 4 keys.
  full = Linear(10);
  q.Sync(full);
  EXPECT_EQ(q.key_tokens(), 8);
  EXPECT_EQ(q.value_tokens(), 6);
  full = Linear(12);
  q.Sync(full);
  EXPECT_EQ(q.key_tokens(), 12);
  EXPECT_EQ(q.value_tokens(), 8);

  // Truncation forgets what the shorter cache no longer has quantized.
  q.Truncate(6);
  EXPECT_EQ(q.key_tokens(), 4);
  EXPECT_EQ(q.value_tokens(), 2);
}

TEST(KiviCacheTest, ValueGroupsSplitTheHead) {
  KiviConfig cfg;
  cfg.bits = 1;
  cfg.group = 2;
  cfg.residual = 2;
  KiviCache q(cfg, 1, 1, 4);
  const KvCache full = Linear(3);
  q.Sync(full);
  ASSERT_EQ(q.value_tokens(), 1);
  // Token 0's value {0, -1, -4, -9} in groups of 2 channels: {0, -1} -> improved 1-bit
  // midpoints -0.75 and -0.25; {-4, -9} -> -7.75 and -5.25.
  const float want[4] = {-0.25f, -0.75f, -5.25f, -7.75f};
  for (int ch = 0; ch < 4; ++ch) EXPECT_FLOAT_EQ(q.V(0, 0, 0)[ch], want[ch]) << "channel " << ch;
}

TEST(KiviCacheTest, GpuBytesCountCodesGroupsAndResidual) {
  KiviConfig cfg;  // 2-bit, g = 32, R = 64
  // n = 1000, head_dim 64, 2 layers x 3 KV heads: keys quantized 960 (30 groups), values 936.
  // codes (960 + 936) * 64 * 2 bits; key groups 30 * 64 * 32 bits; value groups 936 * 2 * 32
  // bits; residual (40 + 64) * 64 * 16 bits.
  const std::uint64_t bits = (960ull + 936) * 64 * 2 + 30ull * 64 * 32 + 936ull * 2 * 32 +
                             (40ull + 64) * 64 * 16;
  EXPECT_EQ(KiviCache::GpuBytes(cfg, 1000, 2, 3, 64), bits * 6 / 8);
}

// The low-bit key score kernel's layout carries exactly the model's KIVI keys: codes and
// zero/scale from KiviFakeQuantize, packed, score like the KiviCache's dequantized keys.
TEST(KiviCacheTest, KernelLayoutScoresEqualTheCachesLowBitKeys) {
  for (int bits : {1, 2}) {
    KiviConfig cfg;
    cfg.bits = bits;
    cfg.group = 32;
    cfg.residual = 32;
    const int n = 96, kv = 2, d = 8, heads = 4;
    KvCache full;
    full.n_layers = 1;
    full.n_kv_heads = kv;
    full.head_dim = d;
    full.n_tokens = n;
    full.k.assign(1, {});
    full.v.assign(1, std::vector<float>(static_cast<size_t>(n) * kv * d, 0.0f));
    for (int i = 0; i < n * kv * d; ++i) full.k[0].push_back(std::sin(0.37f * i) * (1 + i % 5));
    KiviCache q(cfg, 1, kv, d);
    q.Sync(full);
    ASSERT_EQ(q.key_tokens(), n);

    const kernels::LowBitKeyShape s{bits, 32, n, heads, kv, d};
    std::vector<std::uint8_t> codes(static_cast<size_t>(n) * kv * d);
    std::vector<float> scale(s.param_floats()), zero(s.param_floats());
    std::vector<float> scratch(32 * kv * d);  // KiviFakeQuantize writes at the input's stride
    std::vector<std::uint8_t> gc(32);
    for (int h = 0; h < kv; ++h) {
      for (int g = 0; g < n / 32; ++g) {
        for (int c = 0; c < d; ++c) {
          const float* x = full.K(0, g * 32, h) + c;
          const QuantParams p = KiviFakeQuantize(x, 32, kv * d, bits, true, scratch.data(), gc.data());
          for (int t = 0; t < 32; ++t) codes[(static_cast<size_t>(g * 32 + t) * kv + h) * d + c] = gc[t];
          scale[(static_cast<size_t>(h) * (n / 32) + g) * d + c] = p.scale;
          zero[(static_cast<size_t>(h) * (n / 32) + g) * d + c] = p.zero;
        }
      }
    }
    std::vector<std::uint32_t> packed(s.code_words());
    ASSERT_TRUE(kernels::PackLowBitCodes(s, codes.data(), packed.data()).ok());
    std::vector<float> query(heads * d);
    for (int i = 0; i < heads * d; ++i) query[i] = std::cos(0.11f * i);
    std::vector<float> scores(s.score_floats());
    ASSERT_TRUE(kernels::LowBitKeyScoresRef(s, packed.data(), scale.data(), zero.data(),
                                            query.data(), scores.data()).ok());
    for (int hq = 0; hq < heads; ++hq) {
      for (int t = 0; t < n; ++t) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += query[hq * d + c] * q.K(0, t, hq / 2)[c];
        EXPECT_NEAR(scores[hq * n + t], dot / std::sqrt(double(d)), 1e-5) << bits << " " << hq << " " << t;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier
