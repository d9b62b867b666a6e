#pragma once
// LoadPlanner: turns "layer l needs these rows of R of this kind" into loads. It owns one
// request's chunk map (which stored chunk and row each token of the reusable prefix R is, the
// rows of every chunk, the layout of the last shared selection) and its prefetch tables, and
// it is the one submission path for every schedule's loads:
//
//   Plan(layer, kind, selection, demand) -> cache accesses and the plan of a Group
//   Submit(group)                        -> at most five aggregated transfers
//       ssd_read      chunks missing from GPU and CPU memory (SSD -> CPU): whole chunks, or
//                     with transfer.ssd_read_unit = extent the extents holding the needed rows
//                     of a demand-read chunk the cache does not admit
//       from_ssd      the needed rows of what was read               (CPU -> GPU)
//       from_cpu      the needed rows of CPU-cached chunks, and rows a prefetch missed
//     where each of from_ssd and from_cpu is the ops of the system's transfer.strategy
//     (core/transfer_strategy.h: an H2D, after a CPU gather for staged_gather), plus the
//     cache's promotions and demotions as background whole-chunk transfers (demote, then
//     promote).
//
// A demand plan is a use of the chunk (one TieredCache::Access, SPEC §IV-D2): it decides the
// source and may move chunks between tiers. A prefetch plan only looks the chunk up (and pins
// it when a concurrent request might evict it) and enters it in the prefetch table for the
// next layer, where the demand plan of that layer finds it by slot: rows the prefetch brought
// are not loaded again, rows it missed come from CPU memory.
//
// Performance (sim_bench spec profile): Plan runs per chunk; it does no virtual calls, reuses
// thread_local scratch, takes whole-prefix rows from the per-request table and shared
// selections from a cached layout, and reuses the cache lookup a prefetch made (ChunkRef).
//
// With reorder.enabled a demand plan also prices, per layer and segment, what its K and V loads
// of a kept set cost the request (RequestRun::layout_bytes, the reorderer's rent, core/
// reorderer.h): each chunk at the bytes it moved from the SSD (a whole chunk, or for an extent
// read the extents beyond the needed rows, which any layout reads) or at the memory it holds
// (a whole chunk); loads of the whole prefix cost the same in any layout and are not priced.
//
// One LoadPlanner per request (a member of RequestRun); not thread-safe.

#include <cstdint>
#include <span>
#include <vector>

#include "core/executor.h"
#include "core/radix_tree.h"
#include "core/selection.h"
#include "core/tiered_cache.h"
#include "core/transfer_strategy.h"

namespace kvtier {

class RequestRun;

class LoadPlanner {
 public:
  // Loads of one or more (layer, kind) needs, aggregated per source into at most five ops.
  struct Group {
    TransferOp ssd_read;
    RowOps from_ssd, from_cpu;  // per source: the strategy's gather and H2D
    std::vector<OpId> prefetch_deps;     // prefetch transfers the group relies on
    std::vector<std::uint32_t> fetched;  // prefetch: slots entered in the prefetch table
    Bytes promote_bytes = 0, demote_bytes = 0;
    // Chunks promoted / demoted (one DMA each), counted whether or not chunks are listed, so
    // the simulator (no chunk lists) charges the copies hw makes.
    std::uint32_t promote_count = 0, demote_count = 0;
    std::vector<ChunkIo> promote_chunks, demote_chunks;
    std::vector<OpId> terminal;          // filled by Submit: what the loaded rows wait for
    std::int64_t gpu_hits = 0, cpu_hits = 0, ssd_reads = 0, prefetch_used = 0;
  };

  // `run` owns this planner and outlives it.
  explicit LoadPlanner(RequestRun& run);

  // Maps R (the tokens `match` reuses) to stored chunks and rows and resets the prefetch
  // tables. REQUIRES: every piece of `match` names a live segment of `tree`.
  void Map(const Match& match, const RadixTree& tree);

  // The segments Map found, in order of first use: RequestRun::layout_bytes is indexed by
  // layer * segments().size() + the segment's index here.
  std::span<const std::uint32_t> segments() const { return segments_; }

  // Starts a layer: what was prefetched for it becomes current, the table for the next layer
  // is emptied. Returns how many chunks were prefetched for this layer.
  std::int64_t BeginLayer();

  // Plans the loads of the `kind` chunks of `layer` that `sel` needs into `group` (nothing is
  // submitted). demand: the layer uses them now (cache accesses, their moves, prefetch
  // settlement, decision rows); otherwise they are a prefetch for `layer`, entered in the
  // prefetch table so that layer's demand plan finds them. Token indices of `sel` are < n.
  void Plan(int layer, KvKind kind, const Selection& sel, bool demand, Group* group);

  // Submits a planned group (see the file comment) for `purpose` and `layer` (-1: several),
  // adds its hits to the request's record and leaves group->terminal set. `after` orders the
  // group's CPU->GPU copies; `after_read`, when given, orders its SSD read instead (a prefetch
  // read follows the current layer's demand reads on the SSD while its copies follow the
  // demand copies on PCIe). The SSD read op, or kNoOp, is left in *read_op when given.
  void Submit(Group& group, Purpose purpose, int layer, std::vector<OpId> after,
              const std::vector<OpId>* after_read = nullptr, OpId* read_op = nullptr);

  // Plans and submits a prefetch of `kind` chunks of `layer` for `sel`, its copies after
  // `after` (the current layer's demand loads: demand has priority over speculation, as the
  // io engine's classes give it on hardware) and its SSD read after the reads in *reads, to
  // which it is appended. Logs a "prefetch" decision per chunk when chunk decisions are
  // logged. Returns the group's terminal ops.
  std::vector<OpId> Prefetch(int layer, KvKind kind, const Selection& sel, Purpose purpose,
                             const std::vector<OpId>& after, std::vector<OpId>* reads);

 private:
  // Where the rows of a chunk come from in one group.
  enum class Source : std::uint8_t { kGpuHit, kCpu, kSsd, kPrefetched };

  // What was prefetched for one layer, indexed by (kind, slot): a request's slots name its
  // chunks of every layer, so the demand pass finds a prefetched chunk without hashing its
  // ChunkId. The rows of all entries share one buffer. (Replaced an unordered_map<ChunkId,
  // PrefetchEntry> with a vector of rows per entry: one hash lookup and one allocation less
  // per chunk and layer.)
  struct PrefetchTable {
    struct Entry {
      bool valid = false;
      bool all_rows = false;
      Source source = Source::kSsd;
      OpId op = kNoOp;  // transfer that brought the rows (kNoOp: GPU hit)
      std::uint32_t row_begin = 0, row_count = 0;  // sorted rows in `rows`
      TieredCache::ChunkRef ref;  // the cache lookup made when planning, reused by the demand
    };
    static constexpr std::size_t kKinds = 3;  // KvKind values
    std::size_t nslots = 0;
    std::vector<Entry> entries;
    std::vector<std::uint16_t> rows;
    std::int64_t size = 0;  // valid entries

    void Reset(std::size_t slots);
    Entry& At(KvKind kind, std::size_t slot) {
      return entries[static_cast<std::size_t>(kind) * nslots + slot];
    }
    std::span<const std::uint16_t> RowsOf(const Entry& e) const {
      return {rows.data() + e.row_begin, e.row_count};
    }
  };

  struct Slot {
    std::uint32_t segment;
    std::uint32_t chunk;
    int tokens;
    std::uint32_t segment_index;  // in segments_
  };

  // The per-slot rows of the last shared selection Plan laid out (tokens, counts, offsets,
  // rows): K and V loads, and a layer's prefetch and demand, reuse one selection.
  struct SharedLayout {
    TokenSet tokens;
    std::vector<std::uint32_t> count, offset;
    std::vector<std::uint16_t> rows;
    bool valid = false;
  };

  // Lays out a shared selection per slot into shared_layout_ (unless it is laid out already).
  void LayOutShared(const TokenSet& tokens);

  RequestRun& run_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> segments_;
  std::vector<std::uint32_t> slot_of_;  // per R token
  std::vector<std::uint16_t> row_of_;   // per R token
  SharedLayout shared_layout_;
  // Per slot, the rows of all its R tokens (sorted): what a load of the whole prefix needs,
  // computed once per request instead of per layer and kind.
  std::vector<std::uint32_t> all_offset_;  // nslots + 1
  std::vector<std::uint16_t> all_rows_;
  PrefetchTable prefetched_;  // for the next layer
  PrefetchTable current_;     // for the current layer
};

}  // namespace kvtier
