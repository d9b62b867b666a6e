// Layer-aware speculative prefetch bookkeeping (SPEC §IV-C).
#include "core/prefetch.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

ChunkId K(std::uint32_t layer, std::uint32_t index) {
  return ChunkId::Make(1, KvKind::kKey, layer, index);
}

TEST(PredictNextLayerTest, SharedSetWhenItfPassedElseUnionOfHeads) {
  EXPECT_EQ(PredictNextLayer({3, 7}, {{1}, {2}}), (TokenSet{3, 7}));
  EXPECT_EQ(PredictNextLayer({}, {{1, 4}, {2, 4}, {9}}), (TokenSet{1, 2, 4, 9}));
  EXPECT_EQ(PredictNextLayer({}, {}), TokenSet{});
}

TEST(PrefetchLedgerTest, SettleCountsUsedAndWasted) {
  PrefetchLedger ledger;
  ledger.Prefetched(2, K(2, 0));
  ledger.Prefetched(2, K(2, 1));
  ledger.Prefetched(2, K(2, 2));
  ledger.Prefetched(2, K(2, 2));  // twice counts once
  ledger.Prefetched(3, K(3, 0));
  EXPECT_TRUE(ledger.WasPrefetched(2, K(2, 1)));
  EXPECT_FALSE(ledger.WasPrefetched(3, K(2, 1)));
  EXPECT_FALSE(ledger.WasPrefetched(9, K(2, 1)));
  EXPECT_FALSE(ledger.WasPrefetched(-1, K(2, 1)));

  // Layer 2 used chunks 0 and 2 (2 listed twice) and missed chunk 5.
  const PrefetchLedger::Settlement s = ledger.Settle(2, {K(2, 0), K(2, 2), K(2, 2), K(2, 5)});
  EXPECT_EQ(s.prefetched, 3);
  EXPECT_EQ(s.used, 2);                            // 1 wasted
  EXPECT_FALSE(ledger.WasPrefetched(2, K(2, 0)));  // the layer is forgotten
  EXPECT_TRUE(ledger.WasPrefetched(3, K(3, 0)));   // other layers are not
  EXPECT_EQ(ledger.total_prefetched(), 3);
  EXPECT_EQ(ledger.total_used(), 2);

  // Settling again finds nothing; layer 3 wasted everything.
  EXPECT_EQ(ledger.Settle(2, {K(2, 0)}).prefetched, 0);
  const PrefetchLedger::Settlement s3 = ledger.Settle(3, {});
  EXPECT_EQ(s3.prefetched, 1);
  EXPECT_EQ(s3.used, 0);
  EXPECT_EQ(ledger.total_prefetched(), 4);
  EXPECT_EQ(ledger.total_used(), 2);
  // A layer never seen settles to zero.
  EXPECT_EQ(ledger.Settle(40, {K(40, 0)}).used, 0);
}

TEST(PrefetchLedgerTest, ClearResetsEverything) {
  PrefetchLedger ledger;
  ledger.Prefetched(0, K(0, 0));
  ledger.Settle(0, {K(0, 0)});
  ledger.Prefetched(1, K(1, 0));
  ledger.Clear();
  EXPECT_FALSE(ledger.WasPrefetched(1, K(1, 0)));
  EXPECT_EQ(ledger.total_prefetched(), 0);
  EXPECT_EQ(ledger.total_used(), 0);
  EXPECT_EQ(ledger.Settle(1, {K(1, 0)}).prefetched, 0);
}

// The mechanism end to end on token sets: prefetch layer l's selection for l+1, settle with
// l+1's own selection. Observation III says adjacent layers overlap, so most is used.
TEST(PrefetchLedgerTest, SpeculationFromAdjacentLayerSelections) {
  const std::vector<TokenSet> layer_sets = {{0, 1, 5}, {0, 1, 6}, {0, 1, 6}, {2, 3, 4}};
  PrefetchLedger ledger;
  for (std::size_t l = 0; l + 1 < layer_sets.size(); ++l) {
    const int next = static_cast<int>(l + 1);
    for (std::int32_t t : PredictNextLayer(layer_sets[l], {})) {
      ledger.Prefetched(next, K(next, t));
    }
    std::vector<ChunkId> needed;
    for (std::int32_t t : layer_sets[l + 1]) needed.push_back(K(next, t));
    ledger.Settle(next, needed);
  }
  EXPECT_EQ(ledger.total_prefetched(), 9);
  EXPECT_EQ(ledger.total_used(), 2 + 3 + 0);
}

}  // namespace
}  // namespace kvtier
