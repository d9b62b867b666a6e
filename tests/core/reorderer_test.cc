#include "core/reorderer.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/radix_tree.h"

namespace kvtier {
namespace {

// 16 tokens in chunks of 4 (one node unless a test splits it).
std::vector<std::uint64_t> Symbols(std::int64_t n, std::uint64_t first = 500) {
  std::vector<std::uint64_t> s(static_cast<std::size_t>(n));
  std::iota(s.begin(), s.end(), first);
  return s;
}
std::uint32_t Store(RadixTree* tree) {
  const std::vector<std::uint64_t> s = Symbols(16);
  return tree->Insert(s, tree->Lookup(s));
}

ReordererOptions Options(int min_accesses = 1, double min_gain = 0, Bytes saved_chunk_bytes = 100) {
  ReordererOptions o;
  o.history_weight = 0.8;
  o.min_accesses = min_accesses;
  o.chunk_tokens = 4;
  o.min_gain = min_gain;
  o.saved_chunk_bytes = saved_chunk_bytes;
  return o;
}

// One reuse of the whole 16-token segment: its evidence (from the history before it), then its
// history, x = the share of layers that kept each token.
void Reuse(Reorderer* r, const RadixTree& tree, std::uint32_t seg,
           const std::vector<TokenSet>& layers) {
  const Reorderer::Piece piece{0, 16, 0};
  r->RecordEvidence(tree, seg, std::span<const Reorderer::Piece>(&piece, 1), layers);
  std::vector<float> x(16, 0.0f);
  for (const TokenSet& set : layers) {
    for (std::int32_t t : set) x[std::size_t(t)] += 1.0f / float(layers.size());
  }
  r->Record(seg, 16, 0, x);
}

auto Cost(double bytes) {
  return [bytes](std::uint32_t) { return bytes; };
}

// The evidence is `trace stats`' history packing, by hand: the first reuse keeps {0, 5, 10, 15}
// in both layers (no history before it: nothing measured). The second keeps {0, 5, 10, 15} in
// layer 0 and {0, 5, 10, 14} in layer 1. Stored order: 4 + 4 chunks. Packed by the history
// (0, 5, 10, 15 first; the rest by offset, so 14 lands at position 15, chunk 3): 1 + 2 chunks.
TEST(ReordererTest, EvidenceIsTheHistoryPackingSavingOfTheReuses) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options());
  Reuse(&r, tree, seg, {{0, 5, 10, 15}, {0, 5, 10, 15}});
  EXPECT_EQ(r.EvidenceOf(seg).reuses, 0) << "no history before the first reuse";
  Reuse(&r, tree, seg, {{0, 5, 10, 15}, {0, 5, 10, 14}});
  const Reorderer::Evidence e = r.EvidenceOf(seg);
  EXPECT_EQ(e.accesses, 2);
  EXPECT_EQ(e.reuses, 1);
  EXPECT_EQ(e.stored_chunks, 8);
  EXPECT_EQ(e.packed_chunks, 3);
  EXPECT_DOUBLE_EQ(e.Saving(), 5.0 / 8.0);
}

// Out of sample: a reuse that keeps tokens its history did not rank is packed by the history
// it had, not by itself. History {0, 5, 10, 15}; the reuse keeps {1, 6, 11, 12}: stored chunks
// 0, 1, 2, 3; packed, the unranked tokens follow the ranked ones by offset (1 -> position 4,
// 6 -> 8, 11 -> 12, 12 -> 13): chunks 1, 2, 3.
TEST(ReordererTest, EvidencePacksByTheHistoryBeforeTheReuse) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options());
  Reuse(&r, tree, seg, {{0, 5, 10, 15}});
  Reuse(&r, tree, seg, {{1, 6, 11, 12}});
  EXPECT_EQ(r.EvidenceOf(seg).stored_chunks, 4);
  EXPECT_EQ(r.EvidenceOf(seg).packed_chunks, 3);
}

// The packed layout is the one a repack would make: one pack per node. With the segment split
// into two nodes of 8 tokens, 0 and 5 pack into chunk 0 and 10 and 15 into chunk 2 (the second
// node's first chunk), so the reuse touches 2 chunks packed, not 1.
TEST(ReordererTest, EvidenceFollowsTheNodesARepackPacksBy) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  std::vector<std::uint64_t> other = Symbols(8);
  other.push_back(9999);
  tree.Insert(other, tree.Lookup(other));  // splits the node after 8 tokens
  ASSERT_EQ(tree.NodeRanges(seg).size(), 2u);
  Reorderer r(Options());
  Reuse(&r, tree, seg, {{0, 5, 10, 15}});
  Reuse(&r, tree, seg, {{0, 5, 10, 15}});
  EXPECT_EQ(r.EvidenceOf(seg).stored_chunks, 4);
  EXPECT_EQ(r.EvidenceOf(seg).packed_chunks, 2);
}

// A request reusing part of a segment through two pieces: only the tokens inside the pieces
// count, mapped to the segment's offsets.
TEST(ReordererTest, EvidenceCountsTokensOfThePiecesOnly) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options());
  Reuse(&r, tree, seg, {{0, 5, 10, 15}});
  // Prefix tokens 100..107 are offsets 0..7, prefix tokens 200..203 are offsets 12..15.
  const Reorderer::Piece pieces[] = {{100, 108, 0}, {200, 204, 12}};
  const std::vector<TokenSet> layers = {{5, 100, 105, 150, 203}};  // 5, 150: in no piece
  r.RecordEvidence(tree, seg, pieces, layers);
  // Offsets 0, 5, 15: stored chunks 0, 1, 3; packed all in chunk 0.
  EXPECT_EQ(r.EvidenceOf(seg).stored_chunks, 3);
  EXPECT_EQ(r.EvidenceOf(seg).packed_chunks, 1);
}

// Rent or buy: the segment is due once the bytes its reuses' extra chunks were worth reach the
// repack's cost. One measured reuse saved 5 chunks of 100 B: due at a cost of 500 B, not 501.
TEST(ReordererTest, DueAtBreakEven) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options());
  Reuse(&r, tree, seg, {{0, 5, 10, 15}, {0, 5, 10, 15}});
  EXPECT_TRUE(r.Due(tree, Cost(0)).empty()) << "nothing measured yet: no evidence";
  Reuse(&r, tree, seg, {{0, 5, 10, 15}, {0, 5, 10, 14}});
  EXPECT_EQ(r.Due(tree, Cost(500)), std::vector<std::uint32_t>{seg});
  EXPECT_TRUE(r.Due(tree, Cost(501)).empty());
  // The rent keeps adding up: a second such reuse pays for 1000 B.
  Reuse(&r, tree, seg, {{0, 5, 10, 15}, {0, 5, 10, 14}});
  EXPECT_EQ(r.Due(tree, Cost(1000)), std::vector<std::uint32_t>{seg});
}

// The rent priced by what each layer's loads cost (RecordEvidence's layer_bytes): the second
// reuse saves 3 of 4 chunks in layer 0 (stored 4, packed 1, as above) and 2 of 4 in layer 1
// (stored 4, packed 2). Layer 0 loaded K and V chunks worth 800 B, layer 1 -- a layer whose
// keys were loaded whole, so only its 4 value chunks follow the layout -- 400 B: rent
// 3/4 * 800 + 2/4 * 400 = 800 B, where a flat 200 B a saved chunk would have said 1000 B.
TEST(ReordererTest, RentIsTheSavedShareOfWhatEachLayersLoadsCost) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options(1, 0, /*saved_chunk_bytes=*/200));
  const Reorderer::Piece piece{0, 16, 0};
  const std::vector<TokenSet> first = {{0, 5, 10, 15}, {0, 5, 10, 15}};
  const std::vector<TokenSet> second = {{0, 5, 10, 15}, {0, 5, 10, 14}};
  const std::vector<double> bytes = {800, 400};
  r.RecordEvidence(tree, seg, std::span<const Reorderer::Piece>(&piece, 1), first, bytes);
  r.Record(seg, 16, 0, std::vector<float>{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});
  EXPECT_EQ(r.EvidenceOf(seg).rent_bytes, 0) << "no history before the first reuse";
  r.RecordEvidence(tree, seg, std::span<const Reorderer::Piece>(&piece, 1), second, bytes);
  const Reorderer::Evidence e = r.EvidenceOf(seg);
  EXPECT_EQ(e.stored_chunks, 8);
  EXPECT_EQ(e.packed_chunks, 3);
  EXPECT_DOUBLE_EQ(e.rent_bytes, 800);
  EXPECT_EQ(r.Due(tree, Cost(800)), std::vector<std::uint32_t>{seg});
  EXPECT_TRUE(r.Due(tree, Cost(801)).empty());
  // Without a measured price each saved chunk is worth saved_chunk_bytes: 5 * 200 B.
  Reorderer flat(Options(1, 0, 200));
  Reuse(&flat, tree, seg, first);
  Reuse(&flat, tree, seg, second);
  EXPECT_DOUBLE_EQ(flat.EvidenceOf(seg).rent_bytes, 1000);
}

// Loads that cost the same in any layout (every layer's loads priced at 0 B: whole-prefix
// loads, or extents with no alignment waste) pay no rent: packing would save chunks of the
// count but no bytes, so the segment is never due, even for a repack that costs nothing.
TEST(ReordererTest, LoadsThatCostTheSameInAnyLayoutPayNoRent) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options());
  const Reorderer::Piece piece{0, 16, 0};
  const std::vector<TokenSet> sets = {{0, 5, 10, 15}};
  const std::vector<double> nothing = {0};
  for (int i = 0; i < 3; ++i) {
    r.RecordEvidence(tree, seg, std::span<const Reorderer::Piece>(&piece, 1), sets, nothing);
    r.Record(seg, 16, 0, std::vector<float>{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});
  }
  EXPECT_GT(r.EvidenceOf(seg).Saving(), 0) << "the count says packing saves chunks";
  EXPECT_EQ(r.EvidenceOf(seg).rent_bytes, 0);
  EXPECT_TRUE(r.Due(tree, Cost(0)).empty());
}

TEST(ReordererTest, MinAccessesAndMinGainAlsoHold) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer three(Options(/*min_accesses=*/3));
  Reuse(&three, tree, seg, {{0, 5, 10, 15}});
  Reuse(&three, tree, seg, {{0, 5, 10, 15}});  // saving 3 of 4
  EXPECT_TRUE(three.Due(tree, Cost(0)).empty()) << "two reuses of three";
  Reuse(&three, tree, seg, {{0, 5, 10, 15}});
  EXPECT_EQ(three.Due(tree, Cost(0)), std::vector<std::uint32_t>{seg});
  Reorderer strict(Options(1, /*min_gain=*/0.8));
  Reuse(&strict, tree, seg, {{0, 5, 10, 15}});
  Reuse(&strict, tree, seg, {{0, 5, 10, 15}});
  EXPECT_TRUE(strict.Due(tree, Cost(0)).empty()) << "a saving of 0.75 is below 0.8";
}

// A dense segment saves nothing, whatever the repack would cost.
TEST(ReordererTest, LeavesDenseSegmentsAlone) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options());
  Reuse(&r, tree, seg, {{4, 5, 6, 7}});
  Reuse(&r, tree, seg, {{4, 5, 6, 7}});
  EXPECT_EQ(r.EvidenceOf(seg).stored_chunks, 1);
  EXPECT_EQ(r.EvidenceOf(seg).packed_chunks, 1);
  EXPECT_TRUE(r.Due(tree, Cost(0)).empty()) << "no chunk to save: a rewrite would only cost I/O";
}

// After a repack the evidence starts over against the new layout: reuses that keep what the
// repack packed save nothing more, so the segment is not repacked again; a real change of what
// the layers keep is measured against the new layout and makes it due again.
TEST(ReordererTest, StartsOverAfterARepack) {
  RadixTree tree(1, 4);
  const std::uint32_t seg = Store(&tree);
  Reorderer r(Options());
  Reuse(&r, tree, seg, {{0, 5, 10, 15}});
  Reuse(&r, tree, seg, {{0, 5, 10, 15}});
  ASSERT_EQ(r.Due(tree, Cost(0)), std::vector<std::uint32_t>{seg});
  const std::uint32_t repacked = tree.Repack(seg, r.MeanImportance(seg));
  r.Repacked(seg, repacked);
  EXPECT_EQ(r.EvidenceOf(repacked).accesses, 0);
  EXPECT_EQ(r.EvidenceOf(repacked).reuses, 0);
  for (int i = 0; i < 4; ++i) Reuse(&r, tree, repacked, {{0, 5, 10, 15}});
  EXPECT_EQ(r.EvidenceOf(repacked).stored_chunks, 4);
  EXPECT_EQ(r.EvidenceOf(repacked).packed_chunks, 4);
  EXPECT_TRUE(r.Due(tree, Cost(0)).empty()) << "already packed";
  // The layers now keep 1, 6, 11, 12: stored after 0, 5, 10, 15 in offset order (positions 4,
  // 8, 12, 13: chunks 1, 2, 3); once the history ranks them above the other tokens, packed
  // they share one chunk.
  for (int i = 0; i < 8; ++i) Reuse(&r, tree, repacked, {{1, 6, 11, 12}});
  EXPECT_GT(r.EvidenceOf(repacked).stored_chunks, r.EvidenceOf(repacked).packed_chunks);
  EXPECT_EQ(r.Due(tree, Cost(0)), std::vector<std::uint32_t>{repacked});
}

}  // namespace
}  // namespace kvtier
