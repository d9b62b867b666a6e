// ITF (SPEC §IV-B): the paper's worked examples and properties of the selection functions.
#include "core/itf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace kvtier {
namespace {

// ---- The paper's worked examples --------------------------------------------------------------

TEST(ItfPaperTest, Fig7JaccardOfTwoHeads) {
  // h0 = {0, 2}, h1 = {0, 1}: J = 1/3.
  EXPECT_DOUBLE_EQ(Jaccard({0, 2}, {0, 1}), 1.0 / 3);
  EXPECT_DOUBLE_EQ(Jaccard({0, 1}, {0, 2}), 1.0 / 3);
}

TEST(ItfPaperTest, RandomJaccardAndThreshold) {
  // n = 4, k = 1: j = (1/4) / (2 - 1/4) = 1/7.
  EXPECT_DOUBLE_EQ(RandomJaccard(1, 4), 1.0 / 7);
  EXPECT_DOUBLE_EQ(ItfThreshold(1, 4, 0.6), std::pow(1.0 / 7, 0.6));
  // n = 4, k = 2: j = 1 / (4 - 1) = 1/3.
  EXPECT_DOUBLE_EQ(RandomJaccard(2, 4), 1.0 / 3);
  // alpha = 0: t = 1 whatever k; k = n: j = t = 1.
  EXPECT_EQ(ItfThreshold(1, 4, 0.0), 1.0);
  EXPECT_EQ(ItfThreshold(1000, 4096, 0.0), 1.0);
  EXPECT_EQ(RandomJaccard(4, 4), 1.0);
  EXPECT_EQ(ItfThreshold(4, 4, 0.6), 1.0);
  EXPECT_EQ(RandomJaccard(0, 4), 0.0);
  // Larger alpha lowers the threshold toward j (j < 1): alpha = 1 gives t = j.
  EXPECT_DOUBLE_EQ(ItfThreshold(100, 1000, 1.0), RandomJaccard(100, 1000));
  EXPECT_GT(ItfThreshold(100, 1000, 0.6), RandomJaccard(100, 1000));
}

TEST(ItfPaperTest, Fig9VectorCounts) {
  // 4 prefix tokens, 32 heads, 3 probe heads, 1 important token.
  const LayerVectorCount without = CountVectorsWithoutItf(4, 32, 1);
  EXPECT_EQ(without.probe_keys, 0);
  EXPECT_EQ(without.keys, 128);   // 32 x 4
  EXPECT_EQ(without.values, 32);  // 32 x 1
  EXPECT_EQ(without.total(), 160);
  const LayerVectorCount with = CountVectorsWithItf(4, 32, 3, 1, /*fallback=*/false);
  EXPECT_EQ(with.probe_keys, 12);          // 3 x 4
  EXPECT_EQ(with.keys + with.values, 64);  // 32 x 1 x 2
  EXPECT_EQ(with.total(), 76);
  // Fallback: the probe keys were read for nothing, then the layer loads as without ITF.
  const LayerVectorCount fallback = CountVectorsWithItf(4, 32, 3, 1, /*fallback=*/true);
  EXPECT_EQ(fallback.total(), 160 + 12);
}

// Fig. 9 with scores: n = 4, retention 1/4 -> k = 1, t = (1/7)^0.6 ~= 0.311.
constexpr std::int64_t kN = 4;
ItfOptions Fig9Options() { return ItfOptions{3, 0.6, 0.25}; }

TEST(ItfPaperTest, Fig9ProbesAgreeSoItfPassesWithTheirToken) {
  const std::vector<float> scores = {
      0.1f, 0.2f, 0.9f, 0.3f,  // probe 0 -> {2}
      0.0f, 0.1f, 0.7f, 0.2f,  // probe 1 -> {2}
      0.3f, 0.2f, 0.8f, 0.1f,  // probe 2 -> {2}
  };
  const ItfDecision d = SelectItf(scores, 3, kN, Fig9Options());
  EXPECT_EQ(d.k, 1);
  EXPECT_FALSE(d.fallback);
  EXPECT_EQ(d.similarity, 1.0);
  EXPECT_NEAR(d.threshold, 0.311, 1e-3);
  EXPECT_EQ(d.voted, (TokenSet{2}));
  EXPECT_EQ(d.probe_sets, (std::vector<TokenSet>{{2}, {2}, {2}}));
  EXPECT_EQ(CountVectorsWithItf(kN, 32, 3, d.k, d.fallback).total(), 76);
}

TEST(ItfPaperTest, Fig9ProbesDisagreeSoTheLayerFallsBack) {
  const std::vector<float> scores = {
      0.9f, 0.2f, 0.1f, 0.3f,  // {0}
      0.0f, 0.8f, 0.1f, 0.2f,  // {1}
      0.3f, 0.2f, 0.8f, 0.1f,  // {2}
  };
  const ItfDecision d = SelectItf(scores, 3, kN, Fig9Options());
  EXPECT_TRUE(d.fallback);
  EXPECT_EQ(d.similarity, 0.0);
  EXPECT_TRUE(d.voted.empty());
  EXPECT_EQ(CountVectorsWithItf(kN, 32, 3, d.k, d.fallback).total(), 172);
}

TEST(ItfPaperTest, TwoOfThreeProbesAgreeingPassesAndTheMajorityWins) {
  // Pairwise J = 1, 0, 0: s = 1/3 >= 0.311 -> pass; token 1 has two votes.
  const std::vector<float> scores = {
      0.0f, 0.8f, 0.1f, 0.2f,  // {1}
      0.9f, 0.2f, 0.1f, 0.3f,  // {0}, and the highest single score
      0.0f, 0.7f, 0.1f, 0.2f,  // {1}
  };
  const ItfDecision d = SelectItf(scores, 3, kN, Fig9Options());
  EXPECT_NEAR(d.similarity, 1.0 / 3, 1e-12);
  EXPECT_FALSE(d.fallback);
  EXPECT_EQ(d.voted, (TokenSet{1}));
  // The same probes under alpha = 0 (t = 1) fall back: only identical sets pass.
  EXPECT_TRUE(SelectItf(scores, 3, kN, ItfOptions{3, 0.0, 0.25}).fallback);
}

// ---- Properties -----------------------------------------------------------------------------

TEST(ItfTest, RetainedTokensIsClampedCeiling) {
  EXPECT_EQ(RetainedTokens(0.25, 4), 1);
  EXPECT_EQ(RetainedTokens(0.25, 5), 2);
  EXPECT_EQ(RetainedTokens(0.1, 30), 3);    // 0.1 * 30 is 3.0000000000000004 in binary
  EXPECT_EQ(RetainedTokens(0.001, 10), 1);  // at least one
  EXPECT_EQ(RetainedTokens(1.0, 7), 7);
  EXPECT_EQ(RetainedTokens(0.5, 0), 0);
}

TEST(ItfTest, JaccardEdges) {
  EXPECT_EQ(Jaccard({}, {}), 1.0);
  EXPECT_EQ(Jaccard({1}, {}), 0.0);
  EXPECT_EQ(Jaccard({1, 2, 3}, {1, 2, 3}), 1.0);
  EXPECT_EQ(Jaccard({1, 2}, {3, 4}), 0.0);
  EXPECT_DOUBLE_EQ(Jaccard({1, 2, 3, 4}, {3, 4, 5}), 2.0 / 5);
}

TEST(ItfTest, MeanPairwiseJaccard) {
  EXPECT_EQ(MeanPairwiseJaccard({}), 1.0);
  EXPECT_EQ(MeanPairwiseJaccard({{1, 2}}), 1.0);
  // pairs: J({0,2},{0,1}) = 1/3, J({0,2},{0,2}) = 1, J({0,1},{0,2}) = 1/3.
  EXPECT_DOUBLE_EQ(MeanPairwiseJaccard({{0, 2}, {0, 1}, {0, 2}}), (1.0 / 3 + 1 + 1.0 / 3) / 3);
}

TEST(ItfTest, TopKTiesPreferLowerIndexAndResultIsSorted) {
  const std::vector<float> scores = {1, 5, 5, 3, 5, 0};
  EXPECT_EQ(TopK(scores, 2), (TokenSet{1, 2}));
  EXPECT_EQ(TopK(scores, 3), (TokenSet{1, 2, 4}));
  EXPECT_EQ(TopK(scores, 4), (TokenSet{1, 2, 3, 4}));
  EXPECT_EQ(TopK(scores, 0), TokenSet{});
  EXPECT_EQ(TopK(scores, 6), (TokenSet{0, 1, 2, 3, 4, 5}));
  const std::vector<float> flat(10, 0.5f);
  EXPECT_EQ(TopK(flat, 3), (TokenSet{0, 1, 2}));
  EXPECT_EQ(TopK(std::vector<float>{}, 0), TokenSet{});
}

TEST(ItfTest, TopKRanksNanBelowEveryNumber) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> scores = {nan, -inf, -1e30f, nan, 2};
  EXPECT_EQ(TopK(scores, 2), (TokenSet{2, 4}));
  EXPECT_EQ(TopK(scores, 3), (TokenSet{0, 2, 4}));  // NaN ties -inf, lower index wins
}

TEST(ItfTest, TopKMatchesAFullSortOnRandomScores) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> coarse(0, 7);  // many ties
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 37;
    std::vector<float> scores(n);
    for (float& s : scores) s = static_cast<float>(coarse(rng));
    const std::int64_t k = trial % (n + 1);
    std::vector<std::int32_t> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return scores[a] > scores[b]; });
    TokenSet expect(order.begin(), order.begin() + k);
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(TopK(scores, k), expect) << "n " << n << " k " << k;
  }
}

// H2O's counted selection is SelectPerHead's sets counted per token, ties, NaN and the k = 0
// and k = n edges included.
TEST(ItfTest, CountTopKPerHeadCountsTheHeadsSets) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> coarse(0, 9);  // many ties
  std::normal_distribution<float> fine(0, 1);
  for (int trial = 0; trial < 300; ++trial) {
    const int heads = 1 + trial % 5;
    const std::int64_t n = 1 + (trial * 13) % 3000;
    std::vector<float> scores(static_cast<std::size_t>(heads * n));
    for (float& s : scores) s = trial % 2 ? static_cast<float>(coarse(rng)) : fine(rng);
    if (trial % 7 == 0) scores[scores.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    const std::int64_t k = trial % 11 == 0 ? n : trial % 13 == 0 ? 0 : 1 + (trial * 7) % n;
    std::vector<std::uint16_t> want(static_cast<std::size_t>(n), 0);
    for (const TokenSet& set : SelectPerHead(scores, heads, n, k)) {
      for (std::int32_t t : set) ++want[static_cast<std::size_t>(t)];
    }
    std::vector<std::uint16_t> got = {7, 7};  // replaced, not added to
    CountTopKPerHead(scores, heads, n, k, &got);
    EXPECT_EQ(got, want) << "heads " << heads << " n " << n << " k " << k;
  }
}

TEST(ItfTest, VotedSetHasExactlyKTokensAndIsSortedUnique) {
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0, 1);
  for (int trial = 0; trial < 100; ++trial) {
    const std::int64_t n = 1 + trial * 7 % 200;
    std::vector<float> base(n);
    for (float& b : base) b = noise(rng);
    std::vector<float> scores;
    for (int h = 0; h < 3; ++h) {
      for (std::int64_t t = 0; t < n; ++t) scores.push_back(base[t] + 0.1f * noise(rng));
    }
    const ItfOptions options{3, 0.6, 0.2};
    const ItfDecision d = SelectItf(scores, 3, n, options);
    EXPECT_EQ(d.k, RetainedTokens(0.2, n));
    ASSERT_EQ(d.probe_sets.size(), 3u);
    for (const TokenSet& s : d.probe_sets) EXPECT_EQ(static_cast<std::int64_t>(s.size()), d.k);
    EXPECT_EQ(d.fallback, d.similarity < d.threshold);
    if (!d.fallback) {
      ASSERT_EQ(static_cast<std::int64_t>(d.voted.size()), d.k);
      EXPECT_TRUE(std::is_sorted(d.voted.begin(), d.voted.end()));
      EXPECT_EQ(std::adjacent_find(d.voted.begin(), d.voted.end()), d.voted.end());
      for (std::int32_t t : d.voted) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, n);
      }
      // Every voted token was selected by some probe head.
      const TokenSet all = Union(d.probe_sets);
      EXPECT_TRUE(std::includes(all.begin(), all.end(), d.voted.begin(), d.voted.end()));
    } else {
      EXPECT_TRUE(d.voted.empty());
    }
  }
}

TEST(ItfTest, VoteBreaksEqualVotesBySummedScoreThenIndex) {
  // n = 4, k = 2 (retention 0.5); three probes each pick two tokens.
  const std::vector<float> scores = {
      9, 8, 0, 0,  // {0, 1}
      9, 0, 8, 0,  // {0, 2}
      9, 0, 0, 8,  // {0, 3}
  };
  // s = 1/3 each pair -> mean 1/3; t = (1/3)^0.6 ~= 0.517 -> fallback at alpha 0.6.
  const ItfDecision strict = SelectItf(scores, 3, 4, ItfOptions{3, 0.6, 0.5});
  EXPECT_TRUE(strict.fallback);
  // alpha = 1 -> t = j = 1/3: passes. Token 0 has 3 votes; 1, 2, 3 one each with equal sums
  // (8), so the lowest index wins.
  const ItfDecision d = SelectItf(scores, 3, 4, ItfOptions{3, 1.0, 0.5});
  EXPECT_FALSE(d.fallback);
  EXPECT_EQ(d.voted, (TokenSet{0, 1}));
  // Raise token 3's score in another head: it now wins the tie on summed score.
  std::vector<float> tilted = scores;
  tilted[0 * 4 + 3] = 1;
  const ItfDecision t = SelectItf(tilted, 3, 4, ItfOptions{3, 1.0, 0.5});
  EXPECT_EQ(t.voted, (TokenSet{0, 3}));
}

TEST(ItfTest, DegenerateSizes) {
  // n = 1: k = 1, every probe picks token 0, threshold 1, pass.
  const ItfDecision one = SelectItf(std::vector<float>{0.5f, 0.1f, 0.9f}, 3, 1, ItfOptions{});
  EXPECT_FALSE(one.fallback);
  EXPECT_EQ(one.voted, (TokenSet{0}));
  // A single probe head has nothing to compare with: similarity 1, pass with its own set.
  const ItfDecision single =
      SelectItf(std::vector<float>{1, 3, 2, 0}, 1, 4, ItfOptions{1, 0.6, 0.5});
  EXPECT_FALSE(single.fallback);
  EXPECT_EQ(single.voted, (TokenSet{1, 2}));
  // Empty inputs.
  EXPECT_TRUE(SelectPerHead(std::vector<float>{}, 0, 5, 1).empty());
  EXPECT_EQ(SelectPerHead(std::vector<float>{}, 2, 0, 0), (std::vector<TokenSet>{{}, {}}));
  EXPECT_EQ(Union({}), TokenSet{});
  EXPECT_EQ(RandomJaccard(0, 0), 1.0);  // two empty sets are identical
}

TEST(ItfTest, SelectPerHeadAndUnion) {
  const std::vector<float> scores = {
      1, 4, 3, 2,  // {1, 2}
      4, 3, 2, 1,  // {0, 1}
  };
  const std::vector<TokenSet> sets = SelectPerHead(scores, 2, 4, 2);
  EXPECT_EQ(sets, (std::vector<TokenSet>{{1, 2}, {0, 1}}));
  EXPECT_EQ(Union(sets), (TokenSet{0, 1, 2}));
  EXPECT_EQ(Union({{5, 9}, {}, {1, 9}, {2}}), (TokenSet{1, 2, 5, 9}));
}

}  // namespace
}  // namespace kvtier
