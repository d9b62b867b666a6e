#include "core/pipeline.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_map>

#include "core/check.h"
#include "core/itf.h"
#include "core/prefetch.h"

namespace kvtier {

// ---- per-request state ----------------------------------------------------------------------

// What one layer keeps of R: every token (optionally a token range, for Cake's chunks), one
// shared set (ITF pass, or a prediction), or one set per KV head (H2O).
struct Pipeline::Selection {
  enum class Kind { kAll, kShared, kPerHead } kind = Kind::kAll;
  std::int64_t begin = 0, end = 0;  // kAll: token range [begin, end)
  TokenSet shared;
  std::vector<TokenSet> per_head;

  double Kept() const {
    switch (kind) {
      case Kind::kAll: return double(end - begin);
      case Kind::kShared: return double(shared.size());
      case Kind::kPerHead: {
        double sum = 0;
        for (const auto& s : per_head) sum += double(s.size());
        return per_head.empty() ? 0 : sum / double(per_head.size());
      }
    }
    return 0;
  }
};

namespace {

// Where the rows of a chunk come from in one batch of loads.
enum class Source : std::uint8_t { kGpuHit, kCpu, kSsd, kPrefetched };

// What was prefetched for one layer, indexed by (kind, slot): a request's slots name its chunks
// of every layer, so the demand pass finds a prefetched chunk without hashing its ChunkId. The
// rows of all entries share one buffer. (Replaced an unordered_map<ChunkId, PrefetchEntry> with
// a vector of rows per entry: one hash lookup and one allocation less per chunk and layer.)
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

  void Reset(std::size_t slots) {
    nslots = slots;
    entries.assign(kKinds * slots, Entry{});
    rows.clear();
    size = 0;
  }
  Entry& At(KvKind kind, std::size_t slot) {
    return entries[static_cast<std::size_t>(kind) * nslots + slot];
  }
  std::span<const std::uint16_t> RowsOf(const Entry& e) const {
    return {rows.data() + e.row_begin, e.row_count};
  }
};

// Sorts one chunk's rows (distinct: a token has one row) ascending. Rows of a reordered
// segment's chunk arrive permuted on every layout; below 1,024 (any chunk of the usual 16-256
// tokens) a bitmap sorts them in O(rows + 16 words) without comparisons (std::sort of these
// small runs was 9% of IssueLoads in sim_bench's spec profile).
void SortChunkRows(std::uint16_t* b, std::uint16_t* e) {
  if (e - b < 2 || std::is_sorted(b, e)) return;
  constexpr std::size_t kWords = 16;
  if (*std::max_element(b, e) >= kWords * 64) {
    std::sort(b, e);
    return;
  }
  std::uint64_t bits[kWords] = {};
  for (const std::uint16_t* p = b; p != e; ++p) bits[*p >> 6] |= std::uint64_t{1} << (*p & 63);
  std::uint16_t* out = b;
  for (std::size_t w = 0; w < kWords; ++w) {
    for (std::uint64_t x = bits[w]; x != 0; x &= x - 1) {
      *out++ = static_cast<std::uint16_t>(w * 64 + std::size_t(std::countr_zero(x)));
    }
  }
  KVTIER_DCHECK(out == e, "a chunk's rows repeat");
}

}  // namespace

// Loads of one or more (layer, kind) needs, aggregated per source into at most four ops.
struct Pipeline::LoadGroup {
  TransferOp ssd_read, gather, h2d_from_ssd, h2d_from_cpu;
  std::vector<OpId> prefetch_deps;  // prefetch transfers the batch relies on
  std::vector<std::uint32_t> fetched;  // prefetch: slots entered in RequestState::prefetched
  Bytes promote_bytes = 0, demote_bytes = 0;
  std::vector<ChunkIo> promote_chunks, demote_chunks;
  std::vector<OpId> terminal;       // filled by SubmitLoads
  std::int64_t gpu_hits = 0, cpu_hits = 0, ssd_reads = 0, prefetch_used = 0;
};

struct Pipeline::RequestState {
  const Request* req = nullptr;
  bool warmup = false;
  int holder = -1;                 // pin slot in the cache (max_in_flight > 1), else -1
  std::uint64_t tree_version = 0;  // tree_version_ when `match` was looked up
  RequestRecord rec;
  Match match;
  std::int64_t n = 0, nr = 0, q = 0;
  struct Slot {
    std::uint32_t segment;
    std::uint32_t chunk;
    int tokens;
  };
  std::vector<Slot> slots;
  std::vector<std::uint32_t> slot_of;  // per R token
  std::vector<std::uint16_t> row_of;   // per R token
  // The per-slot rows of the last shared selection IssueLoads laid out (tokens, counts,
  // offsets, rows): K and V loads, and a layer's prefetch and demand, reuse one selection.
  struct SharedLayout {
    TokenSet tokens;
    std::vector<std::uint32_t> count, offset;
    std::vector<std::uint16_t> rows;
    bool valid = false;
  } shared_layout;
  std::vector<float> kept_fraction;    // per R token: sum over layers of the share kept
  // Foreground ops in submission order, with how to log them.
  struct OpLog {
    OpId op;
    bool is_transfer;
    TransferRecord transfer;  // when is_transfer
    bool gpu;                 // compute on the GPU
    int layer;
    ComputeKind compute_kind;
  };
  std::vector<OpLog> ops;
  // Per slot, the rows of all its R tokens (sorted): what a load of the whole prefix needs,
  // computed once per request instead of per layer and kind.
  std::vector<std::uint32_t> all_offset;  // nslots + 1
  std::vector<std::uint16_t> all_rows;
  PrefetchTable prefetched;  // for the next layer
  PrefetchTable current;     // for the current layer
  std::vector<LayerRecord> layers;
  std::vector<OpId> layer_compute;  // compute op per layer (kNoOp if none)
  std::vector<std::vector<OpId>> layer_gpu_ops;  // GPU ops attributed to each layer
  Status status;
};

namespace {

Tier SrcOf(TransferKind kind) {
  switch (kind) {
    case TransferKind::kSsdRead: return Tier::kSsd;
    case TransferKind::kSsdWrite: return Tier::kCpu;
    case TransferKind::kH2D: return Tier::kCpu;
    case TransferKind::kD2H: return Tier::kGpu;
    case TransferKind::kCpuGather: return Tier::kCpu;
  }
  return Tier::kCpu;
}

Tier DstOf(TransferKind kind) {
  switch (kind) {
    case TransferKind::kSsdRead: return Tier::kCpu;
    case TransferKind::kSsdWrite: return Tier::kSsd;
    case TransferKind::kH2D: return Tier::kGpu;
    case TransferKind::kD2H: return Tier::kCpu;
    case TransferKind::kCpuGather: return Tier::kCpu;
  }
  return Tier::kCpu;
}

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

TransferOp MakeTransfer(TransferKind kind, Purpose purpose, RequestId request, int layer) {
  TransferOp op;
  op.kind = kind;
  op.purpose = purpose;
  op.request = request;
  op.layer = layer;
  return op;
}

// Rows of `needed` not in `have` (both sorted): appended to *out when it is not null; returns
// how many.
std::size_t Missing(std::span<const std::uint16_t> needed, std::span<const std::uint16_t> have,
                    std::vector<std::uint16_t>* out) {
  std::size_t i = 0, j = 0, missing = 0;
  while (i < needed.size()) {
    if (j == have.size() || needed[i] < have[j]) {
      if (out != nullptr) out->push_back(needed[i]);
      ++missing;
      ++i;
    } else if (have[j] < needed[i]) {
      ++j;
    } else {
      ++i;
      ++j;
    }
  }
  return missing;
}

}  // namespace

// ---- construction ---------------------------------------------------------------------------

Pipeline::Pipeline(const ModelSpec& model, const PipelineOptions& options, Executor* executor,
                   ScoreSource* scores, RunLog* log)
    : model_(model), options_(options), executor_(executor), scores_(scores), log_(log) {
  const SystemOptions& s = options_.system;
  cache_ = std::make_unique<TieredCache>(NewCachePolicy(s.cache_policy, "cache.policy"), s.cache);
  tree_ = std::make_unique<RadixTree>(1, s.chunk_tokens);
  reorderer_ = std::make_unique<Reorderer>(s.reorder_history_weight, s.reorder_min_accesses,
                                           s.chunk_tokens, s.reorder_min_gain);
  KVTIER_CHECK(options_.max_in_flight >= 1 && options_.max_in_flight <= TieredCache::kMaxHolders,
               "PipelineOptions::max_in_flight must be in [1, TieredCache::kMaxHolders]");
}

Pipeline::~Pipeline() = default;

Bytes Pipeline::ChunkBytes(const Segment& seg, std::uint32_t chunk, KvKind kind) const {
  const Bytes tokens = Bytes(seg.TokensInChunk(chunk, options_.system.chunk_tokens));
  if (kind == KvKind::kProbeKey) {
    return tokens * Bytes(options_.system.itf_options.probe_heads) * model_.RowBytes();
  }
  return tokens * model_.KBytesPerTokenLayer();
}

// ---- submission helpers ---------------------------------------------------------------------

OpId Pipeline::SubmitCompute(RequestState& rs, ComputeOp op, std::vector<OpId> after, bool gpu) {
  after.erase(std::remove(after.begin(), after.end(), kNoOp), after.end());
  op.request = rs.req->id;
  OpId id = executor_->Submit(op, after);
  rs.ops.push_back({id, false, {}, gpu, op.layer, op.kind});
  return id;
}

OpId Pipeline::SubmitTransfer(RequestState& rs, TransferOp op, std::vector<OpId> after,
                              bool background) {
  after.erase(std::remove(after.begin(), after.end(), kNoOp), after.end());
  if (op.ios == 0) op.ios = std::max<std::uint32_t>(1, std::uint32_t(op.chunks.size()));
  TransferRecord tr;
  tr.request_id = rs.req->id;
  tr.layer = op.layer;
  tr.src = SrcOf(op.kind);
  tr.dst = DstOf(op.kind);
  tr.kind = op.kind;
  tr.purpose = op.purpose;
  tr.bytes = op.bytes;
  tr.ios = op.ios;
  switch (op.kind) {
    case TransferKind::kSsdRead: rs.rec.ssd_read_bytes += op.bytes; break;
    case TransferKind::kSsdWrite: rs.rec.ssd_write_bytes += op.bytes; break;
    case TransferKind::kH2D: rs.rec.pcie_h2d_bytes += op.bytes; break;
    case TransferKind::kD2H: rs.rec.pcie_d2h_bytes += op.bytes; break;
    case TransferKind::kCpuGather: break;
  }
  OpId id = executor_->Submit(std::move(op), after);
  if (background) {
    background_.push_back({id, tr});
  } else {
    rs.ops.push_back({id, true, tr, false, tr.layer, ComputeKind::kLayerPrefill});
  }
  return id;
}

// ---- chunk map --------------------------------------------------------------------------------

void Pipeline::BuildChunkMap(RequestState& rs) {
  rs.shared_layout.valid = false;  // laid out over the previous map
  const int ct = options_.system.chunk_tokens;
  rs.slot_of.resize(static_cast<std::size_t>(rs.n));
  rs.row_of.resize(static_cast<std::size_t>(rs.n));
  std::unordered_map<std::uint64_t, std::uint32_t> slot_index;
  // Consecutive tokens mostly share a chunk: the hash is asked once per run of them.
  std::uint64_t last_key = ~std::uint64_t{0};
  std::uint32_t last_slot = 0;
  for (const MatchPiece& piece : rs.match.pieces) {
    const Segment* seg = tree_->FindSegment(piece.segment);
    KVTIER_CHECK(seg != nullptr, "match piece references a live segment");
    for (std::int64_t t = piece.prefix_begin; t < piece.prefix_end; ++t) {
      const std::int64_t offset = piece.segment_begin + (t - piece.prefix_begin);
      const std::uint32_t chunk = seg->ChunkOf(offset, ct);
      const std::uint64_t key = (std::uint64_t{piece.segment} << 32) | chunk;
      if (key != last_key) {
        auto [it, inserted] = slot_index.emplace(key, std::uint32_t(rs.slots.size()));
        if (inserted) rs.slots.push_back({piece.segment, chunk, seg->TokensInChunk(chunk, ct)});
        last_key = key;
        last_slot = it->second;
      }
      rs.slot_of[static_cast<std::size_t>(t)] = last_slot;
      rs.row_of[static_cast<std::size_t>(t)] = seg->RowOf(offset, ct);
    }
  }
  const std::size_t nslots = rs.slots.size();
  rs.all_offset.assign(nslots + 1, 0);
  for (std::int64_t t = 0; t < rs.n; ++t) ++rs.all_offset[rs.slot_of[std::size_t(t)] + 1];
  for (std::size_t s = 0; s < nslots; ++s) rs.all_offset[s + 1] += rs.all_offset[s];
  rs.all_rows.resize(std::size_t(rs.n));
  std::vector<std::uint32_t> fill(rs.all_offset.begin(), rs.all_offset.end() - 1);
  for (std::int64_t t = 0; t < rs.n; ++t) {
    rs.all_rows[fill[rs.slot_of[std::size_t(t)]]++] = rs.row_of[std::size_t(t)];
  }
  for (std::size_t s = 0; s < nslots; ++s) {
    auto b = rs.all_rows.begin() + rs.all_offset[s], e = rs.all_rows.begin() + rs.all_offset[s + 1];
    SortChunkRows(std::to_address(b), std::to_address(e));
  }
  rs.prefetched.Reset(nslots);
  rs.current.Reset(nslots);
}

Pipeline::Selection Pipeline::SelectAll(const RequestState& rs) const {
  Selection sel;
  sel.kind = Selection::Kind::kAll;
  sel.begin = 0;
  sel.end = rs.n;
  return sel;
}

// ---- loads ------------------------------------------------------------------------------------

// Plans the loads of `kind` chunks of `layer` that `sel` needs into `group` (no submission).
// demand: the layer uses them now (cache accesses, prefetch settlement); otherwise they are a
// prefetch for `layer`, entered in rs.prefetched so the demand pass finds them.
//
// Cost (sim_bench, spec, ~5K reused tokens, ~77 slots, 6 calls per layer): loads of the whole
// prefix (probe keys, kAll) take each slot's rows from the per-request table instead of marking
// and bucketing n tokens; a slot's rows are a span into scratch, copied only into ChunkIo rows
// (chunk_detail) and prefetch entries; a demand access asks the cache once (Access returns the
// tier it found) instead of Where + Access, and for a prefetched chunk reuses the lookup made
// when its prefetch was planned (TieredCache::ChunkRef); prefetched chunks are found by slot,
// not by hash.
// Together (perf samples, sim_bench spec, 100 requests): IssueLoads, the cache's ChunkId hash
// lookups, the prefetch map and malloc/free went from 13.8 to 4.9 ms of CPU per request.
// Shared selections (ITF's voted set, its prediction) are walked in O(k), not marked over n.
void Pipeline::IssueLoads(RequestState& rs, int layer, KvKind kind, const Selection& sel,
                          LoadGroup* group, bool demand) {
  const std::size_t nslots = rs.slots.size();
  const Bytes token_bytes = kind == KvKind::kProbeKey
                                ? Bytes(options_.system.itf_options.probe_heads) * model_.RowBytes()
                                : model_.KBytesPerTokenLayer();
  // Per slot: the union of rows needed (sorted) and the bytes those rows are (per-head sets
  // differ). Scratch buffers are reused across calls.
  thread_local std::vector<std::uint8_t> mark;
  thread_local std::vector<std::uint32_t> count, offset;
  thread_local std::vector<std::uint16_t> flat;
  thread_local std::vector<Bytes> need_bytes;
  const bool whole_prefix =
      kind == KvKind::kProbeKey ||
      (sel.kind == Selection::Kind::kAll && sel.begin == 0 && sel.end == rs.n);
  const std::uint16_t* rows_base;
  if (whole_prefix) {
    // Every R token: the per-request table (already sorted).
    count.resize(nslots);
    need_bytes.resize(nslots);
    for (std::size_t s = 0; s < nslots; ++s) {
      count[s] = rs.all_offset[s + 1] - rs.all_offset[s];
      need_bytes[s] = Bytes(count[s]) * token_bytes;
    }
    offset.assign(rs.all_offset.begin(), rs.all_offset.end());
    rows_base = rs.all_rows.data();
  } else if (sel.kind == Selection::Kind::kShared) {
    // A sorted, unique token set: walking it visits the tokens in the order the marking walk
    // below would, in O(k) instead of O(n).
    // Laid out once per distinct selection: the K and V loads of a layer, and the prefetch of
    // layer l+1 from layer l's set, use the same one (comparing k token ids is far cheaper than
    // the layout: IssueLoads -40% of its samples in sim_bench's spec profile).
    RequestState::SharedLayout& lay = rs.shared_layout;
    if (!lay.valid || lay.tokens != sel.shared) {
      // Checked once per distinct selection (per call it was 2% of a spec run).
      KVTIER_DCHECK(std::adjacent_find(sel.shared.begin(), sel.shared.end(),
                                       std::greater_equal<>()) == sel.shared.end(),
                    "a shared selection is sorted and unique");
      // Consecutive tokens mostly share a slot. Usually the selection meets the slots in
      // increasing order (prefix order; a reordered segment keeps its slots' order, only the
      // rows within a chunk move), so each slot is one run and the rows are written in place
      // in one pass, with the slot's sortedness noted on the way. Otherwise (pieces met out
      // of slot order) the rows are counted, then filled, run-wise, with the current slot's
      // count or write position in a register (consecutive increments of one counter do not
      // wait on each other through memory). (One pass instead of two plus a sortedness scan:
      // the layout was 40% of IssueLoads in sim_bench's spec profile.)
      constexpr std::uint32_t kNone = 0xFFFFFFFFu;
      lay.count.assign(nslots, 0);
      lay.offset.resize(nslots + 1);
      lay.rows.resize(sel.shared.size());
      bool in_order = true, rows_sorted = true;
      {
        std::uint32_t cur = kNone, pos = 0, begin = 0;
        std::uint16_t prev_row = 0;
        for (std::int32_t t : sel.shared) {
          const std::uint32_t s = rs.slot_of[std::size_t(t)];
          const std::uint16_t row = rs.row_of[std::size_t(t)];
          if (s != cur) {
            if (cur != kNone) {
              if (s < cur) {
                in_order = false;
                break;
              }
              lay.count[cur] = pos - begin;
            }
            cur = s;
            begin = pos;
          } else {
            rows_sorted &= prev_row < row;
          }
          prev_row = row;
          lay.rows[pos++] = row;
        }
        if (in_order && cur != kNone) lay.count[cur] = pos - begin;
      }
      if (in_order) {
        lay.offset[0] = 0;
        for (std::size_t s = 0; s < nslots; ++s) lay.offset[s + 1] = lay.offset[s] + lay.count[s];
      } else {
        std::fill(lay.count.begin(), lay.count.end(), 0);
        std::uint32_t cur = kNone, run = 0;
        for (std::int32_t t : sel.shared) {
          const std::uint32_t s = rs.slot_of[std::size_t(t)];
          if (s != cur) {
            if (cur != kNone) lay.count[cur] += run;
            cur = s;
            run = 0;
          }
          ++run;
        }
        if (cur != kNone) lay.count[cur] += run;
        lay.offset[0] = 0;
        for (std::size_t s = 0; s < nslots; ++s) lay.offset[s + 1] = lay.offset[s] + lay.count[s];
        std::fill(lay.count.begin(), lay.count.end(), 0);
        cur = kNone;
        std::uint32_t pos = 0;
        for (std::int32_t t : sel.shared) {
          const std::uint32_t s = rs.slot_of[std::size_t(t)];
          if (s != cur) {
            if (cur != kNone) lay.count[cur] = pos - lay.offset[cur];
            cur = s;
            pos = lay.offset[s] + lay.count[s];
          }
          lay.rows[pos++] = rs.row_of[std::size_t(t)];
        }
        if (cur != kNone) lay.count[cur] = pos - lay.offset[cur];
        rows_sorted = false;  // not tracked on this path: check every slot
      }
      if (!rows_sorted) {
        for (std::size_t s = 0; s < nslots; ++s) {
          auto b = lay.rows.begin() + lay.offset[s], e = b + lay.count[s];
          SortChunkRows(std::to_address(b), std::to_address(e));
        }
      }
      lay.tokens = sel.shared;
      lay.valid = true;
    }
    count.assign(lay.count.begin(), lay.count.end());
    offset.assign(lay.offset.begin(), lay.offset.end());
    need_bytes.resize(nslots);
    for (std::size_t s = 0; s < nslots; ++s) need_bytes[s] = Bytes(count[s]) * token_bytes;
    rows_base = lay.rows.data();
  } else {
    // Tokens are marked first and then walked in prefix order, which yields each slot's rows
    // already sorted unless its segment was reordered.
    mark.assign(std::size_t(rs.n), 0);
    count.assign(nslots, 0);
    need_bytes.assign(nslots, 0);
    std::int64_t lo = 0, hi = rs.n;
    if (sel.kind == Selection::Kind::kAll) {
      lo = sel.begin, hi = sel.end;
      std::fill(mark.begin() + lo, mark.begin() + hi, 1);
      for (std::int64_t t = lo; t < hi; ++t) need_bytes[rs.slot_of[std::size_t(t)]] += token_bytes;
    } else {
      const Bytes row = model_.RowBytes();
      for (const TokenSet& head : sel.per_head) {
        for (std::int32_t t : head) {
          mark[std::size_t(t)] = 1;
          need_bytes[rs.slot_of[std::size_t(t)]] += row;
        }
      }
    }
    for (std::int64_t t = lo; t < hi; ++t) {
      if (mark[std::size_t(t)]) ++count[rs.slot_of[std::size_t(t)]];
    }
    offset.resize(nslots + 1);
    offset[0] = 0;
    for (std::size_t s = 0; s < nslots; ++s) offset[s + 1] = offset[s] + count[s];
    flat.resize(offset[nslots]);
    std::fill(count.begin(), count.end(), 0);
    for (std::int64_t t = lo; t < hi; ++t) {
      if (!mark[std::size_t(t)]) continue;
      const std::uint32_t s = rs.slot_of[std::size_t(t)];
      flat[offset[s] + count[s]++] = rs.row_of[std::size_t(t)];
    }
    for (std::size_t s = 0; s < nslots; ++s) {
      auto b = flat.begin() + offset[s], e = b + count[s];
      SortChunkRows(std::to_address(b), std::to_address(e));
    }
    rows_base = flat.data();
  }

  thread_local std::vector<CacheMove> moves;
  thread_local std::vector<std::uint16_t> missing_rows;
  const bool detail = options_.chunk_detail;
  auto to_vector = [](std::span<const std::uint16_t> r) {
    return std::vector<std::uint16_t>(r.begin(), r.end());
  };
  for (std::size_t s = 0; s < nslots; ++s) {
    if (count[s] == 0) continue;
    const std::span<const std::uint16_t> r(rows_base + offset[s], count[s]);
    const auto& slot = rs.slots[s];
    const ChunkId id = ChunkId::Make(slot.segment, kind, std::uint32_t(layer), slot.chunk);
    const Bytes chunk_bytes = Bytes(slot.tokens) * token_bytes;  // ChunkBytes(), no segment lookup
    const bool whole = int(r.size()) == slot.tokens;
    const bool partial = !whole;
    const Bytes move_bytes = need_bytes[s];
    Source source;
    const PrefetchTable::Entry* pre = nullptr;
    if (demand) {
      const PrefetchTable::Entry& e = rs.current.At(kind, s);
      if (e.valid) pre = &e;
    }
    // Demand: one cache access per use (SPEC §IV-D2); where the chunk was decides the source.
    // Its moves become background transfers below.
    Tier tier = Tier::kSsd;
    if (demand) {
      const double ratio = double(r.size()) / double(std::max(1, slot.tokens));
      moves.clear();
      tier = pre != nullptr ? cache_->Access(id, chunk_bytes, std::min(1.0, ratio), &moves, pre->ref)
                            : cache_->Access(id, chunk_bytes, std::min(1.0, ratio), &moves);
    } else {
      TieredCache::ChunkRef& ref = rs.prefetched.At(kind, s).ref;
      tier = cache_->Where(id, &ref);
      // Planned as a GPU or CPU hit: no concurrent request may evict it before the use.
      if (rs.holder >= 0 && tier != Tier::kSsd) cache_->Pin(ref);
    }
    if (pre != nullptr) {
      source = Source::kPrefetched;
      ++group->prefetch_used;
      // A prefetched chunk still counts where its data came from.
      if (pre->source == Source::kGpuHit) ++group->gpu_hits;
      if (pre->source == Source::kCpu) ++group->cpu_hits;
      if (pre->op != kNoOp) group->prefetch_deps.push_back(pre->op);
      if (!pre->all_rows && pre->source != Source::kGpuHit) {
        missing_rows.clear();
        const std::size_t missing =
            Missing(r, rs.current.RowsOf(*pre), detail ? &missing_rows : nullptr);
        if (missing > 0) {
          const Bytes extra = need_bytes[s] * Bytes(missing) / Bytes(r.size());
          group->h2d_from_cpu.bytes += extra;
          ++group->h2d_from_cpu.ios;
          if (detail) group->h2d_from_cpu.chunks.push_back({id, extra, missing_rows});
        }
      }
    } else if (tier == Tier::kGpu) {
      source = Source::kGpuHit;
      if (demand) ++group->gpu_hits;
    } else if (tier == Tier::kCpu) {
      source = Source::kCpu;
      if (demand) ++group->cpu_hits;
      group->h2d_from_cpu.bytes += move_bytes;
      ++group->h2d_from_cpu.ios;
      if (detail) group->h2d_from_cpu.chunks.push_back({id, move_bytes, to_vector(r)});
    } else {
      source = Source::kSsd;
      ++group->ssd_reads;
      group->ssd_read.bytes += chunk_bytes;
      ++group->ssd_read.ios;
      if (detail) group->ssd_read.chunks.push_back({id, chunk_bytes, {}});
      if (partial) {
        group->gather.bytes += move_bytes;
        ++group->gather.ios;
        if (detail) group->gather.chunks.push_back({id, move_bytes, to_vector(r)});
      }
      group->h2d_from_ssd.bytes += move_bytes;
      ++group->h2d_from_ssd.ios;
      if (detail) group->h2d_from_ssd.chunks.push_back({id, move_bytes, to_vector(r)});
    }

    if (!demand) {
      PrefetchTable::Entry& e = rs.prefetched.At(kind, s);
      if (!e.valid) ++rs.prefetched.size;
      e.valid = true;
      e.source = source;
      e.op = kNoOp;  // set once the group is submitted
      e.all_rows = whole;
      e.row_begin = std::uint32_t(rs.prefetched.rows.size());
      e.row_count = std::uint32_t(r.size());
      rs.prefetched.rows.insert(rs.prefetched.rows.end(), r.begin(), r.end());
      group->fetched.push_back(std::uint32_t(s));
      continue;
    }
    for (const CacheMove& m : moves) {
      if (m.to == Tier::kGpu) {
        executor_->OnResident(Tier::kGpu, m.chunk);
        if (m.from == Tier::kCpu) executor_->OnEvicted(Tier::kCpu, m.chunk);
        const Bytes rest = m.chunk == id && m.bytes > move_bytes ? m.bytes - move_bytes
                           : m.chunk == id ? 0 : m.bytes;
        group->promote_bytes += rest;
        if (detail && rest > 0) group->promote_chunks.push_back({m.chunk, rest, {}});
      } else if (m.to == Tier::kCpu) {
        executor_->OnResident(Tier::kCpu, m.chunk);
        if (m.from == Tier::kGpu) {
          executor_->OnEvicted(Tier::kGpu, m.chunk);
          group->demote_bytes += m.bytes;
          if (detail) group->demote_chunks.push_back({m.chunk, m.bytes, {}});
        }
      } else {
        executor_->OnEvicted(m.from, m.chunk);
      }
      if (options_.log_chunk_decisions) {
        const char* what = m.from == Tier::kSsd   ? "admit"
                           : m.to == Tier::kSsd   ? "evict"
                           : m.to == Tier::kGpu   ? "promote"
                                                  : "demote";
        log_->LogDecision({rs.req->id, layer, what, m.chunk.value,
                           std::string(TierName(m.from)) + "->" + std::string(TierName(m.to)),
                           false});
      }
    }
  }
}

// Submits a planned group: the SSD read, the CPU gather of partly needed chunks, the two
// CPU->GPU copies, then its cache moves as background transfers (demote first, which frees GPU
// space, then promote the rest of the chunks). `after` orders the group's CPU->GPU copies;
// `after_read`, when given, orders its SSD read instead (so a prefetch read can follow the
// current layer's demand reads on the SSD while its copies follow the demand copies on PCIe).
// The group's SSD read op is left in *read_op. Every schedule's loads go through here.
void Pipeline::SubmitLoads(RequestState& rs, LoadGroup& g, Purpose purpose, int layer,
                           std::vector<OpId> after, const std::vector<OpId>* after_read,
                           OpId* read_op) {
  g.terminal.clear();
  OpId read = kNoOp, gather = kNoOp;
  if (g.ssd_read.bytes > 0) {
    TransferOp op = std::move(g.ssd_read);
    op.kind = TransferKind::kSsdRead;
    op.purpose = purpose;
    op.request = rs.req->id;
    op.layer = layer;
    read = SubmitTransfer(rs, std::move(op), after_read ? *after_read : after, false);
  }
  if (read_op != nullptr) *read_op = read;
  if (g.gather.bytes > 0) {
    TransferOp op = std::move(g.gather);
    op.kind = TransferKind::kCpuGather;
    op.purpose = purpose;
    op.request = rs.req->id;
    op.layer = layer;
    gather = SubmitTransfer(rs, std::move(op), {read}, false);
  }
  if (g.h2d_from_ssd.bytes > 0) {
    TransferOp op = std::move(g.h2d_from_ssd);
    op.kind = TransferKind::kH2D;
    op.purpose = purpose;
    op.request = rs.req->id;
    op.layer = layer;
    g.terminal.push_back(SubmitTransfer(rs, std::move(op), {gather != kNoOp ? gather : read},
                                        false));
  }
  if (g.h2d_from_cpu.bytes > 0) {
    TransferOp op = std::move(g.h2d_from_cpu);
    op.kind = TransferKind::kH2D;
    op.purpose = purpose;
    op.request = rs.req->id;
    op.layer = layer;
    std::vector<OpId> deps = after;
    deps.insert(deps.end(), g.prefetch_deps.begin(), g.prefetch_deps.end());
    g.terminal.push_back(SubmitTransfer(rs, std::move(op), deps, false));
  } else {
    g.terminal.insert(g.terminal.end(), g.prefetch_deps.begin(), g.prefetch_deps.end());
  }
  // Cache moves: demote first (frees GPU space), then promote the rest of the chunks.
  OpId demote = kNoOp;
  if (g.demote_bytes > 0) {
    TransferOp op = MakeTransfer(TransferKind::kD2H, Purpose::kDemote, rs.req->id, layer);
    op.bytes = g.demote_bytes;
    op.chunks = std::move(g.demote_chunks);
    demote = SubmitTransfer(rs, std::move(op), g.terminal, true);
  }
  if (g.promote_bytes > 0) {
    TransferOp op = MakeTransfer(TransferKind::kH2D, Purpose::kPromote, rs.req->id, layer);
    op.bytes = g.promote_bytes;
    op.chunks = std::move(g.promote_chunks);
    std::vector<OpId> deps = g.terminal;
    deps.push_back(demote);
    SubmitTransfer(rs, std::move(op), deps, true);
  }
  rs.rec.gpu_hit_chunks += g.gpu_hits;
  rs.rec.cpu_hit_chunks += g.cpu_hits;
  rs.rec.ssd_read_chunks += g.ssd_reads;
}

// ---- the per-layer driver -----------------------------------------------------------------------

Status Pipeline::RunLayers(RequestState& rs) {
  const SystemOptions& sys = options_.system;
  const int L = model_.layers;
  const std::int64_t newtok = rs.nr + rs.q;
  const int probes = sys.itf_options.probe_heads;
  const std::int64_t k = RetainedTokens(sys.retention, rs.n);
  const bool overlap = sys.prefetch == PrefetchMode::kLayer;
  std::vector<int> probe_heads(static_cast<std::size_t>(probes));
  std::iota(probe_heads.begin(), probe_heads.end(), 0);
  std::vector<int> all_heads(static_cast<std::size_t>(model_.kv_heads));
  std::iota(all_heads.begin(), all_heads.end(), 0);
  std::vector<float> scores;
  OpId prev_compute = kNoOp;

  // Prefetches `kind` chunks of `layer` for `sel` once `after` (the current layer's demand
  // loads) are done: demand has priority over speculation, as the io engine's classes give it
  // on hardware; a fluid simulator would otherwise let them share the SSD and PCIe equally.
  auto prefetch = [&](int layer, KvKind kind, const Selection& sel, Purpose purpose,
                      const std::vector<OpId>& after, std::vector<OpId>* reads) {
    LoadGroup g;
    IssueLoads(rs, layer, kind, sel, &g, /*demand=*/false);
    // Which terminal op brings each source's chunks.
    OpId from_ssd_op = kNoOp, from_cpu_op = kNoOp;
    const bool has_ssd = g.h2d_from_ssd.bytes > 0, has_cpu = g.h2d_from_cpu.bytes > 0;
    OpId read = kNoOp;
    const std::vector<OpId> reads_before = *reads;
    SubmitLoads(rs, g, purpose, layer, after, &reads_before, &read);
    if (read != kNoOp) reads->push_back(read);  // later prefetches queue behind it on the SSD
    const std::vector<OpId> terminal = g.terminal;
    std::size_t next = 0;
    if (has_ssd) from_ssd_op = g.terminal[next++];
    if (has_cpu) from_cpu_op = g.terminal[next++];
    for (std::uint32_t slot : g.fetched) {
      PrefetchTable::Entry& e = rs.prefetched.At(kind, slot);
      e.op = e.source == Source::kSsd ? from_ssd_op : e.source == Source::kCpu ? from_cpu_op : kNoOp;
      if (options_.log_chunk_decisions) {
        const auto& sl = rs.slots[slot];
        const ChunkId id = ChunkId::Make(sl.segment, kind, std::uint32_t(layer), sl.chunk);
        log_->LogDecision({rs.req->id, layer, "prefetch", id.value, "", false});
      }
    }
    return terminal;
  };

  for (int l = 0; l < L; ++l) {
    LayerRecord lr;
    lr.request_id = rs.req->id;
    lr.layer = l;
    std::swap(rs.current, rs.prefetched);
    rs.prefetched.Reset(rs.slots.size());
    lr.prefetched_chunks = rs.current.size;
    std::vector<OpId> gpu_ops;
    std::vector<OpId> deps;  // what the layer's compute waits for
    Selection sel;
    // Without cross-layer overlap a layer's I/O starts only once the previous layer is done.
    std::vector<OpId> io_after;
    if (!overlap) io_after.push_back(prev_compute);

    std::vector<OpId> ssd_reads;  // this layer's SSD reads, in submission order
    auto demand = [&](KvKind kind, const Selection& s, Purpose purpose) {
      LoadGroup g;
      IssueLoads(rs, l, kind, s, &g, /*demand=*/true);
      OpId read = kNoOp;
      SubmitLoads(rs, g, purpose, l, io_after, nullptr, &read);
      if (read != kNoOp) ssd_reads.push_back(read);
      deps.insert(deps.end(), g.terminal.begin(), g.terminal.end());
      lr.loaded_chunks += g.cpu_hits + g.ssd_reads;
      lr.prefetch_used_chunks += g.prefetch_used;
      return g.terminal;
    };

    bool run_h2o = sys.select == SelectPolicy::kH2o && !sys.itf;
    if (sys.itf) {
      ++rs.rec.itf_layers;
      std::vector<OpId> probe_ready = demand(KvKind::kProbeKey, SelectAll(rs), Purpose::kProbe);
      probe_ready.push_back(prev_compute);
      ComputeOp op;
      op.kind = ComputeKind::kProbeScores;
      op.layer = l;
      op.new_tokens = newtok;
      op.context_tokens = rs.n;
      op.heads = probes;
      OpId score = SubmitCompute(rs, op, probe_ready, true);
      gpu_ops.push_back(score);
      deps.push_back(score);
      if (Status st = Wait(rs, score); !st.ok()) return st;
      ItfDecision d = scores_->Itf(*rs.req, l, rs.n, probe_heads, sys.itf_options);
      lr.itf_similarity = d.similarity;
      lr.itf_threshold = d.threshold;
      lr.itf_fallback = d.fallback;
      // The layers row holds the same (itf_similarity, itf_threshold, itf_fallback); the
      // decision row, with its formatted detail, only with the per-chunk decisions.
      if (options_.log_chunk_decisions) {
        log_->LogDecision({rs.req->id, l, "itf", 0,
                           std::string(d.fallback ? "fallback" : "pass") + " s=" +
                               Fixed(d.similarity) + " t=" + Fixed(d.threshold),
                           false});
      }
      if (d.fallback) {
        ++rs.rec.itf_fallback_layers;
        run_h2o = true;
      } else {
        sel.kind = Selection::Kind::kShared;
        sel.shared = std::move(d.voted);
        demand(KvKind::kKey, sel, Purpose::kDemand);
        demand(KvKind::kValue, sel, Purpose::kDemand);
      }
    }
    if (run_h2o) {
      std::vector<OpId> keys = demand(KvKind::kKey, SelectAll(rs), Purpose::kDemand);
      keys.push_back(prev_compute);
      ComputeOp op;
      op.kind = ComputeKind::kFullScores;
      op.layer = l;
      op.new_tokens = newtok;
      op.context_tokens = rs.n;
      op.heads = model_.kv_heads;  // KV heads scored, each with its group of query heads
      OpId score = SubmitCompute(rs, op, keys, true);
      gpu_ops.push_back(score);
      deps.push_back(score);
      if (Status st = Wait(rs, score); !st.ok()) return st;
      scores_->Scores(*rs.req, l, rs.n, all_heads, &scores);
      sel.kind = Selection::Kind::kPerHead;
      sel.per_head = SelectPerHead(scores, model_.kv_heads, rs.n, k);
      demand(KvKind::kValue, sel, Purpose::kDemand);
    } else if (!sys.itf) {
      sel = SelectAll(rs);
      demand(KvKind::kKey, sel, Purpose::kDemand);
      demand(KvKind::kValue, sel, Purpose::kDemand);
    }

    // Layer-aware prefetch for l+1, submitted before layer l's compute (SPEC §IV-C).
    if (overlap && l + 1 < L) {
      const std::vector<OpId> demand_done = deps;
      if (sys.itf) {
        // Probe keys first: they gate layer l+1's ITF decision (io classes probe > prefetch).
        std::vector<OpId> probes_done =
            prefetch(l + 1, KvKind::kProbeKey, SelectAll(rs), Purpose::kProbe, demand_done,
                     &ssd_reads);
        probes_done.insert(probes_done.end(), demand_done.begin(), demand_done.end());
        Selection predicted;
        predicted.kind = Selection::Kind::kShared;
        predicted.shared = PredictNextLayer(sel.shared, sel.per_head);
        prefetch(l + 1, KvKind::kKey, predicted, Purpose::kPrefetch, probes_done, &ssd_reads);
        prefetch(l + 1, KvKind::kValue, predicted, Purpose::kPrefetch, probes_done, &ssd_reads);
      } else if (sys.select == SelectPolicy::kH2o) {
        prefetch(l + 1, KvKind::kKey, SelectAll(rs), Purpose::kPrefetch, demand_done, &ssd_reads);
      } else {
        prefetch(l + 1, KvKind::kKey, SelectAll(rs), Purpose::kPrefetch, demand_done, &ssd_reads);
        prefetch(l + 1, KvKind::kValue, SelectAll(rs), Purpose::kPrefetch, demand_done,
                 &ssd_reads);
      }
    }

    // Importance of each reused token for the reorderer: the share of this layer's kept sets.
    if (sel.kind == Selection::Kind::kShared) {
      for (std::int32_t t : sel.shared) rs.kept_fraction[std::size_t(t)] += 1.0f;
    } else if (sel.kind == Selection::Kind::kPerHead) {
      const float w = 1.0f / float(std::max<std::size_t>(1, sel.per_head.size()));
      for (const auto& head : sel.per_head) {
        for (std::int32_t t : head) rs.kept_fraction[std::size_t(t)] += w;
      }
    } else {
      for (auto& f : rs.kept_fraction) f += 1.0f;
    }

    lr.selected_tokens = std::llround(sel.Kept());
    rs.rec.important_tokens += lr.selected_tokens;
    ComputeOp op;
    op.kind = ComputeKind::kLayerPrefill;
    op.layer = l;
    op.new_tokens = newtok;
    op.context_tokens = std::llround(sel.Kept()) + newtok;
    deps.push_back(prev_compute);
    prev_compute = SubmitCompute(rs, op, deps, true);
    gpu_ops.push_back(prev_compute);
    rs.layer_compute[std::size_t(l)] = prev_compute;
    rs.layer_gpu_ops[std::size_t(l)] = gpu_ops;
    rs.layers.push_back(lr);
  }
  return Status::OK();
}

// ---- Cake ---------------------------------------------------------------------------------------

void Pipeline::AbandonForeground(RequestState& rs, const std::vector<OpId>& ops) {
  // The request no longer waits for these transfers (and their dependencies): they finish in
  // the background and are logged then.
  for (OpId op : ops) {
    for (auto it = rs.ops.begin(); it != rs.ops.end(); ++it) {
      if (it->op == op && it->is_transfer) {
        background_.push_back({op, it->transfer});
        rs.ops.erase(it);
        break;
      }
    }
  }
  // Their upstream reads: any foreground transfer not yet done that only they depended on is
  // moved too, so the request's end does not wait for abandoned work.
  for (auto it = rs.ops.begin(); it != rs.ops.end();) {
    if (it->is_transfer && it->transfer.purpose == Purpose::kCakeLoad && !executor_->Done(it->op)) {
      background_.push_back({it->op, it->transfer});
      it = rs.ops.erase(it);
    } else {
      ++it;
    }
  }
}

Status Pipeline::RunCake(RequestState& rs) {
  const SystemOptions& sys = options_.system;
  const std::int64_t C = sys.cake_chunk_tokens;
  const std::int64_t m = (rs.n + C - 1) / C;
  std::int64_t compute_next = 0;  // chunks [0, compute_next) computed or being computed
  OpId comp = kNoOp;
  std::vector<OpId> loading;
  OpId last_compute = kNoOp;
  std::int64_t computed_chunks = 0, loaded_chunks = 0;

  auto load_chunk = [&](std::int64_t c) {
    Selection sel;
    sel.kind = Selection::Kind::kAll;
    sel.begin = c * C;
    sel.end = std::min(rs.n, (c + 1) * C);
    LoadGroup g;
    for (int l = 0; l < model_.layers; ++l) {
      IssueLoads(rs, l, KvKind::kKey, sel, &g, /*demand=*/true);
      IssueLoads(rs, l, KvKind::kValue, sel, &g, /*demand=*/true);
    }
    // The one submission path: a chunk fully on the GPU needs nothing.
    SubmitLoads(rs, g, Purpose::kCakeLoad, -1, {}, nullptr, nullptr);
    std::vector<OpId> terminal = std::move(g.terminal);
    return terminal;
  };

  // Cake, Appendix A: the GPU computes chunk compute_ptr unless it is already in memory (a
  // chunk whose load is still in flight is computed, and that load is abandoned); I/O loads
  // chunks back to front until it reaches a chunk the GPU has taken.
  std::int64_t loaded_low = m;  // chunks [loaded_low, m) are loaded
  std::int64_t loading_chunk = -1;
  while (true) {
    if (comp == kNoOp && compute_next < loaded_low) {
      if (compute_next == loading_chunk) {
        AbandonForeground(rs, loading);
        loading.clear();
        loading_chunk = -1;
        --loaded_chunks;
        log_->LogDecision({rs.req->id, -1, "cake_abandon", 0,
                           "chunk " + std::to_string(compute_next), /*timing_dependent=*/true});
      }
      ComputeOp op;
      op.kind = ComputeKind::kChunkPrefill;
      op.new_tokens = std::min(rs.n, (compute_next + 1) * C) - compute_next * C;
      op.context_tokens = std::min(rs.n, (compute_next + 1) * C);
      comp = SubmitCompute(rs, op, {last_compute}, true);
      last_compute = comp;
      ++compute_next;
      ++computed_chunks;
    }
    if (loading_chunk < 0 && loaded_low - 1 >= compute_next) {
      loading_chunk = loaded_low - 1;
      ++loaded_chunks;
      loading = load_chunk(loading_chunk);
      // Where Cake's two sides meet depends on timing: these decisions are timing-dependent.
      log_->LogDecision({rs.req->id, -1, "cake_load", 0,
                         "chunk " + std::to_string(loading_chunk), /*timing_dependent=*/true});
      if (loading.empty()) {  // everything was on the GPU already
        loaded_low = loading_chunk;
        loading_chunk = -1;
        continue;
      }
    }
    if (comp == kNoOp && loading.empty()) break;
    std::vector<OpId> waiting;
    if (comp != kNoOp) waiting.push_back(comp);
    waiting.insert(waiting.end(), loading.begin(), loading.end());
    Status done;
    std::size_t idx = WaitAny(rs, waiting, &done);
    if (!done.ok()) return done;  // Run retires what is in flight and names the failed op
    if (comp != kNoOp && idx == 0) {
      comp = kNoOp;
    } else {
      loading.erase(std::find(loading.begin(), loading.end(), waiting[idx]));
      if (loading.empty()) {
        loaded_low = loading_chunk;
        loading_chunk = -1;
      }
    }
  }
  log_->LogDecision({rs.req->id, -1, "cake_meet", 0,
                     "computed " + std::to_string(computed_chunks) + " loaded " +
                         std::to_string(loaded_chunks) + " of " + std::to_string(m),
                     /*timing_dependent=*/true});
  rs.rec.important_tokens = rs.n * model_.layers;
  // NR and the query, all layers, attending to the whole prefix.
  ComputeOp op;
  op.kind = ComputeKind::kChunkPrefill;
  op.new_tokens = rs.nr + rs.q;
  op.context_tokens = rs.n + rs.nr + rs.q;
  std::vector<OpId> after = {last_compute};
  OpId tail = SubmitCompute(rs, op, after, true);
  rs.layer_compute.assign(std::size_t(model_.layers), kNoOp);
  rs.layer_compute.back() = tail;
  rs.layer_gpu_ops.assign(std::size_t(model_.layers), {});
  return Status::OK();
}

Status Pipeline::RunRecompute(RequestState& rs) {
  OpId prev = kNoOp;
  const std::int64_t all = rs.req->prefix_tokens() + rs.q;
  for (int l = 0; l < model_.layers; ++l) {
    ComputeOp op;
    op.kind = ComputeKind::kLayerPrefill;
    op.layer = l;
    op.new_tokens = all;
    op.context_tokens = all;
    prev = SubmitCompute(rs, op, {prev}, true);
    rs.layer_compute[std::size_t(l)] = prev;
    rs.layer_gpu_ops[std::size_t(l)] = {prev};
    LayerRecord lr;
    lr.request_id = rs.req->id;
    lr.layer = l;
    rs.layers.push_back(lr);
  }
  return Status::OK();
}

// ---- store, reorder, background -----------------------------------------------------------------

void Pipeline::StoreNewPrefix(RequestState& rs, OpId after) {
  const SystemOptions& sys = options_.system;
  if (!sys.reuse || rs.nr <= 0) return;
  std::uint32_t segment = 0;
  if (tree_version_ == rs.tree_version) {
    segment = tree_->Insert(rs.req->prefix, rs.match);
  } else {
    // Concurrent requests changed the tree during this one (their stores, a repack): Insert
    // needs a match of the tree as it is. rs.match stays what this request reused (the
    // reorderer's statistics are about it). Part or all of NR may be stored by now.
    const Match now = tree_->Lookup(rs.req->prefix);
    rs.nr = rs.req->prefix_tokens() - now.reused_tokens;
    segment = tree_->Insert(rs.req->prefix, now);
  }
  ++tree_version_;
  if (segment == 0) return;
  if (!sys.store_new) return;
  const Segment* seg = tree_->FindSegment(segment);
  Bytes bytes = 0;
  std::vector<ChunkIo> chunks;
  const bool probe = sys.itf;
  for (int l = 0; l < model_.layers; ++l) {
    for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kProbeKey}) {
        if (kind == KvKind::kProbeKey && !probe) continue;
        const Bytes b = ChunkBytes(*seg, c, kind);
        bytes += b;
        if (options_.chunk_detail) chunks.push_back({ChunkId::Make(segment, kind, l, c), b, {}});
      }
    }
  }
  const std::uint32_t ios = seg->num_chunks * std::uint32_t(model_.layers) * (probe ? 3 : 2);
  TransferOp d2h = MakeTransfer(TransferKind::kD2H, Purpose::kStore, rs.req->id, -1);
  d2h.bytes = bytes;
  d2h.ios = 1;
  OpId copied = SubmitTransfer(rs, std::move(d2h), {after}, true);
  TransferOp write = MakeTransfer(TransferKind::kSsdWrite, Purpose::kStore, rs.req->id, -1);
  write.bytes = bytes;
  write.ios = ios;
  write.chunks = std::move(chunks);
  SubmitTransfer(rs, std::move(write), {copied}, true);
  log_->LogDecision({rs.req->id, -1, "store", 0,
                     "segment " + std::to_string(segment) + " tokens " + std::to_string(rs.nr),
                     false});
}

void Pipeline::MaybeReorder(RequestId request) {
  const SystemOptions& sys = options_.system;
  if (!sys.reorder) return;
  const Seconds now = executor_->Now();
  if (!reorder_started_) {
    reorder_started_ = true;
    last_reorder_s_ = now;
    return;
  }
  if (now - last_reorder_s_ < sys.reorder_interval) return;
  last_reorder_s_ = now;
  ++totals_.reorder_passes;
  RequestState rs;
  Request dummy;
  dummy.id = request;
  rs.req = &dummy;
  std::vector<CacheMove> moves;
  for (std::uint32_t old_id : reorderer_->Due(*tree_)) {
    // A request in flight reads this segment's chunks (and has them pinned): it stays due and
    // is repacked by a later pass.
    if (SegmentInUse(old_id)) continue;
    const Segment* old = tree_->FindSegment(old_id);
    // The stored kinds: probe keys exist only for systems that store them (StoreNewPrefix).
    std::vector<KvKind> kinds = {KvKind::kKey, KvKind::kValue};
    if (sys.itf) kinds.push_back(KvKind::kProbeKey);
    TransferOp read = MakeTransfer(TransferKind::kSsdRead, Purpose::kReorder, request, -1);
    // Chunks cached in GPU or CPU memory are repacked in place: the new chunk with the same
    // (kind, layer, index) takes over the old one's tier (its access statistics start over).
    struct Slot {
      ChunkId old_id;
      Tier tier;
    };
    std::vector<Slot> cached;
    for (int l = 0; l < model_.layers; ++l) {
      for (std::uint32_t c = 0; c < old->num_chunks; ++c) {
        for (KvKind kind : kinds) {
          const ChunkId id = ChunkId::Make(old_id, kind, l, c);
          const Bytes b = ChunkBytes(*old, c, kind);
          read.bytes += b;
          ++read.ios;
          if (options_.chunk_detail) read.chunks.push_back({id, b, {}});
          const Tier tier = cache_->Where(id);
          if (tier == Tier::kSsd) continue;
          cached.push_back({id, tier});
          moves.clear();
          cache_->Erase(id, &moves);
          for (const CacheMove& m : moves) executor_->OnEvicted(m.from, m.chunk);
        }
      }
    }
    std::vector<float> importance(reorderer_->MeanImportance(old_id).begin(),
                                  reorderer_->MeanImportance(old_id).end());
    const std::uint32_t new_id = tree_->Repack(old_id, importance);
    ++tree_version_;
    const Segment* repacked = tree_->FindSegment(new_id);
    for (const Slot& slot : cached) {
      const std::uint32_t c = slot.old_id.index();
      if (c >= repacked->num_chunks) continue;
      const ChunkId id = ChunkId::Make(new_id, slot.old_id.kind(), slot.old_id.layer(), c);
      moves.clear();
      if (cache_->Insert(id, ChunkBytes(*repacked, c, slot.old_id.kind()), slot.tier, &moves)) {
        executor_->OnResident(slot.tier, id);
      }
      for (const CacheMove& m : moves) {
        if (m.chunk != id && m.from != Tier::kSsd) executor_->OnEvicted(m.from, m.chunk);
      }
    }
    reorderer_->Repacked(old_id, new_id);
    ++totals_.repacked_segments;
    // Background: read the old chunks, write the repacked ones (their ids name the new segment,
    // so executors that store real bytes keep the chunk store consistent with the tree).
    TransferOp write = MakeTransfer(TransferKind::kSsdWrite, Purpose::kReorder, request, -1);
    for (int l = 0; l < model_.layers; ++l) {
      for (std::uint32_t c = 0; c < repacked->num_chunks; ++c) {
        for (KvKind kind : kinds) {
          const Bytes b = ChunkBytes(*repacked, c, kind);
          write.bytes += b;
          ++write.ios;
          if (options_.chunk_detail) {
            write.chunks.push_back({ChunkId::Make(new_id, kind, l, c), b, {}});
          }
        }
      }
    }
    OpId r = SubmitTransfer(rs, std::move(read), {}, true);
    SubmitTransfer(rs, std::move(write), {r}, true);
    log_->LogDecision({request, -1, "reorder", 0,
                       "segment " + std::to_string(old_id) + " -> " + std::to_string(new_id),
                       /*timing_dependent=*/true});
  }
}

bool Pipeline::SegmentInUse(std::uint32_t id) const {
  for (const RequestState* other : in_flight_) {
    for (const MatchPiece& piece : other->match.pieces) {
      if (piece.segment == id) return true;
    }
  }
  return false;
}

Status Pipeline::Wait(RequestState& rs, OpId op) {
  Status st = executor_->Wait(op);
  cache_->SetHolder(rs.holder);
  return st;
}

std::size_t Pipeline::WaitAny(RequestState& rs, std::span<const OpId> ops, Status* status) {
  const std::size_t i = executor_->WaitAny(ops);
  *status = executor_->Wait(ops[i]);  // done: returns at once (executor contract)
  cache_->SetHolder(rs.holder);
  return i;
}

namespace {

// Fills the outcome of a retired transfer into its record: what moved, and how it ended.
// Returns the bytes planned but not moved (0 when it succeeded).
Bytes SettleTransfer(const OpTimes& t, TransferRecord* tr) {
  tr->submit_s = t.submit_s;
  tr->start_s = t.start_s;
  tr->end_s = t.end_s;
  if (t.status.ok()) return 0;
  const Bytes planned = tr->bytes;
  if (t.status.code() == Status::Code::kAborted) {
    tr->outcome = TransferOutcome::kAborted;
    tr->bytes = 0;
    tr->ios = 0;
  } else {
    tr->outcome = TransferOutcome::kFailed;
    tr->bytes = std::min(planned, t.failed_moved_bytes);
  }
  return planned - tr->bytes;
}

// The failure to report for a failed op named `what`: its own failure annotated with it; an
// aborted op's status already names the root.
Status NameFailure(const Status& s, const std::string& what) {
  return s.code() == Status::Code::kAborted ? s : s.Annotate(what);
}

}  // namespace

void Pipeline::RetireBackground(bool wait_all) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < background_.size(); ++i) {
    // Index, not a reference held across the wait: a request running inside it may append.
    if (wait_all) executor_->Wait(background_[i].op);  // the status comes with Retire
    Background& b = background_[i];
    if (wait_all || executor_->Done(b.op)) {
      OpTimes t = executor_->Retire(b.op);
      SettleTransfer(t, &b.record);
      if (!t.status.ok() && background_error_.ok()) {
        const TransferRecord& r = b.record;
        background_error_ =
            NameFailure(t.status, DescribeTransfer(r.kind, r.purpose, r.request_id, r.layer));
      }
      log_->LogTransfer(b.record);
    } else {
      background_[kept++] = std::move(b);
    }
  }
  background_.resize(kept);
}

// ---- Run -----------------------------------------------------------------------------------------

Status Pipeline::Run(const Request& request, bool warmup) {
  KVTIER_CHECK(int(in_flight_.size()) < options_.max_in_flight,
               "Pipeline::Run: more requests in flight than max_in_flight");
  // Background work retired since the last request; a failure found there is reported now,
  // before this request is served (the caller stops the run).
  RetireBackground(false);
  if (!background_error_.ok()) {
    Status failure = std::move(background_error_);
    background_error_ = Status::OK();
    return failure;
  }
  RequestState rs;
  if (options_.max_in_flight > 1) {
    // The lowest free pin slot; released at the end of this call.
    for (int h = 0; h < TieredCache::kMaxHolders; ++h) {
      if ((holders_in_use_ & (1u << h)) == 0) {
        rs.holder = h;
        break;
      }
    }
    KVTIER_CHECK(rs.holder >= 0, "Pipeline::Run: no free pin slot");
    holders_in_use_ |= 1u << rs.holder;
  }
  cache_->SetHolder(rs.holder);
  MaybeReorder(request.id);
  const SystemOptions& sys = options_.system;
  rs.req = &request;
  rs.warmup = warmup;
  rs.rec.request_id = request.id;
  rs.rec.arrival_s = request.arrival_s;
  rs.rec.start_s = executor_->Now();
  rs.rec.prefix_tokens = request.prefix_tokens();
  rs.rec.query_tokens = request.query_tokens;
  rs.rec.warmup = warmup;
  rs.q = request.query_tokens;
  if (tree_->tokens_per_symbol() != request.tokens_per_symbol) {
    KVTIER_CHECK(in_flight_.empty(),
                 "Pipeline::Run: tokens_per_symbol changed while other requests are in flight");
    tree_ = std::make_unique<RadixTree>(request.tokens_per_symbol, sys.chunk_tokens);
    ++tree_version_;
  }
  if (sys.reuse) rs.match = tree_->Lookup(request.prefix);
  rs.tree_version = tree_version_;
  in_flight_.push_back(&rs);
  rs.n = rs.match.reused_tokens;
  rs.nr = request.prefix_tokens() - rs.n;
  rs.rec.reused_tokens = rs.n;
  rs.layer_compute.assign(std::size_t(model_.layers), kNoOp);
  rs.layer_gpu_ops.assign(std::size_t(model_.layers), {});
  rs.kept_fraction.assign(std::size_t(rs.n), 0.0f);

  Status st;
  if (!sys.reuse || rs.n == 0) {
    st = RunRecompute(rs);
  } else {
    BuildChunkMap(rs);
    st = sys.prefetch == PrefetchMode::kCake ? RunCake(rs) : RunLayers(rs);
  }
  OpId last = kNoOp;
  for (auto it = rs.layer_compute.rbegin(); it != rs.layer_compute.rend(); ++it) {
    if (*it != kNoOp) {
      last = *it;
      break;
    }
  }
  OpId output = kNoOp;
  if (st.ok()) {  // after a failure nothing more is submitted
    ComputeOp out;
    out.kind = ComputeKind::kOutputLayer;
    out.new_tokens = 1;
    out.context_tokens = 1;
    output = SubmitCompute(rs, out, {last}, true);
    st = Wait(rs, output);
  }
  rs.rec.end_s = executor_->Now();

  if (st.ok()) {
    StoreNewPrefix(rs, output);
    // Reorderer statistics: share of layers that kept each reused token.
    if (sys.reorder && rs.n > 0) {
      const float inv = 1.0f / float(model_.layers);
      for (auto& f : rs.kept_fraction) f *= inv;
      for (const MatchPiece& piece : rs.match.pieces) {
        const Segment* seg = tree_->FindSegment(piece.segment);
        if (seg == nullptr) continue;
        reorderer_->Record(piece.segment, seg->tokens, piece.segment_begin,
                           std::span<const float>(rs.kept_fraction)
                               .subspan(std::size_t(piece.prefix_begin),
                                        std::size_t(piece.prefix_end - piece.prefix_begin)));
      }
    }
  }

  // Retire the foreground ops: transfers are logged as they happened; GPU busy time gives the
  // exposed I/O. Every op's status is checked: the request's failure is the first op (in
  // submission order) that failed itself, else the first aborted one (its root was not this
  // request's: a background store the executor ordered a read after).
  Seconds gpu_busy = 0;
  struct Span {
    Seconds start_s, end_s;
  };
  std::unordered_map<OpId, Span> times;
  Status own_failure, aborted;
  for (const auto& o : rs.ops) {
    if (!executor_->Done(o.op)) Wait(rs, o.op);
    OpTimes t = executor_->Retire(o.op);
    times[o.op] = {t.start_s, t.end_s};
    if (!t.status.ok()) {
      Status& first = t.status.code() == Status::Code::kAborted ? aborted : own_failure;
      if (first.ok()) {
        first = NameFailure(t.status,
                            o.is_transfer ? DescribeTransfer(o.transfer.kind, o.transfer.purpose,
                                                             o.transfer.request_id, o.layer)
                                          : DescribeCompute(o.compute_kind, rs.req->id, o.layer));
      }
    }
    if (o.is_transfer) {
      TransferRecord tr = o.transfer;
      if (const Bytes lost = SettleTransfer(t, &tr); lost > 0) {
        // The request's byte counts (added at submission) keep only what moved.
        switch (tr.kind) {
          case TransferKind::kSsdRead: rs.rec.ssd_read_bytes -= lost; break;
          case TransferKind::kSsdWrite: rs.rec.ssd_write_bytes -= lost; break;
          case TransferKind::kH2D: rs.rec.pcie_h2d_bytes -= lost; break;
          case TransferKind::kD2H: rs.rec.pcie_d2h_bytes -= lost; break;
          case TransferKind::kCpuGather: break;
        }
      }
      log_->LogTransfer(tr);
    } else if (o.gpu) {
      gpu_busy += t.end_s - t.start_s;
    }
  }
  if (!own_failure.ok()) {
    st = std::move(own_failure);
  } else if (!aborted.ok()) {
    st = std::move(aborted);
  }
  Seconds prev_end = rs.rec.start_s;
  for (LayerRecord& lr : rs.layers) {
    const OpId c = rs.layer_compute[std::size_t(lr.layer)];
    if (c == kNoOp) continue;
    const Span& t = times[c];
    Seconds busy = 0;
    for (OpId g : rs.layer_gpu_ops[std::size_t(lr.layer)]) busy += times[g].end_s - times[g].start_s;
    lr.start_s = t.start_s;
    lr.end_s = t.end_s;
    lr.stall_s = std::max(0.0, (t.end_s - prev_end) - busy);
    prev_end = t.end_s;
    log_->LogLayer(lr);
  }
  rs.rec.ttft_s = rs.rec.end_s - rs.rec.start_s;
  rs.rec.ttft_arrival_s = rs.rec.end_s - rs.rec.arrival_s;
  rs.rec.io_stall_s = std::max(0.0, rs.rec.ttft_s - gpu_busy);
  if (!st.ok()) rs.rec.status = st.ToString();
  log_->LogRequest(rs.rec);
  log_->Flush();

  if (!warmup) {
    ++totals_.requests;
    totals_.gpu_hit_chunks += rs.rec.gpu_hit_chunks;
    totals_.cpu_hit_chunks += rs.rec.cpu_hit_chunks;
    totals_.ssd_read_chunks += rs.rec.ssd_read_chunks;
    totals_.itf_layers += rs.rec.itf_layers;
    totals_.itf_fallback_layers += rs.rec.itf_fallback_layers;
    totals_.ssd_read_bytes += rs.rec.ssd_read_bytes;
    totals_.pcie_h2d_bytes += rs.rec.pcie_h2d_bytes;
    for (const LayerRecord& lr : rs.layers) {
      totals_.prefetched_chunks += lr.prefetched_chunks;
      totals_.prefetch_used_chunks += lr.prefetch_used_chunks;
    }
  }
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), &rs));
  if (rs.holder >= 0) {
    cache_->ReleasePins(rs.holder);
    holders_in_use_ &= ~(1u << rs.holder);
  }
  cache_->SetHolder(-1);
  return st;
}

void Pipeline::Prewarm(const Request& request) {
  const SystemOptions& sys = options_.system;
  if (!sys.reuse) return;
  KVTIER_CHECK(in_flight_.empty(), "Pipeline::Prewarm with requests in flight");
  if (tree_->tokens_per_symbol() != request.tokens_per_symbol) {
    tree_ = std::make_unique<RadixTree>(request.tokens_per_symbol, sys.chunk_tokens);
  }
  Match match = tree_->Lookup(request.prefix);
  std::uint32_t segment = tree_->Insert(request.prefix, match);
  ++tree_version_;
  if (segment == 0) return;
  const Segment* seg = tree_->FindSegment(segment);
  std::vector<CacheMove> moves;
  for (int l = 0; l < model_.layers; ++l) {
    for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
      for (KvKind kind : {KvKind::kProbeKey, KvKind::kKey, KvKind::kValue}) {
        if (kind == KvKind::kProbeKey && !sys.itf) continue;
        const ChunkId id = ChunkId::Make(segment, kind, l, c);
        const Bytes b = ChunkBytes(*seg, c, kind);
        moves.clear();
        if (!cache_->Insert(id, b, Tier::kGpu, &moves)) cache_->Insert(id, b, Tier::kCpu, &moves);
        for (const CacheMove& m : moves) {
          if (m.to != Tier::kSsd) executor_->OnResident(m.to, m.chunk);
          if (m.from != Tier::kSsd) executor_->OnEvicted(m.from, m.chunk);
        }
      }
    }
  }
}

Status Pipeline::Finish() {
  KVTIER_CHECK(in_flight_.empty(), "Pipeline::Finish with requests in flight");
  RetireBackground(true);
  const PipelineTotals& t = totals_;
  const double accesses = double(t.gpu_hit_chunks + t.cpu_hit_chunks + t.ssd_read_chunks);
  log_->LogMetric("requests", double(t.requests));
  log_->LogMetric("gpu_hit_ratio", accesses > 0 ? double(t.gpu_hit_chunks) / accesses : 0);
  log_->LogMetric("cpu_hit_ratio", accesses > 0 ? double(t.cpu_hit_chunks) / accesses : 0);
  log_->LogMetric("itf_fallback_rate",
                  t.itf_layers > 0 ? double(t.itf_fallback_layers) / double(t.itf_layers) : 0);
  log_->LogMetric("prefetch_used_ratio", t.prefetched_chunks > 0
                                             ? double(t.prefetch_used_chunks) /
                                                   double(t.prefetched_chunks)
                                             : 0);
  log_->LogMetric("ssd_read_bytes", double(t.ssd_read_bytes));
  log_->LogMetric("pcie_h2d_bytes", double(t.pcie_h2d_bytes));
  log_->LogMetric("reorder_passes", double(t.reorder_passes));
  log_->LogMetric("repacked_segments", double(t.repacked_segments));
  log_->Flush();
  Status failure = std::move(background_error_);
  background_error_ = Status::OK();
  return failure;
}

}  // namespace kvtier
