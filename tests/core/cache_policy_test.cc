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

}  // namespace
}  // namespace kvtier
