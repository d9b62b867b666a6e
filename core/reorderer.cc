#include "core/reorderer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/radix_tree.h"

namespace kvtier {

Reorderer::Reorderer(const ReordererOptions& options) : options_(options) {
  KVTIER_CHECK(options_.chunk_tokens >= 1, "Reorderer: chunk_tokens >= 1");
}

void Reorderer::Record(std::uint32_t segment, std::int64_t segment_tokens, std::int64_t offset,
                       std::span<const float> importance) {
  Stats& s = stats_[segment];
  if (s.mean.empty()) {
    s.mean.assign(static_cast<std::size_t>(segment_tokens), 0.0f);
    s.seen.assign((static_cast<std::size_t>(segment_tokens) + 63) / 64, 0);
  }
  KVTIER_DCHECK(offset + std::int64_t(importance.size()) <= segment_tokens,
                "reorderer: access past the segment end");
  const float w = static_cast<float>(options_.history_weight);
  for (std::size_t i = 0; i < importance.size(); ++i) {
    const std::size_t o = static_cast<std::size_t>(offset) + i;
    std::uint64_t& word = s.seen[o / 64];
    const std::uint64_t bit = std::uint64_t{1} << (o % 64);
    s.mean[o] = (word & bit) != 0 ? w * s.mean[o] + (1 - w) * importance[i] : importance[i];
    word |= bit;
  }
  ++s.accesses;
}

// The evidence, measured as `trace stats` measures its history-based packing saving
// (traces/importance_stats.cc, StructureResult): per layer, the chunks the kept set touches in
// the stored layout and in the packed one, counted over the same reuses and layers. The packed
// layout is the one RadixTree::Repack would make now (PackByImportance over the segment's
// current node ranges, by the history before this reuse), so the evidence says what the repack
// the reorderer would actually make would have saved, node boundaries and partial chunks
// included. This replaced an estimate from the history alone (each token kept independently,
// with its mean as probability: E = sum over chunks of 1 - prod(1 - p)), which, with
// `reorder.min_gain` 0.2, never fired on the workloads of docs/paper-comparison.md: tokens a
// layer keeps are not independent (neighbours share importance, and a layer that keeps a
// token keeps its chunk-mates more often), so it understated what packing saves.
void Reorderer::RecordEvidence(const RadixTree& tree, std::uint32_t id,
                               std::span<const Piece> pieces,
                               std::span<const TokenSet> layer_sets,
                               std::span<const double> layer_bytes) {
  auto it = stats_.find(id);
  if (it == stats_.end() || it->second.mean.empty()) return;  // no history to pack by yet
  Stats& s = it->second;
  KVTIER_CHECK(layer_bytes.empty() || layer_bytes.size() == layer_sets.size(),
               "Reorderer::RecordEvidence: layer_bytes and layer_sets differ in length");
  const Segment* seg = tree.FindSegment(id);
  KVTIER_CHECK(seg != nullptr, "Reorderer::RecordEvidence: unknown segment");
  KVTIER_CHECK(std::int64_t(s.mean.size()) == seg->tokens,
               "Reorderer::RecordEvidence: history and segment disagree on its length");
  const int ct = options_.chunk_tokens;
  thread_local Segment packed;
  packed.tokens = seg->tokens;
  PackByImportance(tree.RepackRanges(id), s.mean, ct, &packed);
  // Per original offset: its chunk now and after the repack (arrays, not Segment::ChunkOf per
  // kept token: that searched the packs ~10^5 times per request of a 5K-token prefix).
  thread_local std::vector<std::uint32_t> chunk_now, chunk_packed;
  auto chunks_of = [ct](const Segment& g, std::vector<std::uint32_t>* out) {
    out->resize(static_cast<std::size_t>(g.tokens));
    for (const Segment::Pack& pack : g.packs) {
      for (std::int64_t o = pack.begin; o < pack.end; ++o) {
        (*out)[std::size_t(o)] =
            pack.first_chunk + std::uint32_t((g.StoredPosition(o) - pack.begin) / ct);
      }
    }
  };
  chunks_of(*seg, &chunk_now);
  chunks_of(packed, &chunk_packed);
  thread_local std::vector<std::uint32_t> stamp_now, stamp_packed;
  stamp_now.assign(seg->num_chunks, 0);
  stamp_packed.assign(packed.num_chunks, 0);
  std::uint32_t stamp = 0;
  std::int64_t stored = 0, packed_count = 0;
  double rent = 0;
  for (std::size_t l = 0; l < layer_sets.size(); ++l) {
    const TokenSet& set = layer_sets[l];
    ++stamp;
    std::int64_t layer_stored = 0, layer_packed = 0;
    for (const Piece& p : pieces) {
      auto b = std::lower_bound(set.begin(), set.end(), p.prefix_begin);
      auto e = std::lower_bound(b, set.end(), p.prefix_end);
      for (auto t = b; t != e; ++t) {
        const std::size_t offset =
            std::size_t(p.segment_begin + (std::int64_t(*t) - p.prefix_begin));
        const std::uint32_t now = chunk_now[offset], after = chunk_packed[offset];
        layer_stored += stamp_now[now] != stamp;
        stamp_now[now] = stamp;
        layer_packed += stamp_packed[after] != stamp;
        stamp_packed[after] = stamp;
      }
    }
    stored += layer_stored;
    packed_count += layer_packed;
    // The rent: the share of the layer's chunks packing saves, of what its loads cost.
    if (layer_bytes.empty()) {
      rent += double(layer_stored - layer_packed) * double(options_.saved_chunk_bytes);
    } else if (layer_stored > 0) {
      rent += double(layer_stored - layer_packed) / double(layer_stored) * layer_bytes[l];
    }
  }
  ++s.reuses;
  s.stored_chunks += double(stored);
  s.packed_chunks += double(packed_count);
  s.rent_bytes += rent;
}

// Rent or buy (see the header): due once the rent the reuses since the last repack paid
// reaches what the repack moves over the SSD now. With every chunk whole and both kinds
// following the kept set, a segment is repacked after about
//   repack bytes / (saved chunks per reuse * K and V chunk bytes)
// reuses, plus the wait for the next pass: on the reordering benchmark (bench/sim/
// reorder_bench.sh: OPT-13B few-shot prompts of 2-10K tokens, importance fitted to the PIQA
// recording, savings of 16-20% on ITF's sets) segments were repacked after 6 to 15 measured
// reuses (docs/paper-comparison.md, "Reordering that pays"). The rent was first priced that
// way for every layer; a layer where ITF falls back loads every key whatever the layout, so
// its saved chunks are now worth their values only (measured by the planner, with the tier and
// read unit of each chunk; see the header).
std::vector<std::uint32_t> Reorderer::Due(
    const RadixTree& tree, const std::function<double(std::uint32_t)>& repack_bytes) const {
  std::vector<std::uint32_t> due;
  for (const auto& [id, s] : stats_) {
    if (s.accesses < options_.min_accesses || s.reuses == 0) continue;
    if (tree.FindSegment(id) == nullptr) continue;
    const double saved = s.stored_chunks - s.packed_chunks;
    if (!(saved > 0) || !(s.rent_bytes > 0)) continue;
    if (1.0 - s.packed_chunks / s.stored_chunks < options_.min_gain) continue;
    // The writes alone (no cache lookups) first: most segments are far from due.
    if (s.rent_bytes < double(s.mean.size()) * double(options_.written_bytes_per_token)) continue;
    if (s.rent_bytes >= repack_bytes(id)) due.push_back(id);
  }
  std::sort(due.begin(), due.end());
  return due;
}

std::span<const float> Reorderer::MeanImportance(std::uint32_t segment) const {
  auto it = stats_.find(segment);
  if (it == stats_.end()) return {};
  return it->second.mean;
}

Reorderer::Evidence Reorderer::EvidenceOf(std::uint32_t segment) const {
  auto it = stats_.find(segment);
  if (it == stats_.end()) return {};
  const Stats& s = it->second;
  return {s.accesses, s.reuses, s.stored_chunks, s.packed_chunks, s.rent_bytes};
}

void Reorderer::Repacked(std::uint32_t old_id, std::uint32_t new_id) {
  auto it = stats_.find(old_id);
  if (it == stats_.end()) return;
  Stats s = std::move(it->second);
  stats_.erase(it);
  s.accesses = 0;
  s.reuses = 0;
  s.stored_chunks = s.packed_chunks = s.rent_bytes = 0;
  stats_[new_id] = std::move(s);
}

}  // namespace kvtier
