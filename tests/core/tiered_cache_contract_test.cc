// Contract tests every cache policy must pass: random call sequences (fixed seeds) against
// TieredCache, checking the rules of core/tiered_cache.h after every call.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/cache_policy.h"
#include "core/tiered_cache.h"

namespace kvtier {
namespace {

constexpr Bytes kKiB = 1024;
constexpr Bytes kGpuCapacity = 16 * kKiB;
constexpr Bytes kCpuCapacity = 40 * kKiB;

struct Chunk {
  ChunkId id;
  Bytes bytes;
};

// 40 chunks of 1..8 KiB, one larger than the GPU (24 KiB) and one larger than both (64 KiB).
std::vector<Chunk> MakeChunks() {
  const Bytes sizes[] = {1 * kKiB, 2 * kKiB, 3 * kKiB, 5 * kKiB, 8 * kKiB};
  std::vector<Chunk> chunks;
  for (std::uint32_t i = 0; i < 40; ++i) {
    chunks.push_back({ChunkId::Make(i, KvKind::kKey, i % 3, i), sizes[i % 5]});
  }
  chunks.push_back({ChunkId::Make(100, KvKind::kValue, 0, 0), 24 * kKiB});
  chunks.push_back({ChunkId::Make(101, KvKind::kValue, 0, 0), 64 * kKiB});
  return chunks;
}

double PriorityOf(const TieredCache& cache, ChunkId chunk) {
  return cache.policy().Priority(cache.Stats(chunk).value_or(ChunkStats{}));
}

// The victim order of core/tiered_cache.h: a chunk that leaves a tier for a lower one (not the
// call's own chunk) is, when it leaves, the tier's minimum by (priority, last access, chunk id)
// -- whatever structure the cache keeps its tiers in. Snapshot the residents' keys before a
// call, then replay its moves.
using Key = std::tuple<double, std::uint64_t, std::uint64_t>;
Key KeyOf(const TieredCache& cache, ChunkId id) {
  const ChunkStats st = cache.Stats(id).value_or(ChunkStats{});
  return {cache.policy().Priority(st), st.last_access, id.value};
}
struct Residents {
  std::map<std::uint64_t, Key> key;  // every resident chunk's key before the call
  std::set<Key> gpu, cpu;
};
template <typename Ids>
Residents Snapshot(const TieredCache& cache, const Ids& ids) {
  Residents r;
  for (ChunkId id : ids) {
    const Tier t = cache.Where(id);
    if (t == Tier::kSsd) continue;
    const Key k = KeyOf(cache, id);
    r.key[id.value] = k;
    (t == Tier::kGpu ? r.gpu : r.cpu).insert(k);
  }
  return r;
}
void ExpectVictimsInKeyOrder(Residents r, ChunkId own, const std::vector<CacheMove>& moves) {
  if (auto it = r.key.find(own.value); it != r.key.end()) {  // taken out first (a swap)
    r.gpu.erase(it->second);
    r.cpu.erase(it->second);
  }
  for (const CacheMove& m : moves) {
    if (m.chunk == own) continue;  // its own move comes last
    ASSERT_NE(m.from, Tier::kSsd) << "a victim that was not resident";
    std::set<Key>& from = m.from == Tier::kGpu ? r.gpu : r.cpu;
    ASSERT_FALSE(from.empty());
    const Key k = r.key.at(m.chunk.value);
    EXPECT_EQ(k, *from.begin()) << "a victim that was not its tier's minimum";
    from.erase(k);
    if (m.to == Tier::kCpu) r.cpu.insert(k);
    if (m.to == Tier::kGpu) r.gpu.insert(k);
  }
}

class TieredCacheContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs `steps` random calls with `seed`, asserting the contract after each; appends every
  // move in order to *log, so two runs can be compared.
  void RunRandom(std::uint32_t seed, int steps, std::vector<CacheMove>* log) {
    TieredCache cache(NewCachePolicy(GetParam(), "test"),
                      TieredCacheOptions{kGpuCapacity, kCpuCapacity, 0.8});
    const std::vector<Chunk> chunks = MakeChunks();
    std::map<std::uint64_t, Tier> shadow;  // where the moves say each chunk is
    std::mt19937 rng(seed);
    // Skewed popularity, so the policies have something to rank.
    std::vector<double> weights;
    for (std::size_t i = 0; i < chunks.size(); ++i) weights.push_back(1.0 / (1 + i % 13));
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    std::uniform_real_distribution<double> ratio(0, 1);
    std::uniform_int_distribution<int> op(0, 99);

    std::vector<ChunkId> ids;
    for (const Chunk& k : chunks) ids.push_back(k.id);
    std::vector<CacheMove> moves;
    for (int step = 0; step < steps; ++step) {
      const Chunk& c = chunks[pick(rng)];
      const int kind = op(rng);
      const Tier before = cache.Where(c.id);
      const Residents residents = Snapshot(cache, ids);
      const Bytes gpu_used_before = cache.used(Tier::kGpu);
      const Bytes cpu_used_before = cache.used(Tier::kCpu);
      moves.clear();
      SCOPED_TRACE("seed " + std::to_string(seed) + " step " + std::to_string(step));

      if (kind < 85) {  // Access
        cache.Access(c.id, c.bytes, ratio(rng), &moves);
        const Tier after = cache.Where(c.id);
        const double p = PriorityOf(cache, c.id);
        if (before == Tier::kGpu) {
          EXPECT_TRUE(moves.empty()) << "a GPU hit moves nothing";
        }
        if (before == Tier::kCpu) {
          EXPECT_NE(after, Tier::kSsd) << "a CPU hit never leaves the caches";
        }
        if (before != Tier::kGpu && c.bytes <= kGpuCapacity &&
            gpu_used_before + c.bytes <= kGpuCapacity) {
          EXPECT_EQ(after, Tier::kGpu) << "free GPU room admits the accessed chunk";
        }
        if (before == Tier::kSsd && after == Tier::kSsd && c.bytes <= kCpuCapacity &&
            cpu_used_before + c.bytes <= kCpuCapacity) {
          ADD_FAILURE() << "free CPU room admits a chunk read from the SSD";
        }
        if (GetParam() == "lru" && c.bytes <= kGpuCapacity) {
          EXPECT_EQ(after, Tier::kGpu) << "lru: the newest access always wins the GPU";
        }
        if (after == before) {
          EXPECT_TRUE(moves.empty()) << "no eviction when the accessed chunk was not admitted";
        } else {
          ASSERT_FALSE(moves.empty());
          EXPECT_EQ(moves.back(), (CacheMove{c.id, before, after, c.bytes}))
              << "the accessed chunk's move comes last";
        }
        for (const CacheMove& m : moves) {
          if (m.chunk == c.id) continue;
          EXPECT_LT(m.from, m.to) << "victims only move down";
          EXPECT_LT(PriorityOf(cache, m.chunk), p) << "a victim never ties the newcomer";
        }
      } else if (kind < 93) {  // Insert
        const Tier tier = (op(rng) % 2 == 0) ? Tier::kGpu : Tier::kCpu;
        const bool placed = cache.Insert(c.id, c.bytes, tier, &moves);
        if (placed) {
          EXPECT_EQ(cache.Where(c.id), tier);
        } else {
          EXPECT_EQ(cache.Where(c.id), before) << "a failed Insert changes nothing";
          EXPECT_TRUE(moves.empty()) << "a failed Insert evicts nothing";
        }
        if (c.bytes > cache.capacity(tier)) {
          EXPECT_FALSE(placed);
        }
        if (before == tier) {
          EXPECT_TRUE(moves.empty());
        }
      } else {  // Erase
        cache.Erase(c.id, &moves);
        EXPECT_EQ(cache.Where(c.id), Tier::kSsd);
        EXPECT_FALSE(cache.Stats(c.id).has_value());
        if (before == Tier::kSsd) {
          EXPECT_TRUE(moves.empty());
        } else {
          EXPECT_EQ(moves, (std::vector<CacheMove>{{c.id, before, Tier::kSsd, c.bytes}}));
        }
      }

      ExpectVictimsInKeyOrder(residents, c.id, moves);
      // Every move starts where the previous moves left the chunk, and carries its size.
      for (const CacheMove& m : moves) {
        Tier& where = shadow.try_emplace(m.chunk.value, Tier::kSsd).first->second;
        EXPECT_EQ(m.from, where) << "move from a tier the chunk was not in";
        EXPECT_NE(m.from, m.to);
        where = m.to;
        for (const Chunk& k : chunks) {
          if (k.id == m.chunk) {
            EXPECT_EQ(m.bytes, k.bytes);
          }
        }
      }
      // After the call: the moves agree with Where(), tiers are exclusive and within capacity.
      Bytes gpu = 0, cpu = 0;
      std::size_t gpu_n = 0, cpu_n = 0;
      for (const Chunk& k : chunks) {
        auto it = shadow.find(k.id.value);
        const Tier expect = it == shadow.end() ? Tier::kSsd : it->second;
        ASSERT_EQ(cache.Where(k.id), expect) << "moves disagree with Where()";
        if (expect == Tier::kGpu) gpu += k.bytes, ++gpu_n;
        if (expect == Tier::kCpu) cpu += k.bytes, ++cpu_n;
        if (k.bytes > kGpuCapacity) {
          EXPECT_NE(expect, Tier::kGpu);
        }
        if (k.bytes > kCpuCapacity) {
          EXPECT_EQ(expect, Tier::kSsd);
        }
      }
      EXPECT_EQ(cache.used(Tier::kGpu), gpu);
      EXPECT_EQ(cache.used(Tier::kCpu), cpu);
      EXPECT_EQ(cache.resident_chunks(Tier::kGpu), gpu_n);
      EXPECT_EQ(cache.resident_chunks(Tier::kCpu), cpu_n);
      EXPECT_LE(gpu, kGpuCapacity);
      EXPECT_LE(cpu, kCpuCapacity);
      cache.CheckInvariants();
      log->insert(log->end(), moves.begin(), moves.end());
      if (HasFatalFailure()) return;
    }
  }
};

TEST_P(TieredCacheContractTest, RandomSequencesKeepTheRules) {
  for (std::uint32_t seed : {1u, 2u, 3u, 42u}) {
    std::vector<CacheMove> log;
    RunRandom(seed, 3000, &log);
    if (HasFailure()) return;  // one seed's failures are enough to read
  }
}

TEST_P(TieredCacheContractTest, SameCallSequenceGivesTheSameMoves) {
  for (std::uint32_t seed : {7u, 8u}) {
    std::vector<CacheMove> first, second;
    RunRandom(seed, 2000, &first);
    RunRandom(seed, 2000, &second);
    EXPECT_FALSE(first.empty());
    EXPECT_EQ(first, second) << "seed " << seed;
  }
}

TEST_P(TieredCacheContractTest, RandomRunsExerciseEveryKindOfMove) {
  // The random runs must exercise the interesting paths, or the checks above prove little.
  std::vector<CacheMove> log;
  RunRandom(5, 3000, &log);
  int promotions = 0, demotions = 0, drops = 0, admissions = 0;
  for (const CacheMove& m : log) {
    if (m.from == Tier::kCpu && m.to == Tier::kGpu) ++promotions;
    if (m.from == Tier::kGpu && m.to == Tier::kCpu) ++demotions;
    if (m.to == Tier::kSsd) ++drops;
    if (m.from == Tier::kSsd) ++admissions;
  }
  EXPECT_GT(promotions, 0);
  EXPECT_GT(demotions, 0);
  EXPECT_GT(drops, 0);
  EXPECT_GT(admissions, 0);
}

TEST_P(TieredCacheContractTest, ErasedChunkIsForgottenAndStartsOver) {
  TieredCache cache(NewCachePolicy(GetParam(), "test"),
                    TieredCacheOptions{kGpuCapacity, kCpuCapacity, 0.8});
  const ChunkId id = ChunkId::Make(3, KvKind::kKey, 1, 2);
  std::vector<CacheMove> moves;
  for (int i = 0; i < 4; ++i) cache.Access(id, kKiB, 0.5, &moves);
  cache.Erase(id, &moves);
  EXPECT_FALSE(cache.Stats(id).has_value());
  EXPECT_EQ(cache.Where(id), Tier::kSsd);
  EXPECT_EQ(cache.used(Tier::kGpu) + cache.used(Tier::kCpu), 0u);
  cache.Access(id, kKiB, 0.5, &moves);
  EXPECT_EQ(cache.Stats(id)->frequency, 1u);
}

// Above 32 resident chunks the cache checks itself only periodically (amortised); a long run
// on a large cache must still satisfy the full check.
TEST_P(TieredCacheContractTest, LargeCacheStaysConsistent) {
  TieredCache cache(NewCachePolicy(GetParam(), "test"),
                    TieredCacheOptions{500 * kKiB, 1500 * kKiB, 0.8});
  std::mt19937 rng(99);
  std::uniform_int_distribution<std::uint32_t> pick(0, 4999);
  std::uniform_int_distribution<int> op(0, 99);
  std::vector<CacheMove> moves;
  std::map<std::uint64_t, ChunkId> resident;  // from the moves
  std::vector<ChunkId> resident_ids;
  for (int step = 0; step < 40000; ++step) {
    const std::uint32_t i = step % 2 ? pick(rng) % 400 : pick(rng);  // half the calls are hot
    const ChunkId id = ChunkId::Make(i, KvKind::kValue, 1, 0);
    const Bytes bytes = (1 + i % 4) * kKiB;
    moves.clear();
    const int kind = op(rng);
    // Every 8th call's victims against the residents' keys (every call's costs seconds).
    Residents before;
    if (step % 8 == 0) {
      resident_ids.clear();
      for (const auto& [value, chunk] : resident) resident_ids.push_back(chunk);
      before = Snapshot(cache, resident_ids);
    }
    if (kind < 90) {
      cache.Access(id, bytes, (i % 5) / 4.0, &moves);
    } else if (kind < 97) {
      cache.Insert(id, bytes, kind % 2 ? Tier::kGpu : Tier::kCpu, &moves);
    } else {
      cache.Erase(id, &moves);
    }
    // Each chunk's last move in the call is where it is now.
    for (std::size_t k = 0; k < moves.size(); ++k) {
      bool last = true;
      for (std::size_t l = k + 1; l < moves.size(); ++l)
        last = last && moves[l].chunk != moves[k].chunk;
      if (last) {
        EXPECT_EQ(cache.Where(moves[k].chunk), moves[k].to);
      }
    }
    if (step % 8 == 0) ExpectVictimsInKeyOrder(before, id, moves);
    for (const CacheMove& m : moves) {
      if (m.to == Tier::kSsd) {
        resident.erase(m.chunk.value);
      } else {
        resident.emplace(m.chunk.value, m.chunk);
      }
    }
    if (step % 1000 == 0) cache.CheckInvariants();
  }
  EXPECT_GT(cache.resident_chunks(Tier::kGpu) + cache.resident_chunks(Tier::kCpu), 32u);
  EXPECT_LE(cache.used(Tier::kGpu), 500 * kKiB);
  EXPECT_LE(cache.used(Tier::kCpu), 1500 * kKiB);
  cache.CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, TieredCacheContractTest,
                         ::testing::ValuesIn(CachePolicyNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace kvtier
