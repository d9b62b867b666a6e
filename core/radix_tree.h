#pragma once
// RadixTree: the index of stored prefixes (SPEC §IV-A, "Dataflow"). A node holds a run of
// prefix symbols (token ids, or block hashes standing for `tokens_per_symbol` tokens each)
// shared by all its descendants. A lookup returns the longest stored prefix of a request: the
// reusable part R, and how many symbols are new (NR). Inserting NR creates a new leaf and
// splits a node where the match ended inside it.
//
// Where the KV of a token lives. Stored KV is immutable and grouped in *segments*: the NR of
// one request is stored as one segment. A node references a range of a segment (a split
// leaves both halves referencing the same segment, so splitting never moves data). A segment
// is laid out in *packs*: ranges of its tokens whose KV is packed into chunks of
// `chunk_tokens` stored tokens; a fresh segment is one pack in original order. KV reordering
// (SPEC §IV-D1, core/reorderer.h) replaces a segment by a repacked copy whose packs are the
// node ranges that reference it, each sorted by importance — reordering never crosses a node
// (Fig. 13) — and records per token its stored position, from which a node's mapping list
// follows (Fig. 13: [t0,t1,t2,t3] stored as [t0,t3,t1,t2] has mapping list [0,2,3,1]).
// Splitting or matching a reordered node stays correct because every token keeps its own
// stored position: a chunk may then hold tokens of both halves until the next repack.
//
// Not thread-safe. Memory: O(stored symbols) for the tree plus O(stored tokens) for layouts.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/types.h"

namespace kvtier {

// Layout of one segment's stored tokens.
struct Segment {
  struct Pack {
    std::int64_t begin = 0;        // original token offsets [begin, end) of the segment
    std::int64_t end = 0;
    std::uint32_t first_chunk = 0; // chunk index of the pack's first stored position
  };
  std::uint32_t id = 0;
  std::int64_t tokens = 0;
  std::vector<Pack> packs;             // sorted, cover [0, tokens)
  std::vector<std::uint32_t> stored;   // stored position of each original offset; empty = identity
  std::uint32_t num_chunks = 0;
  bool reordered = false;

  // Chunk index and row of the token at original offset `offset`.
  std::uint32_t ChunkOf(std::int64_t offset, int chunk_tokens) const;
  std::uint16_t RowOf(std::int64_t offset, int chunk_tokens) const;
  std::int64_t StoredPosition(std::int64_t offset) const {
    return stored.empty() ? offset : stored[static_cast<std::size_t>(offset)];
  }
  const Pack& PackOf(std::int64_t offset) const;
  // Number of stored tokens in chunk `index` (the last chunk of a pack may be partial).
  int TokensInChunk(std::uint32_t index, int chunk_tokens) const;
};

// A contiguous piece of a match: prefix tokens [prefix_begin, prefix_end) are stored at
// original offsets [segment_begin, ...) of `segment`.
struct MatchPiece {
  std::int64_t prefix_begin = 0;
  std::int64_t prefix_end = 0;
  std::uint32_t segment = 0;
  std::int64_t segment_begin = 0;
  std::uint64_t node = 0;  // node id the piece comes from
};

struct Match {
  std::int64_t matched_symbols = 0;
  std::int64_t reused_tokens = 0;   // matched_symbols * tokens_per_symbol
  std::vector<MatchPiece> pieces;   // in prefix order, covering [0, reused_tokens)
};

// Lays out `seg` (whose `tokens` is set) as RadixTree::Repack does: one pack per range of
// `ranges` (sorted, covering [0, seg->tokens)), each packed from a fresh chunk, its tokens in
// descending `importance` (one finite value per original offset), ties by offset. Sets packs, stored,
// num_chunks and reordered; id is left alone. The reorderer uses it to evaluate a repack before
// making it (core/reorderer.h).
void PackByImportance(std::span<const std::pair<std::int64_t, std::int64_t>> ranges,
                      std::span<const float> importance, int chunk_tokens, Segment* seg);

class RadixTree {
 public:
  RadixTree(int tokens_per_symbol, int chunk_tokens);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  // Longest stored prefix of `symbols`. Does not modify the tree.
  Match Lookup(std::span<const std::uint64_t> symbols) const;

  // Stores the part of `symbols` beyond the longest match as a new segment (if non-empty),
  // splitting the node where the match ended. Returns the new segment id, or 0 when nothing
  // was new. REQUIRES: the tree is unchanged since `match = Lookup(symbols)`.
  std::uint32_t Insert(std::span<const std::uint64_t> symbols, const Match& match);

  // Replaces segment `old_id` by a repacked copy: one pack per node range referencing it,
  // tokens of each pack ordered by `importance` (indexed by original offset) descending, ties
  // by offset. Returns the new segment id; nodes are re-pointed. The old segment is gone.
  std::uint32_t Repack(std::uint32_t old_id, std::span<const float> importance);

  // The packs Repack(id, ...) makes: the node ranges referencing segment `id`, plus each gap no
  // node references as a range of its own; sorted, covering [0, tokens).
  std::vector<std::pair<std::int64_t, std::int64_t>> RepackRanges(std::uint32_t id) const;

  const Segment* FindSegment(std::uint32_t id) const;
  // Node ranges [begin, end) (original offsets) that reference segment `id`, sorted.
  std::vector<std::pair<std::int64_t, std::int64_t>> NodeRanges(std::uint32_t id) const;
  // The mapping list of node `node` (MatchPiece::node): entry i is the stored position of the
  // node's i-th token relative to the start of its pack (SPEC §IV-D1, Fig. 13).
  std::vector<std::uint32_t> MappingList(std::uint64_t node) const;

  int tokens_per_symbol() const { return tokens_per_symbol_; }
  int chunk_tokens() const { return chunk_tokens_; }
  std::size_t node_count() const;
  std::size_t segment_count() const { return segments_.size(); }
  std::int64_t stored_tokens() const { return stored_tokens_; }

  // Verifies parent/child links, symbol counts and segment ranges; aborts on a broken one.
  void CheckInvariants() const;

 private:
  struct Node;
  Node* Split(Node* node, std::int64_t at);
  std::uint32_t NewSegment(std::int64_t tokens);

  int tokens_per_symbol_;
  int chunk_tokens_;
  std::unique_ptr<Node> root_;
  std::unordered_map<std::uint64_t, Node*> nodes_;  // id -> node
  // Segment id -> the nodes that reference it (NodeRanges and Repack visit only these: a scan
  // of every node per segment made the reorderer's passes quadratic in the tree's size).
  std::unordered_map<std::uint32_t, std::vector<Node*>> segment_nodes_;
  std::unordered_map<std::uint32_t, Segment> segments_;
  std::uint32_t next_segment_ = 1;
  std::uint64_t next_node_ = 1;
  std::int64_t stored_tokens_ = 0;
};

}  // namespace kvtier
