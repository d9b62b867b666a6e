// TieredCache::ChunkRef: Access with a ref that Where() filled does exactly what Access without
// one does, including after records were forgotten (stale refs fall back to a lookup).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/tiered_cache.h"

namespace kvtier {
namespace {

TEST(TieredCacheRefTest, AccessWithRefMatchesPlainAccessUnderInsertsEvictionsAndErases) {
  for (const char* policy : {"lru", "lfu", "score"}) {
    TieredCache plain(NewCachePolicy(policy, "test"), TieredCacheOptions{6000, 9000, 0.8});
    TieredCache with_ref(NewCachePolicy(policy, "test"), TieredCacheOptions{6000, 9000, 0.8});
    std::mt19937 rng(3);
    std::uniform_int_distribution<std::uint32_t> pick(0, 59);
    std::uniform_int_distribution<int> what(0, 19);
    std::uniform_real_distribution<double> ratio(0, 1);
    auto id = [](std::uint32_t c) { return ChunkId::Make(1 + c / 20, KvKind::kKey, c % 3, c); };
    auto bytes = [](std::uint32_t c) { return Bytes(500 + 100 * (c % 7)); };
    std::vector<TieredCache::ChunkRef> refs(60);
    int used_refs = 0;
    for (int step = 0; step < 20000; ++step) {
      const std::uint32_t c = pick(rng);
      const int w = what(rng);
      std::vector<CacheMove> a, b;
      if (w == 0) {  // pre-warm style placement: evicting such chunks forgets their records
        const Tier tier = (step & 1) ? Tier::kGpu : Tier::kCpu;
        ASSERT_EQ(plain.Insert(id(c), bytes(c), tier, &a),
                  with_ref.Insert(id(c), bytes(c), tier, &b));
      } else if (w == 1) {
        plain.Erase(id(c), &a);
        with_ref.Erase(id(c), &b);
      } else if (w < 8) {  // plan: remember the lookup
        ASSERT_EQ(plain.Where(id(c)), with_ref.Where(id(c), &refs[c]));
      } else {
        const double r = ratio(rng);
        ++used_refs;
        ASSERT_EQ(plain.Access(id(c), bytes(c), r, &a),
                  with_ref.Access(id(c), bytes(c), r, &b, refs[c]))
            << policy << " step " << step;
      }
      ASSERT_EQ(a, b) << policy << " step " << step;
      ASSERT_EQ(plain.used(Tier::kGpu), with_ref.used(Tier::kGpu));
      ASSERT_EQ(plain.used(Tier::kCpu), with_ref.used(Tier::kCpu));
    }
    EXPECT_GT(used_refs, 1000);
    with_ref.CheckInvariants();
  }
}

// The records are indexed by (segment, layer, kind, index) directly for the dense segment ids
// RadixTree hands out, and through a hash map for ids beyond the dense range. The same calls
// with ids spread over the whole ChunkId space (huge segments, layers up to 1020, sparse
// indices; order-preserving, because the heaps break ties by id) make the same moves.
TEST(TieredCacheRefTest, SparseAndDenseChunkIdsBehaveAlike) {
  for (const char* policy : {"lru", "score"}) {
    TieredCache dense(NewCachePolicy(policy, "test"), TieredCacheOptions{6000, 9000, 0.8});
    TieredCache sparse(NewCachePolicy(policy, "test"), TieredCacheOptions{6000, 9000, 0.8});
    auto small = [](std::uint32_t c) { return ChunkId::Make(1 + c / 20, KvKind(c % 3), c % 5, c); };
    auto huge = [](std::uint32_t c) {
      return ChunkId::Make(0xF0000000u + c / 20, KvKind(c % 3), (c % 5) * 255, c * 1000);
    };
    auto back = [&](ChunkId h) {
      for (std::uint32_t c = 0; c < 60; ++c) {
        if (huge(c) == h) return small(c);
      }
      return ChunkId{};
    };
    std::mt19937 rng(5);
    std::uniform_int_distribution<std::uint32_t> pick(0, 59);
    std::uniform_int_distribution<int> what(0, 9);
    for (int step = 0; step < 5000; ++step) {
      const std::uint32_t c = pick(rng);
      const Bytes bytes = Bytes(500 + 100 * (c % 7));
      std::vector<CacheMove> a, b;
      const int w = what(rng);
      if (w == 0) {
        ASSERT_EQ(dense.Insert(small(c), bytes, Tier::kCpu, &a),
                  sparse.Insert(huge(c), bytes, Tier::kCpu, &b));
      } else if (w == 1) {
        dense.Erase(small(c), &a);
        sparse.Erase(huge(c), &b);
      } else {
        ASSERT_EQ(dense.Access(small(c), bytes, 0.5, &a), sparse.Access(huge(c), bytes, 0.5, &b));
      }
      for (CacheMove& m : b) m.chunk = back(m.chunk);
      ASSERT_EQ(a, b) << policy << " step " << step;
      ASSERT_EQ(dense.Where(small(c)), sparse.Where(huge(c)));
      ASSERT_EQ(dense.Stats(small(c)).has_value(), sparse.Stats(huge(c)).has_value());
    }
    dense.CheckInvariants();
    sparse.CheckInvariants();
  }
}

}  // namespace
}  // namespace kvtier
