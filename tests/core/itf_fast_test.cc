// TopK and SelectItf (radix select, O(n) voting) against straightforward reference
// implementations of their documented contracts: the previous code, kept here verbatim in
// spirit. Random scores with ties, near ties, NaN, -0, infinities and sinks, many (n, k)
// shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/itf.h"

namespace kvtier {
namespace {

// Contract: the k largest (NaN as -inf, -0 as +0), ties to the lower index, sorted.
TokenSet ReferenceTopK(const std::vector<float>& scores, std::int64_t k) {
  auto key = [](float v) {
    if (std::isnan(v)) return -std::numeric_limits<float>::infinity();
    return v == 0.0f ? 0.0f : v;
  };
  std::vector<std::int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::int32_t a, std::int32_t b) { return key(scores[a]) > key(scores[b]); });
  idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Contract: rank the union by (votes desc, summed non-NaN score desc, index asc), keep k.
TokenSet ReferenceVote(const std::vector<float>& scores, int heads, std::int64_t n,
                       const std::vector<TokenSet>& sets, std::int64_t k) {
  struct C {
    std::int32_t t;
    int votes;
    double score;
  };
  std::vector<C> cands;
  for (std::int32_t t : Union(sets)) {
    C c{t, 0, 0};
    for (int h = 0; h < heads; ++h) {
      const TokenSet& s = sets[static_cast<std::size_t>(h)];
      if (std::binary_search(s.begin(), s.end(), t)) ++c.votes;
      const float v = scores[static_cast<std::size_t>(h) * n + t];
      if (!std::isnan(v)) c.score += v;
    }
    cands.push_back(c);
  }
  std::sort(cands.begin(), cands.end(), [](const C& a, const C& b) {
    if (a.votes != b.votes) return a.votes > b.votes;
    if (a.score != b.score) return a.score > b.score;
    return a.t < b.t;
  });
  TokenSet out;
  for (std::int64_t i = 0; i < k; ++i) out.push_back(cands[static_cast<std::size_t>(i)].t);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<float> RandomScores(std::mt19937& rng, std::size_t count, int flavour) {
  std::vector<float> s(count);
  std::lognormal_distribution<float> logn(0.0f, 1.5f);
  std::uniform_int_distribution<int> small(0, 7);
  for (auto& v : s) {
    switch (flavour) {
      case 0: v = logn(rng); break;                      // the procedural model's shape
      case 1: v = float(small(rng)); break;               // heavy ties
      case 2: v = small(rng) == 0 ? -0.0f : 0.0f; break;  // signed zeros only
      // Near ties: 1 + j ulp. Summed over heads in double they differ where their float
      // roundings agree (3 + 2^-23 rounds to 3), so the vote's coarse float ranking ties them
      // and the exact sums must decide.
      case 4: v = 1.0f + float(small(rng)) * 0x1p-23f; break;
      default: {
        const int r = small(rng);
        v = r == 0   ? std::numeric_limits<float>::quiet_NaN()
            : r == 1 ? std::numeric_limits<float>::infinity()
            : r == 2 ? -std::numeric_limits<float>::infinity()
            : r == 3 ? -logn(rng)
                     : logn(rng);
      }
    }
  }
  return s;
}

TEST(ItfFastTest, TopKMatchesTheReferenceOnTiesNanZerosAndInfinities) {
  std::mt19937 rng(7);
  for (std::int64_t n : {1, 2, 3, 17, 64, 1000, 4913}) {
    for (int flavour = 0; flavour < 4; ++flavour) {
      const std::vector<float> s = RandomScores(rng, std::size_t(n), flavour);
      for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, n / 4, n / 2, n - 1, n}) {
        if (k < 0) continue;
        ASSERT_EQ(TopK(s, k), ReferenceTopK(s, k)) << "n=" << n << " k=" << k << " f=" << flavour;
      }
    }
  }
}

// H2O's counted selection: CountTopKPerHead's count of token t is the number of rows whose
// reference top k holds t (its kept test compares keys and indices in 32-bit lanes, and the
// boundary bucket is collected 8 or 16 tokens a step on the vector paths).
TEST(ItfFastTest, CountTopKPerHeadCountsTheReferenceSets) {
  std::mt19937 rng(11);
  for (std::int64_t n : {1, 7, 9, 64, 1000, 4913}) {
    for (int flavour = 0; flavour < 5; ++flavour) {
      const int heads = 5;
      std::vector<float> all;
      for (int h = 0; h < heads; ++h) {
        const std::vector<float> row = RandomScores(rng, std::size_t(n), flavour);
        all.insert(all.end(), row.begin(), row.end());
      }
      for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, n / 3, n - 1, n}) {
        if (k < 0) continue;
        std::vector<std::uint16_t> want(static_cast<std::size_t>(n), 0), got;
        for (int h = 0; h < heads; ++h) {
          const std::vector<float> row(all.begin() + h * n, all.begin() + (h + 1) * n);
          for (std::int32_t t : ReferenceTopK(row, k)) ++want[static_cast<std::size_t>(t)];
        }
        CountTopKPerHead(all, heads, n, k, &got);
        ASSERT_EQ(got, want) << "n=" << n << " k=" << k << " f=" << flavour;
      }
    }
  }
}

TEST(ItfFastTest, SelectItfVotesLikeTheReference) {
  std::mt19937 rng(11);
  int voted = 0;
  for (std::int64_t n : {1, 5, 64, 999, 4913}) {
    for (int heads : {1, 2, 3, 5}) {
      for (int flavour = 0; flavour < 5; ++flavour) {
        for (double retention : {0.1, 0.25, 0.6, 1.0}) {
          std::vector<float> s = RandomScores(rng, std::size_t(n) * heads, flavour);
          // +inf and -inf of one token would sum to NaN, which the vote does not order (its
          // ranking is undefined there, before and after): keep only +inf.
          for (float& v : s) {
            if (std::isinf(v) && v < 0) v = -1e30f;
          }
          // Correlate the heads so that votes spread over several levels.
          if (flavour == 0) {
            for (int h = 1; h < heads; ++h) {
              for (std::int64_t t = 0; t < n; ++t) {
                if (t % 3 != 0) s[std::size_t(h * n + t)] = s[std::size_t(t)];
              }
            }
          }
          ItfOptions o{heads, /*alpha=*/200.0, retention};  // t ~ 0: passes, tests the vote
          const ItfDecision d = SelectItf(s, heads, n, o);
          ASSERT_EQ(d.probe_sets.size(), std::size_t(heads));
          for (int h = 0; h < heads; ++h) {
            const std::vector<float> row(s.begin() + h * n, s.begin() + (h + 1) * n);
            ASSERT_EQ(d.probe_sets[std::size_t(h)], ReferenceTopK(row, d.k));
          }
          ASSERT_DOUBLE_EQ(d.similarity, MeanPairwiseJaccard(d.probe_sets));
          if (d.fallback) continue;
          ++voted;
          ASSERT_EQ(d.voted, ReferenceVote(s, heads, n, d.probe_sets, d.k))
              << "n=" << n << " heads=" << heads << " f=" << flavour << " r=" << retention;
        }
      }
    }
  }
  EXPECT_GT(voted, 200);  // the vote itself was exercised, not only fallbacks
}

// ItfDecisionOnly (what ScoreSource::Itf runs) is SelectItf / SelectItfAndVote without the
// per-head sets: the same k, similarity (bit for bit), threshold, fallback and voted set, with
// and without a vote on fallbacks, for 1-8 probe heads (masks) and 9 (the sets' path), on ties,
// NaN, zeros and infinities, retention 0 to 1.
TEST(ItfFastTest, DecisionOnlyIsSelectItfWithoutTheSets) {
  std::mt19937 rng(23);
  int cases = 0, passes = 0;
  for (std::int64_t n : {1, 2, 7, 64, 999, 4913}) {
    for (int heads : {1, 2, 3, 4, 8, 9}) {
      for (int flavour = 0; flavour < 5; ++flavour) {
        for (double retention : {0.0, 0.1, 0.25, 0.6, 1.0}) {
          std::vector<float> s = RandomScores(rng, std::size_t(n) * heads, flavour);
          if (flavour == 0) {
            for (int h = 1; h < heads; ++h) {
              for (std::int64_t t = 0; t < n; ++t) {
                if (t % 3 != 0) s[std::size_t(h * n + t)] = s[std::size_t(t)];
              }
            }
          }
          for (double alpha : {1.0, 200.0}) {
            const ItfOptions o{heads, alpha, retention};
            for (bool always_vote : {false, true}) {
              const ItfDecision want =
                  always_vote ? SelectItfAndVote(s, heads, n, o) : SelectItf(s, heads, n, o);
              const ItfDecision got = ItfDecisionOnly(s, heads, n, o, always_vote);
              const std::string at = "n=" + std::to_string(n) + " heads=" +
                                     std::to_string(heads) + " f=" + std::to_string(flavour) +
                                     " r=" + std::to_string(retention);
              ASSERT_EQ(got.k, want.k) << at;
              if (std::isnan(want.similarity)) {
                ASSERT_TRUE(std::isnan(got.similarity)) << at;
              } else {
                ASSERT_EQ(got.similarity, want.similarity) << at;
              }
              ASSERT_EQ(got.threshold, want.threshold) << at;
              ASSERT_EQ(got.fallback, want.fallback) << at;
              ASSERT_EQ(got.voted, want.voted) << at;
              if (heads <= 8) {
                ASSERT_TRUE(got.probe_sets.empty()) << at;
              }
              ++cases;
              passes += !want.fallback;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(passes, 300);
  EXPECT_EQ(cases, 6 * 6 * 5 * 5 * 2 * 2);
}

// CollectCounted (Selection::FromCounts) against the one-token-at-a-time loop: every length
// up to 100 (partial and whole 32-token blocks), longer rows, all zero, none zero, and counts
// up to 65535.
TEST(ItfFastTest, CollectCountedKeepsEveryNonZeroCountInOrder) {
  std::mt19937 rng(31);
  std::vector<std::int64_t> lengths;
  for (std::int64_t n = 0; n <= 100; ++n) lengths.push_back(n);
  for (std::int64_t n : {1000, 4913, 12345}) lengths.push_back(n);
  for (std::int64_t n : lengths) {
    for (int density : {0, 1, 50, 99, 100}) {  // % of tokens with a count
      std::vector<std::uint16_t> of(static_cast<std::size_t>(n));
      std::uniform_int_distribution<int> pct(0, 99), count(1, 65535);
      for (auto& c : of) c = pct(rng) < density ? std::uint16_t(count(rng)) : 0;
      TokenSet want_tokens;
      std::vector<std::uint16_t> want_counts;
      for (std::int64_t t = 0; t < n; ++t) {
        if (of[std::size_t(t)] != 0) {
          want_tokens.push_back(std::int32_t(t));
          want_counts.push_back(of[std::size_t(t)]);
        }
      }
      TokenSet tokens = {7, 8};  // replaced, not appended to
      std::vector<std::uint16_t> counts = {9};
      CollectCounted(of, &tokens, &counts);
      ASSERT_EQ(tokens, want_tokens) << "n=" << n << " density=" << density;
      ASSERT_EQ(counts, want_counts) << "n=" << n << " density=" << density;
    }
  }
}

}  // namespace
}  // namespace kvtier
