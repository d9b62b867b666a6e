// CPU references against naive, independently written loops (double accumulation).
#include "kernels/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvtier::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Naive: probability of kv token j for query (i, h), in double.
double NaiveProb(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                 int i, int h, int j) {
  const int kvh = h / (s.heads / s.kv_heads);
  std::vector<double> logits(s.kv_tokens);
  for (int t = 0; t < s.kv_tokens; ++t) {
    double dot = 0;
    for (int d = 0; d < s.head_dim; ++d) {
      dot += double(q[(i * s.heads + h) * s.head_dim + d]) *
             k[(t * s.kv_heads + kvh) * s.head_dim + d];
    }
    logits[t] = dot / std::sqrt(double(s.head_dim));
  }
  double mx = logits[0], sum = 0;
  for (double l : logits) mx = std::max(mx, l);
  for (double l : logits) sum += std::exp(l - mx);
  return std::exp(logits[j] - mx) / sum;
}

const AttentionShape kShape{5, 8, 2, 16, 37};  // GQA group 4

TEST(ReferenceKernels, ProbeScoresAndH2OColumnSumsMatchNaive) {
  const AttentionShape s = kShape;
  auto q = Random(s.q_floats(), 1), k = Random(s.kv_floats(), 2);
  std::vector<float> probs(s.prob_floats(), NAN), colsum(s.colsum_floats(), NAN);
  ASSERT_TRUE(ProbeScoresRef(s, q.data(), k.data(), probs.data(), colsum.data()).ok());
  for (int h = 0; h < s.heads; ++h) {
    for (int i = 0; i < s.q_tokens; ++i) {
      double row = 0;
      for (int j = 0; j < s.kv_tokens; ++j) {
        const float p = probs[(h * s.q_tokens + i) * s.kv_tokens + j];
        EXPECT_NEAR(p, NaiveProb(s, q, k, i, h, j), 1e-5);
        row += p;
      }
      EXPECT_NEAR(row, 1.0, 1e-5);
    }
  }
  for (int kvh = 0; kvh < s.kv_heads; ++kvh) {
    for (int j = 0; j < s.kv_tokens; ++j) {
      double want = 0;
      for (int h = kvh * 4; h < kvh * 4 + 4; ++h) {
        for (int i = 0; i < s.q_tokens; ++i) want += NaiveProb(s, q, k, i, h, j);
      }
      EXPECT_NEAR(colsum[kvh * s.kv_tokens + j], want, 1e-4);
    }
  }
  // Column sums alone (no probs buffer) give the same values.
  std::vector<float> colsum2(s.colsum_floats(), NAN);
  ASSERT_TRUE(ProbeScoresRef(s, q.data(), k.data(), nullptr, colsum2.data()).ok());
  EXPECT_EQ(colsum, colsum2);
}

TEST(ReferenceKernels, TopKBreaksTiesByLowerIndexAndPutsNaNLast) {
  const TopKShape s{2, 6, 4};
  const float scores[] = {1,         3,   3, NAN, 2,   3,  // row 0
                          -INFINITY, NAN, 0, 0,   NAN, -1};
  std::vector<int32_t> idx(8, -7);
  ASSERT_TRUE(TopKRef(s, scores, idx.data()).ok());
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 2, 5, 4, 2, 3, 5, 0}));
  EXPECT_EQ(TopKRef({1, 3, 4}, scores, idx.data()).code(), Status::Code::kInvalidArgument);
}

TEST(ReferenceKernels, TopKMatchesFullSortOnRandomRows) {
  const TopKShape s{7, 300, 25};
  auto scores = Random(s.rows * s.cols, 3);
  for (int i = 0; i < 50; ++i) scores[i * 13] = scores[i * 13 + 1];  // some ties
  std::vector<int32_t> idx(s.rows * s.k);
  ASSERT_TRUE(TopKRef(s, scores.data(), idx.data()).ok());
  for (int r = 0; r < s.rows; ++r) {
    std::vector<std::pair<float, int>> all;
    for (int c = 0; c < s.cols; ++c) all.push_back({-scores[r * s.cols + c], c});
    std::sort(all.begin(), all.end());
    for (int t = 0; t < s.k; ++t) EXPECT_EQ(idx[r * s.k + t], all[t].second);
  }
}

TEST(ReferenceKernels, GatherCopiesSelectedRowsAcrossChunks) {
  const ChunkedKvLayout l{4, 6, 3};
  std::vector<std::vector<float>> chunks(3);
  std::vector<const float*> ptrs;
  for (int c = 0; c < 3; ++c) {
    chunks[c] = Random(4 * 6, 10 + c);
    ptrs.push_back(chunks[c].data());
  }
  const int32_t tokens[] = {11, 0, 5, 5, 8};
  std::vector<float> out(5 * 6, NAN);
  ASSERT_TRUE(GatherRowsRef(l, ptrs.data(), tokens, 5, out.data()).ok());
  for (int i = 0; i < 5; ++i) {
    for (int f = 0; f < 6; ++f)
      EXPECT_EQ(out[i * 6 + f], chunks[tokens[i] / 4][(tokens[i] % 4) * 6 + f]);
  }
  const int32_t bad[] = {12};
  EXPECT_EQ(GatherRowsRef(l, ptrs.data(), bad, 1, out.data()).code(),
            Status::Code::kInvalidArgument);
}

TEST(ReferenceKernels, AttentionOverKeptKvMatchesNaive) {
  const AttentionShape s = kShape;
  auto q = Random(s.q_floats(), 4), k = Random(s.kv_floats(), 5), v = Random(s.kv_floats(), 6);
  std::vector<float> out(s.q_floats(), NAN);
  ASSERT_TRUE(AttentionRef(s, q.data(), k.data(), v.data(), out.data()).ok());
  for (int i = 0; i < s.q_tokens; ++i) {
    for (int h = 0; h < s.heads; ++h) {
      for (int d = 0; d < s.head_dim; ++d) {
        double want = 0;
        for (int j = 0; j < s.kv_tokens; ++j) {
          want += NaiveProb(s, q, k, i, h, j) * v[(j * s.kv_heads + h / 4) * s.head_dim + d];
        }
        EXPECT_NEAR(out[(i * s.heads + h) * s.head_dim + d], want, 1e-5);
      }
    }
  }
}

TEST(ReferenceKernels, GemmMatchesNaiveBothLayouts) {
  const int m = 3, n = 5, kk = 7;
  auto a = Random(m * kk, 7), b = Random(kk * n, 8);
  std::vector<float> c(m * n), bt(n * kk), c2(m * n);
  for (int p = 0; p < kk; ++p)
    for (int j = 0; j < n; ++j) bt[j * kk + p] = b[p * n + j];
  ASSERT_TRUE(GemmRef(m, n, kk, a.data(), b.data(), false, c.data()).ok());
  ASSERT_TRUE(GemmRef(m, n, kk, a.data(), bt.data(), true, c2.data()).ok());
  // The two layouts are two loops the compiler optimises separately: at -O3 with FMA (GCC
  // contracts a * b + c in C++ by default) one may fuse multiply-adds the other rounds twice, so
  // their results need not be bit-equal. Each is a k-term float dot product, within
  // gamma_k * sum |a_p b_p| of the exact value (gamma_k = k u / (1 - k u), u = 2^-24; Higham,
  // Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5), fused or not; so each is
  // checked against the double-precision sum with that bound, and the two against each other
  // with twice it.
  const double u = std::ldexp(1.0, -24);
  const double gamma = kk * u / (1 - kk * u);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0, magnitude = 0;
      for (int p = 0; p < kk; ++p) {
        want += double(a[i * kk + p]) * b[p * n + j];
        magnitude += std::abs(double(a[i * kk + p]) * b[p * n + j]);
      }
      const double bound = gamma * magnitude;
      EXPECT_NEAR(c[i * n + j], want, bound) << i << "," << j;
      EXPECT_NEAR(c2[i * n + j], want, bound) << i << "," << j;
      EXPECT_NEAR(c[i * n + j], c2[i * n + j], 2 * bound) << i << "," << j;
    }
  }
}

// Low-bit key scores, by hand: 1 bit, group 32, one KV head with 2 channels, 2 query heads.
// Token t has code (t % 2) in channel 0 and (t / 2 % 2) in channel 1. Group 0: channel 0 scale
// 2, zero -1 (keys -1 / 1); channel 1 scale 4, zero 0.5 (keys 0.5 / 4.5). q0 = (1, 0), q1 =
// (0.5, 2); scores / sqrt(2).
TEST(ReferenceKernels, LowBitKeyScoresByHand) {
  const LowBitKeyShape s{1, 32, 32, 2, 1, 2};
  std::vector<uint8_t> codes(32 * 2);
  for (int t = 0; t < 32; ++t) {
    codes[t * 2 + 0] = static_cast<uint8_t>(t % 2);
    codes[t * 2 + 1] = static_cast<uint8_t>(t / 2 % 2);
  }
  std::vector<uint32_t> packed(s.code_words());
  ASSERT_EQ(packed.size(), 2u);  // one word per channel
  ASSERT_TRUE(PackLowBitCodes(s, codes.data(), packed.data()).ok());
  EXPECT_EQ(packed[0], 0xAAAAAAAAu);  // channel 0: codes 0,1,0,1,... LSB first
  EXPECT_EQ(packed[1], 0xCCCCCCCCu);  // channel 1: 0,0,1,1,...
  const std::vector<float> scale = {2, 4}, zero = {-1, 0.5f}, q = {1, 0, 0.5f, 2};
  std::vector<float> scores(s.score_floats());
  ASSERT_TRUE(LowBitKeyScoresRef(s, packed.data(), scale.data(), zero.data(), q.data(),
                                 scores.data()).ok());
  const float r = 1.0f / std::sqrt(2.0f);
  for (int t = 0; t < 32; ++t) {
    const float k0 = t % 2 ? 1.0f : -1.0f, k1 = t / 2 % 2 ? 4.5f : 0.5f;
    EXPECT_FLOAT_EQ(scores[t], k0 * r) << t;
    EXPECT_FLOAT_EQ(scores[32 + t], (0.5f * k0 + 2 * k1) * r) << t;
  }
}

// 2 bits, several groups and KV heads: the reference equals the dot product with the
// dequantized keys computed from the unpacked codes.
TEST(ReferenceKernels, LowBitKeyScoresMatchDequantizedKeys) {
  const LowBitKeyShape s{2, 16, 64, 6, 2, 8};
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(int64_t{s.tokens} * s.kv_heads * s.head_dim);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % 4);
  std::vector<uint32_t> packed(s.code_words());
  ASSERT_TRUE(PackLowBitCodes(s, codes.data(), packed.data()).ok());
  const std::vector<float> scale = Random(s.param_floats(), 4), zero = Random(s.param_floats(), 5),
                           q = Random(int64_t{s.heads} * s.head_dim, 6);
  std::vector<float> scores(s.score_floats());
  ASSERT_TRUE(LowBitKeyScoresRef(s, packed.data(), scale.data(), zero.data(), q.data(),
                                 scores.data()).ok());
  for (int h = 0; h < s.heads; ++h) {
    const int kvh = h / 3;
    for (int t = 0; t < s.tokens; ++t) {
      double dot = 0;
      for (int d = 0; d < s.head_dim; ++d) {
        const int64_t p = (int64_t{kvh} * s.token_groups() + t / s.group) * s.head_dim + d;
        const double k = double(codes[(int64_t{t} * s.kv_heads + kvh) * s.head_dim + d]) * scale[p] + zero[p];
        dot += q[h * s.head_dim + d] * k;
      }
      EXPECT_NEAR(scores[h * s.tokens + t], dot / std::sqrt(8.0), 1e-5) << h << " " << t;
    }
  }
}

TEST(ReferenceKernels, LowBitKeyShapesAndCodesAreChecked) {
  std::vector<uint32_t> packed(4);
  std::vector<uint8_t> codes(16, 0);
  EXPECT_FALSE(PackLowBitCodes({2, 8, 16, 1, 1, 1}, codes.data(), packed.data()).ok());  // 8*2 < 32
  EXPECT_FALSE(PackLowBitCodes({3, 32, 32, 1, 1, 1}, codes.data(), packed.data()).ok());
  EXPECT_FALSE(PackLowBitCodes({1, 32, 40, 1, 1, 1}, codes.data(), packed.data()).ok());
  std::vector<uint8_t> big(32, 2);  // 2 does not fit 1 bit
  EXPECT_FALSE(PackLowBitCodes({1, 32, 32, 1, 1, 1}, big.data(), packed.data()).ok());
}

}  // namespace
}  // namespace kvtier::kernels
