// Layer-aware speculative prefetch's prediction (SPEC §IV-C).
#include "core/prefetch.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(PredictNextLayerTest, SharedSetWhenItfPassedElseUnionOfHeads) {
  EXPECT_EQ(PredictNextLayer({3, 7}, {{1}, {2}}), (TokenSet{3, 7}));
  EXPECT_EQ(PredictNextLayer({}, {{1, 4}, {2, 4}, {9}}), (TokenSet{1, 2, 4, 9}));
  EXPECT_EQ(PredictNextLayer({}, {}), TokenSet{});
}

}  // namespace
}  // namespace kvtier
