// ImportanceModel::AnchorCache (traces/importance_model.h): version 1's anchor rows kept across
// a request's layers give the very same scores, bit for bit, as computing them every call --
// the selection memo, the digests of sim_bench and every golden time rely on it.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "traces/importance_model.h"

namespace kvtier {
namespace {

std::vector<float> ScoresOf(const ImportanceModel& m, const std::vector<std::uint32_t>& keys,
                            std::uint64_t query, int layer, const std::vector<int>& heads,
                            std::int64_t n, ImportanceModel::AnchorCache* cache) {
  std::vector<float> out(heads.size() * std::size_t(n), -1.0f);
  m.Scores(keys, query, layer, heads, n, out.data(), -1, cache);
  return out;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(AnchorCache, ScoresAreBitIdenticalWithAndWithoutTheCacheOverEveryLayer) {
  for (const char* text : {"seed=1", "seed=7 head_corr=0.9,0.3 layer_corr=0.5 query_dependence=0.4",
                           "seed=3 layer_corr=1", "seed=4 layer_corr=0 query_dependence=0"}) {
    SCOPED_TRACE(text);
    const ProceduralParams p = ProceduralParams::Parse(text, "test");
    const int layers = 40, kv_heads = 8;
    const ImportanceModel m(p, layers, kv_heads);
    std::mt19937 rng(11);
    std::vector<std::uint32_t> keys(3001);
    for (auto& k : keys) k = rng();
    const std::uint64_t query = 0x1234567u;
    std::vector<int> heads_all(kv_heads);
    std::iota(heads_all.begin(), heads_all.end(), 0);
    const std::vector<int>& all = heads_all;
    const std::vector<int> probe = {0, 1, 2};
    ImportanceModel::AnchorCache cache;
    // Layers in order and out of order; n growing (the rows are extended) and shrinking.
    for (int layer : {0, 1, 2, 5, 3, 17, 39, 38, 0}) {
      for (std::int64_t n : {std::int64_t(1000), std::int64_t(3001), std::int64_t(7)}) {
        for (const std::vector<int>* heads : {&probe, &all}) {
          ExpectSameBits(ScoresOf(m, keys, query, layer, *heads, n, &cache),
                         ScoresOf(m, keys, query, layer, *heads, n, nullptr));
        }
      }
    }
    EXPECT_GE(cache.bytes(), 2 * 3001 * sizeof(float));  // at least one anchor's two rows
    cache.Clear();
    EXPECT_EQ(cache.bytes(), 0u);
  }
}

}  // namespace
}  // namespace kvtier
