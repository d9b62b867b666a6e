#pragma once
// Reorderer: the bookkeeping behind KV reordering (SPEC §IV-D1). The Pipeline tells it, after
// every request, what the request kept of each stored segment it reused; it keeps two things per
// segment, and says which segments are worth repacking.
//
//   history  a moving average per stored token of how important the token was when it was
//            reused (the share of layers whose selection kept it): m <- w m + (1 - w) x. A
//            repack orders each node range's tokens by it (RadixTree::Repack); history selectors
//            choose from it (core/selectors/history.cc).
//   evidence what packing by that history would have saved, measured the way `trace stats`
//            measures its history-based packing saving (traces/importance_stats.h): for every
//            reuse that had a history, and every layer, the chunks the layer's kept set touches
//            in the stored layout (S) and in the layout a repack by the history *before* the
//            reuse would make (P). Out of sample, as `trace stats` packs a request by the other
//            requests' importance: a history that only fits its own past earns nothing.
//            saving = 1 - sum P / sum S, the statistic `trace stats` reports.
//
// The repack decision (Due) is rent-or-buy: a repack is a one-time cost (the bytes it moves over
// the SSD: the reads of chunks no cache holds, the writes of the repacked segment), each reuse
// with the old layout pays a rent: what the chunks its layers touch beyond what the packed
// layout would cost. A segment is due once the rent already paid since its last repack reaches
// the repack's cost: the break-even rule, which never pays more than twice what an oracle
// knowing the segment's future reuses would (the rent-or-buy bound), and needs no threshold to
// tune. `min_gain` optionally also requires the saving share; `min_accesses` reuses since the
// last repack are always required. After a repack the evidence starts over against the new
// layout, so a segment is repacked again only when the history has drifted enough for another
// repack to pay for itself.
//
// The rent is priced by what the reuse's loads really cost, layer by layer (RecordEvidence's
// `layer_bytes`, measured by the load planner): a layer whose kept set touched S chunks stored
// and would touch P packed pays (S - P) / S of the bytes of its loads that follow the layout --
// the K and V chunks of its kept set, each at the bytes it moved from the SSD (a whole chunk,
// or, read as extents, the extents beyond the rows any layout reads) or the memory it holds
// in a cache (a whole chunk: room another chunk would otherwise be read from the SSD into, an
// upper bound on what packing frees there; pricing it at nothing, SSD bytes only, was measured
// to skip most repacks and most of the cut: docs/paper-comparison.md, "Reordering that pays"). A
// load of the whole prefix (the keys of a layer where ITF falls back, the probe keys) touches
// every chunk in any layout and pays nothing. Without `layer_bytes` a saved chunk is worth
// `saved_chunk_bytes` (a K and a V chunk), which is what the measured price comes to where
// both kinds follow the kept set and every chunk is whole.
//
// Pure bookkeeping: no I/O, no clock, no cache. Not thread-safe.

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/itf.h"
#include "core/types.h"

namespace kvtier {

class RadixTree;

struct ReordererOptions {
  double history_weight = 0.8;  // w of the moving average
  int min_accesses = 2;         // reuses since the last repack before a segment may be due
  int chunk_tokens = 64;
  double min_gain = 0;          // in [0, 1]: the saving share a repack must also reach
  // Bytes one saved chunk of a layer's kept set is worth when RecordEvidence is given no
  // measured price: a full K and V chunk.
  Bytes saved_chunk_bytes = 0;
  // Bytes a repack writes per token of the segment (every layer and stored kind): the least a
  // repack costs, so Due asks for the full cost only of segments that could be due.
  Bytes written_bytes_per_token = 0;
};

class Reorderer {
 public:
  explicit Reorderer(const ReordererOptions& options);

  // Records one reuse of tokens [offset, offset + importance.size()) of `segment` (which has
  // `segment_tokens` tokens) in the history: m <- w*m + (1-w)*x per token, m = x on a token's
  // first reuse. Counts the reuse as an access.
  void Record(std::uint32_t segment, std::int64_t segment_tokens, std::int64_t offset,
              std::span<const float> importance);

  // One piece of a reuse: prefix tokens [prefix_begin, prefix_end) are the segment's original
  // offsets [segment_begin, ...) (core/radix_tree.h, MatchPiece).
  struct Piece {
    std::int64_t prefix_begin = 0, prefix_end = 0, segment_begin = 0;
  };
  // Adds the evidence of one reuse of segment `id` of `tree`: `pieces` are the request's pieces
  // on that segment, `layer_sets` per layer the prefix tokens the layer kept (sorted, unique;
  // tokens outside the pieces are ignored). `layer_bytes`, when not empty, is per layer (as
  // `layer_sets`) what the layer's loads of this segment that follow the layout cost (see the
  // file comment); empty, each saved chunk is worth options.saved_chunk_bytes. Does nothing
  // when the segment has no history yet. Call it before Record of the same reuse (the packed
  // layout is the history's before it).
  // REQUIRES: the segment is in `tree`; layer_bytes is empty or as long as layer_sets.
  void RecordEvidence(const RadixTree& tree, std::uint32_t id, std::span<const Piece> pieces,
                      std::span<const TokenSet> layer_sets,
                      std::span<const double> layer_bytes = {});

  // Segments due for repacking (see above), in ascending id order (deterministic).
  // `repack_bytes(id)` is what repacking segment id would move over the SSD now.
  std::vector<std::uint32_t> Due(const RadixTree& tree,
                                 const std::function<double(std::uint32_t)>& repack_bytes) const;

  // Mean importance per original offset of `segment` (empty if never recorded).
  std::span<const float> MeanImportance(std::uint32_t segment) const;

  // What the evidence of `segment` says since its last repack (zeros if none).
  struct Evidence {
    std::int64_t accesses = 0;        // reuses recorded
    std::int64_t reuses = 0;          // reuses that had a history (measured)
    double stored_chunks = 0;         // sum over them and their layers of S
    double packed_chunks = 0;         // ... of P
    double rent_bytes = 0;            // the rent paid (see the file comment)
    double Saving() const { return stored_chunks > 0 ? 1.0 - packed_chunks / stored_chunks : 0; }
  };
  Evidence EvidenceOf(std::uint32_t segment) const;

  // Moves the statistics of `old_id` to `new_id` after a repack; the access count and the
  // evidence start over.
  void Repacked(std::uint32_t old_id, std::uint32_t new_id);

 private:
  struct Stats {
    std::vector<float> mean;
    std::vector<std::uint64_t> seen;  // a bit per token (a byte was ~1/5 of the history's memory)
    int accesses = 0;
    std::int64_t reuses = 0;
    double stored_chunks = 0, packed_chunks = 0, rent_bytes = 0;
  };
  ReordererOptions options_;
  std::unordered_map<std::uint32_t, Stats> stats_;
};

}  // namespace kvtier
