#include "core/radix_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace kvtier {
namespace {

std::vector<std::uint64_t> Seq(std::initializer_list<std::uint64_t> s) { return s; }

TEST(RadixTreeTest, LongestPrefixMatchAndSplit) {
  RadixTree tree(1, 64);
  auto a = Seq({1, 2, 3, 4});
  EXPECT_EQ(tree.Lookup(a).matched_symbols, 0);
  EXPECT_NE(tree.Insert(a, tree.Lookup(a)), 0u);

  Match m = tree.Lookup(Seq({1, 2, 3, 4, 5}));
  EXPECT_EQ(m.matched_symbols, 4);
  ASSERT_EQ(m.pieces.size(), 1u);

  // A request sharing two symbols splits the node; both halves keep the first segment.
  auto b = Seq({1, 2, 9});
  Match mb = tree.Lookup(b);
  EXPECT_EQ(mb.matched_symbols, 2);
  const std::uint32_t seg_b = tree.Insert(b, mb);
  EXPECT_NE(seg_b, 0u);
  tree.CheckInvariants();

  Match again = tree.Lookup(a);
  EXPECT_EQ(again.matched_symbols, 4);
  ASSERT_EQ(again.pieces.size(), 2u);
  EXPECT_EQ(again.pieces[0].segment, again.pieces[1].segment);
  EXPECT_EQ(again.pieces[0].segment_begin, 0);
  EXPECT_EQ(again.pieces[1].segment_begin, 2);
  EXPECT_EQ(again.pieces[1].prefix_begin, 2);

  Match mb2 = tree.Lookup(Seq({1, 2, 9, 7}));
  EXPECT_EQ(mb2.matched_symbols, 3);
  EXPECT_EQ(mb2.pieces.back().segment, seg_b);
  EXPECT_EQ(tree.Insert(b, tree.Lookup(b)), 0u) << "nothing new to store";
}

TEST(RadixTreeTest, BlockSymbolsCountTokens) {
  RadixTree tree(512, 64);  // Mooncake: one symbol = one 512-token block
  auto a = Seq({11, 12, 13});
  tree.Insert(a, tree.Lookup(a));
  Match m = tree.Lookup(Seq({11, 12, 99}));
  EXPECT_EQ(m.matched_symbols, 2);
  EXPECT_EQ(m.reused_tokens, 1024);
  const Segment* seg = tree.FindSegment(m.pieces[0].segment);
  EXPECT_EQ(seg->tokens, 1536);
  EXPECT_EQ(seg->num_chunks, 24u);
}

// SPEC Fig. 12/13: node [t0,t1,t2,t3], t0 and t3 important, chunks of 2 tokens. Reordering
// stores [t0,t3,t1,t2]; the mapping list is [0,2,3,1]; the important keys then sit in one
// chunk instead of two.
TEST(RadixTreeTest, PaperReorderExampleMappingList) {
  RadixTree tree(1, 2);
  auto s0 = Seq({100, 101, 102, 103});
  std::uint32_t seg = tree.Insert(s0, tree.Lookup(s0));
  const Segment* before = tree.FindSegment(seg);
  std::set<std::uint32_t> chunks_before = {before->ChunkOf(0, 2), before->ChunkOf(3, 2)};
  EXPECT_EQ(chunks_before.size(), 2u);

  const std::vector<float> importance = {1, 0, 0, 1};
  std::uint32_t repacked = tree.Repack(seg, importance);
  EXPECT_NE(repacked, seg);
  EXPECT_EQ(tree.FindSegment(seg), nullptr);
  Match m = tree.Lookup(s0);
  ASSERT_EQ(m.pieces.size(), 1u);
  EXPECT_EQ(m.pieces[0].segment, repacked);
  EXPECT_EQ(tree.MappingList(m.pieces[0].node), (std::vector<std::uint32_t>{0, 2, 3, 1}));
  const Segment* after = tree.FindSegment(repacked);
  std::set<std::uint32_t> chunks_after = {after->ChunkOf(0, 2), after->ChunkOf(3, 2)};
  EXPECT_EQ(chunks_after.size(), 1u);
  EXPECT_EQ(after->RowOf(0, 2), 0);
  EXPECT_EQ(after->RowOf(3, 2), 1);
  tree.CheckInvariants();
}

// Fig. 13's two prefixes: reordering stays inside each node, so t4 (important, in another
// node) is never packed with node 0's tokens.
TEST(RadixTreeTest, ReorderingNeverCrossesNodes) {
  RadixTree tree(1, 2);
  auto p0 = Seq({0, 1, 2, 3, 4, 5, 6, 7});
  auto p1 = Seq({0, 1, 2, 3, 8, 9, 10, 11});
  std::uint32_t seg = tree.Insert(p0, tree.Lookup(p0));
  tree.Insert(p1, tree.Lookup(p1));
  auto ranges = tree.NodeRanges(seg);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], std::make_pair(std::int64_t{0}, std::int64_t{4}));
  std::vector<float> importance = {1, 0, 0, 1, 1, 0, 0, 0};
  std::uint32_t repacked = tree.Repack(seg, importance);
  const Segment* s = tree.FindSegment(repacked);
  ASSERT_EQ(s->packs.size(), 2u);
  EXPECT_EQ(s->ChunkOf(0, 2), s->ChunkOf(3, 2));
  EXPECT_NE(s->ChunkOf(4, 2), s->ChunkOf(0, 2));
  EXPECT_GE(s->ChunkOf(4, 2), 2u) << "node 1's tokens start a chunk of their own";
  Match m = tree.Lookup(p0);
  ASSERT_EQ(m.pieces.size(), 2u);
  EXPECT_EQ(tree.MappingList(m.pieces[0].node), (std::vector<std::uint32_t>{0, 2, 3, 1}));
  EXPECT_EQ(tree.MappingList(m.pieces[1].node), (std::vector<std::uint32_t>{0, 1, 2, 3}));
}

// Splitting a reordered node must not move any token's data: every token keeps its chunk and
// row, and lookups through the split halves find the same places.
TEST(RadixTreeTest, SplittingAReorderedNodeStaysCorrect) {
  RadixTree tree(1, 2);
  auto s0 = Seq({50, 51, 52, 53, 54, 55});
  std::uint32_t seg = tree.Insert(s0, tree.Lookup(s0));
  seg = tree.Repack(seg, std::vector<float>{0.1f, 0.9f, 0.2f, 0.8f, 0.0f, 0.5f});
  const Segment* s = tree.FindSegment(seg);
  std::vector<std::pair<std::uint32_t, std::uint16_t>> where;
  for (int t = 0; t < 6; ++t) where.emplace_back(s->ChunkOf(t, 2), s->RowOf(t, 2));

  auto other = Seq({50, 51, 52, 77});
  tree.Insert(other, tree.Lookup(other));  // splits the reordered node after 3 tokens
  tree.CheckInvariants();
  Match m = tree.Lookup(s0);
  EXPECT_EQ(m.matched_symbols, 6);
  ASSERT_EQ(m.pieces.size(), 2u);
  for (const MatchPiece& piece : m.pieces) {
    const Segment* ps = tree.FindSegment(piece.segment);
    for (std::int64_t t = piece.prefix_begin; t < piece.prefix_end; ++t) {
      std::int64_t off = piece.segment_begin + (t - piece.prefix_begin);
      EXPECT_EQ(ps->ChunkOf(off, 2), where[std::size_t(t)].first) << "token " << t;
      EXPECT_EQ(ps->RowOf(off, 2), where[std::size_t(t)].second) << "token " << t;
    }
  }
  // Stored slots stay a bijection: no two tokens share (chunk, row).
  std::set<std::pair<std::uint32_t, std::uint16_t>> unique(where.begin(), where.end());
  EXPECT_EQ(unique.size(), where.size());
  // A later repack uses the split node ranges as packs.
  std::uint32_t again = tree.Repack(seg, std::vector<float>(6, 0.0f));
  EXPECT_EQ(tree.FindSegment(again)->packs.size(), 2u);
}

// The reorderer evaluates a repack before making it with PackByImportance over RepackRanges:
// that is exactly the layout Repack then gives (packs per node range, plus an unreferenced gap
// as a pack of its own).
TEST(RadixTreeTest, PackByImportanceIsTheLayoutRepackMakes) {
  RadixTree tree(1, 2);
  auto s0 = Seq({50, 51, 52, 53, 54, 55, 56});
  const std::uint32_t seg = tree.Insert(s0, tree.Lookup(s0));
  auto other = Seq({50, 51, 52, 77});
  tree.Insert(other, tree.Lookup(other));  // two node ranges: [0, 3) and [3, 7)
  const std::vector<float> importance = {0.1f, 0.9f, 0.2f, 0.8f, 0.0f, 0.5f, 0.7f};
  const auto ranges = tree.RepackRanges(seg);
  EXPECT_EQ(ranges, (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 3}, {3, 7}}));
  Segment predicted;
  predicted.tokens = 7;
  PackByImportance(ranges, importance, 2, &predicted);
  const Segment& made = *tree.FindSegment(tree.Repack(seg, importance));
  EXPECT_EQ(predicted.stored, made.stored);
  EXPECT_EQ(predicted.num_chunks, made.num_chunks);
  ASSERT_EQ(predicted.packs.size(), made.packs.size());
  for (std::size_t i = 0; i < made.packs.size(); ++i) {
    EXPECT_EQ(predicted.packs[i].begin, made.packs[i].begin);
    EXPECT_EQ(predicted.packs[i].end, made.packs[i].end);
    EXPECT_EQ(predicted.packs[i].first_chunk, made.packs[i].first_chunk);
  }
  // Pack [0, 3): 1, 2, 0 -> chunks 0, 0, 1; pack [3, 7) from chunk 2: 3, 6, 5, 4.
  EXPECT_EQ(made.stored, (std::vector<std::uint32_t>{2, 0, 1, 3, 6, 5, 4}));
  EXPECT_EQ(made.num_chunks, 4u);
}

// Packing orders tokens by descending importance, ties by offset, as a stable sort of the
// offsets by importance does: on random values with many ties (a few distinct levels), zeros
// of both signs, negative and denormal values, over several packs.
TEST(RadixTreeTest, PackByImportanceOrdersAsAStableSortWithTiesZerosAndNegatives) {
  std::mt19937 rng(7);
  const std::vector<float> levels = {0.0f, -0.0f, 1.5f, -2.25f, 1e-40f, -1e-40f, 3.0f, 1.5f};
  for (int trial = 0; trial < 50; ++trial) {
    const std::int64_t tokens = 1 + std::int64_t(rng() % 300);
    std::vector<float> importance(static_cast<std::size_t>(tokens));
    for (float& v : importance) {
      v = rng() % 3 == 0 ? levels[rng() % levels.size()] : float(rng() % 1000) / 64.0f - 4.0f;
    }
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (std::int64_t b = 0; b < tokens;) {
      const std::int64_t e = std::min(tokens, b + 1 + std::int64_t(rng() % 120));
      ranges.emplace_back(b, e);
      b = e;
    }
    Segment seg;
    seg.tokens = tokens;
    PackByImportance(ranges, importance, 16, &seg);
    std::vector<std::uint32_t> expected(static_cast<std::size_t>(tokens));
    for (const auto& [b, e] : ranges) {
      std::vector<std::int64_t> order(static_cast<std::size_t>(e - b));
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = b + std::int64_t(i);
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
        return importance[std::size_t(x)] > importance[std::size_t(y)];
      });
      for (std::size_t i = 0; i < order.size(); ++i) {
        expected[std::size_t(order[i])] = std::uint32_t(b) + std::uint32_t(i);
      }
    }
    ASSERT_EQ(seg.stored, expected) << "trial " << trial;
  }
}

}  // namespace
}  // namespace kvtier
