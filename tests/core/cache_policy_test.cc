#include "core/cache_policy.h"

#include <gtest/gtest.h>

#include <string>

#include "core/errors.h"

namespace kvtier {
namespace {

TEST(CachePolicyTest, NamesTableMakesEveryPolicyUnderItsName) {
  const std::vector<std::string> names = CachePolicyNames();
  EXPECT_EQ(names, (std::vector<std::string>{"lru", "lfu", "score"}));
  for (const std::string& name : names) {
    std::unique_ptr<CachePolicy> p = NewCachePolicy(name, "cache.policy");
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->Name(), name);
  }
}

TEST(CachePolicyTest, UnknownNameThrowsConfigErrorNamingKeyAndValidNames) {
  try {
    NewCachePolicy("arc", "cache.gpu_policy");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cache.gpu_policy"), std::string::npos) << what;
    EXPECT_NE(what.find("'arc'"), std::string::npos) << what;
    EXPECT_NE(what.find("lru, lfu, score"), std::string::npos) << what;
  }
  EXPECT_THROW(NewCachePolicy("", "k"), InputError);
  EXPECT_THROW(NewCachePolicy("LRU", "k"), ConfigError);  // names are exact
}

TEST(CachePolicyTest, PrioritiesFollowTheirStatistic) {
  const ChunkStats s{/*frequency=*/6, /*important_ratio=*/0.25, /*last_access=*/42};
  EXPECT_EQ(NewLruPolicy()->Priority(s), 42.0);
  EXPECT_EQ(NewLfuPolicy()->Priority(s), 6.0);
  EXPECT_EQ(NewScorePolicy()->Priority(s), 1.5);
  EXPECT_EQ(NewScorePolicy()->Priority(ChunkStats{}), 0.0);
}

// SPEC §IV-D2: chunk 1 (rate 1.5, ratio 50%) scores 0.75, chunk 2 (rate 1, ratio 100%) scores
// 1, so score prefers chunk 2 while frequency prefers chunk 1.
TEST(CachePolicyTest, PaperScoreExampleRanksChunk2AboveChunk1) {
  const ChunkStats chunk1{15, 0.5, 0};
  const ChunkStats chunk2{10, 1.0, 0};
  auto score = NewScorePolicy();
  auto lfu = NewLfuPolicy();
  EXPECT_DOUBLE_EQ(score->Priority(chunk1) / 10, 0.75);
  EXPECT_DOUBLE_EQ(score->Priority(chunk2) / 10, 1.0);
  EXPECT_LT(score->Priority(chunk1), score->Priority(chunk2));
  EXPECT_GT(lfu->Priority(chunk1), lfu->Priority(chunk2));
}

// A repacked chunk's statistics, by hand: 3 rows from a chunk of frequency 10, ratio 0.5, last
// access 7; 1 row from one of frequency 2, ratio 0.25, last access 9; 4 rows from a chunk never
// accessed. Weights 3/8, 1/8, 4/8: frequency 30/8 + 2/8 = 4, ratio 1.5/8 + 0.25/8 = 0.21875,
// last access 9.
TEST(InheritStatsTest, WeightedByTheRowsEachSourceGave) {
  const ChunkStats a{10, 0.5, 7}, b{2, 0.25, 9};
  const StatsShare shares[] = {{&a, 3}, {&b, 1}, {nullptr, 4}};
  ChunkStats out;
  ASSERT_TRUE(InheritStats(shares, &out));
  EXPECT_EQ(out.frequency, 4u);
  EXPECT_DOUBLE_EQ(out.important_ratio, 0.21875);
  EXPECT_EQ(out.last_access, 9u);
  // LFU and score then rank it as its rows were ranked, pro rata.
  EXPECT_EQ(NewLfuPolicy()->Priority(out), 4.0);
  EXPECT_DOUBLE_EQ(NewScorePolicy()->Priority(out), 4 * 0.21875);
}

TEST(InheritStatsTest, RoundsTheFrequencyAndNeedsASourceWithStatistics) {
  const ChunkStats one{1, 1.0, 3}, two{2, 0.0, 5};
  const StatsShare halves[] = {{&one, 2}, {&two, 2}};  // 1.5 rounds to 2
  ChunkStats out;
  ASSERT_TRUE(InheritStats(halves, &out));
  EXPECT_EQ(out.frequency, 2u);
  EXPECT_DOUBLE_EQ(out.important_ratio, 0.5);
  const StatsShare none[] = {{nullptr, 3}, {&one, 0}};  // a source that gave no row counts not
  out = ChunkStats{7, 0.7, 7};
  EXPECT_FALSE(InheritStats(none, &out));
  EXPECT_EQ(out.frequency, 7u) << "left alone";
}

}  // namespace
}  // namespace kvtier
