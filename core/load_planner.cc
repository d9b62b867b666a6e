#include "core/load_planner.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <unordered_map>

#include "core/check.h"
#include "core/request_run.h"

namespace kvtier {
namespace {

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

// Rows of `needed` not in `have` (both sorted), into *out (replaced); returns how many. Written
// through a pointer into room made once (a push_back per row re-read the thread_local vector),
// and below row 1,024 (any chunk of the usual 16-256 tokens) by testing a bitmap of `have`
// without branches instead of merging (the merge's branches and push_back were ~40% of Plan's
// samples in a warm spec run on the Mooncake trace).
std::size_t Missing(std::span<const std::uint16_t> needed, std::span<const std::uint16_t> have,
                    std::vector<std::uint16_t>* out) {
  out->resize(needed.size());
  std::uint16_t* w = out->data();
  constexpr std::size_t kWords = 16;
  const std::uint16_t top = std::max<std::uint16_t>(needed.empty() ? 0 : needed.back(),
                                                    have.empty() ? 0 : have.back());
  if (top < kWords * 64) {
    std::uint64_t bits[kWords];
    const std::size_t words = std::size_t(top >> 6) + 1;
    std::fill(bits, bits + words, 0);
    for (std::uint16_t h : have) bits[h >> 6] |= std::uint64_t{1} << (h & 63);
    for (std::uint16_t x : needed) {
      *w = x;
      w += ((bits[x >> 6] >> (x & 63)) & 1) ^ 1;
    }
    const std::size_t missing = std::size_t(w - out->data());
    out->resize(missing);
    return missing;
  }
  std::size_t i = 0, j = 0;
  while (i < needed.size()) {
    if (j == have.size() || needed[i] < have[j]) {
      *w++ = needed[i];
      ++i;
    } else if (have[j] < needed[i]) {
      ++j;
    } else {
      ++i;
      ++j;
    }
  }
  const std::size_t missing = std::size_t(w - out->data());
  out->resize(missing);
  return missing;
}

}  // namespace

LoadPlanner::LoadPlanner(RequestRun& run) : run_(run) {}

void LoadPlanner::PrefetchTable::Reset(std::size_t slots) {
  nslots = slots;
  entries.assign(kKinds * slots, Entry{});
  rows.clear();
  size = 0;
}

// ---- chunk map ----------------------------------------------------------------------------------

void LoadPlanner::Map(const Match& match, const RadixTree& tree) {
  shared_layout_.valid = false;  // laid out over the previous map
  const int ct = run_.system().chunk_tokens;
  slot_of_.resize(static_cast<std::size_t>(run_.n));
  row_of_.resize(static_cast<std::size_t>(run_.n));
  std::unordered_map<std::uint64_t, std::uint32_t> slot_index;
  // Consecutive tokens mostly share a chunk: the hash is asked once per run of them.
  std::uint64_t last_key = ~std::uint64_t{0};
  std::uint32_t last_slot = 0;
  for (const MatchPiece& piece : match.pieces) {
    const Segment* seg = tree.FindSegment(piece.segment);
    KVTIER_CHECK(seg != nullptr, "match piece references a live segment");
    for (std::int64_t t = piece.prefix_begin; t < piece.prefix_end; ++t) {
      const std::int64_t offset = piece.segment_begin + (t - piece.prefix_begin);
      const std::uint32_t chunk = seg->ChunkOf(offset, ct);
      const std::uint64_t key = (std::uint64_t{piece.segment} << 32) | chunk;
      if (key != last_key) {
        auto [it, inserted] = slot_index.emplace(key, std::uint32_t(slots_.size()));
        if (inserted) {
          const auto known = std::find(segments_.begin(), segments_.end(), piece.segment);
          const auto index = std::uint32_t(known - segments_.begin());
          if (known == segments_.end()) segments_.push_back(piece.segment);
          slots_.push_back({piece.segment, chunk, seg->TokensInChunk(chunk, ct), index});
        }
        last_key = key;
        last_slot = it->second;
      }
      slot_of_[static_cast<std::size_t>(t)] = last_slot;
      row_of_[static_cast<std::size_t>(t)] = seg->RowOf(offset, ct);
    }
  }
  const std::size_t nslots = slots_.size();
  all_offset_.assign(nslots + 1, 0);
  for (std::int64_t t = 0; t < run_.n; ++t) ++all_offset_[slot_of_[std::size_t(t)] + 1];
  for (std::size_t s = 0; s < nslots; ++s) all_offset_[s + 1] += all_offset_[s];
  all_rows_.resize(std::size_t(run_.n));
  std::vector<std::uint32_t> fill(all_offset_.begin(), all_offset_.end() - 1);
  for (std::int64_t t = 0; t < run_.n; ++t) {
    all_rows_[fill[slot_of_[std::size_t(t)]]++] = row_of_[std::size_t(t)];
  }
  for (std::size_t s = 0; s < nslots; ++s) {
    auto b = all_rows_.begin() + all_offset_[s], e = all_rows_.begin() + all_offset_[s + 1];
    SortChunkRows(std::to_address(b), std::to_address(e));
  }
  prefetched_.Reset(nslots);
  current_.Reset(nslots);
  if (run_.system().reorder) {
    run_.layout_bytes.assign(std::size_t(run_.model().layers) * segments_.size(), 0.0);
  }
}

std::int64_t LoadPlanner::BeginLayer() {
  std::swap(current_, prefetched_);
  prefetched_.Reset(slots_.size());
  return current_.size;
}

// ---- planning ----------------------------------------------------------------------------------

// Lays out a shared selection per slot (counts, offsets, sorted rows), unless the last one
// laid out is the same set: the K and V loads of a layer, and the prefetch of layer l+1 from
// layer l's set, use the same one (comparing k token ids is far cheaper than the layout:
// IssueLoads -40% of its samples in sim_bench's spec profile).
void LoadPlanner::LayOutShared(const TokenSet& tokens) {
  SharedLayout& lay = shared_layout_;
  if (lay.valid && lay.tokens == tokens) return;
  const std::size_t nslots = slots_.size();
  // Checked once per distinct selection (per call it was 2% of a spec run).
  KVTIER_DCHECK(std::adjacent_find(tokens.begin(), tokens.end(),
                                   std::greater_equal<>()) == tokens.end(),
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
  lay.rows.resize(tokens.size());
  bool in_order = true, rows_sorted = true;
  {
    std::uint32_t cur = kNone, pos = 0, begin = 0;
    std::uint16_t prev_row = 0;
    for (std::int32_t t : tokens) {
      const std::uint32_t s = slot_of_[std::size_t(t)];
      const std::uint16_t row = row_of_[std::size_t(t)];
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
    for (std::int32_t t : tokens) {
      const std::uint32_t s = slot_of_[std::size_t(t)];
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
    for (std::int32_t t : tokens) {
      const std::uint32_t s = slot_of_[std::size_t(t)];
      if (s != cur) {
        if (cur != kNone) lay.count[cur] = pos - lay.offset[cur];
        cur = s;
        pos = lay.offset[s] + lay.count[s];
      }
      lay.rows[pos++] = row_of_[std::size_t(t)];
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
  lay.tokens = tokens;
  lay.valid = true;
}

// Plans the loads of `kind` chunks of `layer` that `sel` needs into `group` (no submission).
// demand: the layer uses them now (cache accesses, prefetch settlement); otherwise they are a
// prefetch for `layer`, entered in prefetched_ so the demand pass finds them.
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
void LoadPlanner::Plan(int layer, KvKind kind, const Selection& sel, bool demand, Group* group) {
  const std::size_t nslots = slots_.size();
  const std::int64_t n = run_.n;
  const Bytes token_bytes = run_.layout().TokenBytes(kind);
  TieredCache& cache = run_.cache();
  Executor& executor = run_.executor();
  // Per slot: the union of rows needed (sorted) and the bytes those rows are (per-head sets
  // differ). Scratch buffers are reused across calls.
  thread_local std::vector<std::uint8_t> mark;
  thread_local std::vector<std::uint32_t> count, offset;
  thread_local std::vector<std::uint16_t> flat;
  thread_local std::vector<Bytes> need_bytes;
  const bool whole_prefix =
      kind == KvKind::kProbeKey ||
      (sel.kind == Selection::Kind::kAll && sel.begin == 0 && sel.end == n);
  const std::uint16_t* rows_base;
  if (whole_prefix) {
    // Every R token: the per-request table (already sorted).
    count.resize(nslots);
    need_bytes.resize(nslots);
    for (std::size_t s = 0; s < nslots; ++s) {
      count[s] = all_offset_[s + 1] - all_offset_[s];
      need_bytes[s] = Bytes(count[s]) * token_bytes;
    }
    offset.assign(all_offset_.begin(), all_offset_.end());
    rows_base = all_rows_.data();
  } else if (sel.kind == Selection::Kind::kShared || sel.kind == Selection::Kind::kCounted) {
    // A sorted, unique token set (a counted selection's union is one): walking it visits the
    // tokens in the order the marking walk below would, in O(k) instead of O(n). (The counted
    // form was marked over n: three walks of n per H2O value load, most of
    // LoadPlanner::Plan's 18-23% of a warm H2O run on the Mooncake trace.)
    LayOutShared(sel.shared);
    const SharedLayout& lay = shared_layout_;
    count.assign(lay.count.begin(), lay.count.end());
    offset.assign(lay.offset.begin(), lay.offset.end());
    need_bytes.resize(nslots);
    if (sel.kind == Selection::Kind::kShared) {
      for (std::size_t s = 0; s < nslots; ++s) need_bytes[s] = Bytes(count[s]) * token_bytes;
    } else {
      // One head's row per head keeping the token: the integer sums of the per-head walk,
      // the heads of a run of tokens in one slot summed in a register (an add through memory
      // per token waited on the previous one: half of Plan's samples).
      const Bytes row = run_.model().RowBytes();
      std::fill(need_bytes.begin(), need_bytes.end(), 0);
      std::uint32_t cur = sel.shared.empty() ? 0 : slot_of_[std::size_t(sel.shared[0])];
      Bytes heads = 0;
      for (std::size_t i = 0; i < sel.shared.size(); ++i) {
        const std::uint32_t s = slot_of_[std::size_t(sel.shared[i])];
        if (s != cur) {
          need_bytes[cur] += row * heads;
          cur = s;
          heads = 0;
        }
        heads += sel.counts[i];
      }
      if (!sel.shared.empty()) need_bytes[cur] += row * heads;
    }
    rows_base = lay.rows.data();
  } else {
    // Tokens are marked first and then walked in prefix order, which yields each slot's rows
    // already sorted unless its segment was reordered.
    mark.assign(std::size_t(n), 0);
    count.assign(nslots, 0);
    need_bytes.assign(nslots, 0);
    std::int64_t lo = 0, hi = n;
    if (sel.kind == Selection::Kind::kAll) {
      lo = sel.begin, hi = sel.end;
      std::fill(mark.begin() + lo, mark.begin() + hi, 1);
      for (std::int64_t t = lo; t < hi; ++t) need_bytes[slot_of_[std::size_t(t)]] += token_bytes;
    } else {
      const Bytes row = run_.model().RowBytes();
      for (const TokenSet& head : sel.per_head) {
        for (std::int32_t t : head) {
          mark[std::size_t(t)] = 1;
          need_bytes[slot_of_[std::size_t(t)]] += row;
        }
      }
    }
    for (std::int64_t t = lo; t < hi; ++t) {
      if (mark[std::size_t(t)]) ++count[slot_of_[std::size_t(t)]];
    }
    offset.resize(nslots + 1);
    offset[0] = 0;
    for (std::size_t s = 0; s < nslots; ++s) offset[s + 1] = offset[s] + count[s];
    flat.resize(offset[nslots]);
    std::fill(count.begin(), count.end(), 0);
    for (std::int64_t t = lo; t < hi; ++t) {
      if (!mark[std::size_t(t)]) continue;
      const std::uint32_t s = slot_of_[std::size_t(t)];
      flat[offset[s] + count[s]++] = row_of_[std::size_t(t)];
    }
    for (std::size_t s = 0; s < nslots; ++s) {
      auto b = flat.begin() + offset[s], e = b + count[s];
      SortChunkRows(std::to_address(b), std::to_address(e));
    }
    rows_base = flat.data();
  }

  thread_local std::vector<CacheMove> moves;
  thread_local std::vector<std::uint16_t> missing_rows;
  thread_local std::vector<Extent> extents;
  const bool detail = run_.options().chunk_detail;
  const TransferStrategy strategy = run_.system().transfer_strategy;
  const bool extent_reads = run_.system().ssd_read_unit == SsdReadUnit::kExtent;
  const bool kv_demand = demand && kind != KvKind::kProbeKey;
  // The reorderer's rent: loads that follow the layout (not of the whole prefix), K and V.
  double* layout_bytes = kv_demand && !whole_prefix && !run_.layout_bytes.empty()
                             ? run_.layout_bytes.data() + std::size_t(layer) * segments_.size()
                             : nullptr;
  for (std::size_t s = 0; s < nslots; ++s) {
    if (count[s] == 0) continue;
    run_.kv_chunks += kv_demand;
    const std::span<const std::uint16_t> r(rows_base + offset[s], count[s]);
    const auto& slot = slots_[s];
    const ChunkId id = ChunkId::Make(slot.segment, kind, std::uint32_t(layer), slot.chunk);
    const Bytes chunk_bytes = Bytes(slot.tokens) * token_bytes;  // ChunkBytes(), no segment lookup
    const bool whole = int(r.size()) == slot.tokens;
    const bool partial = !whole;
    const Bytes move_bytes = need_bytes[s];
    Source source;
    const PrefetchTable::Entry* pre = nullptr;
    if (demand) {
      const PrefetchTable::Entry& e = current_.At(kind, s);
      if (e.valid) pre = &e;
    }
    // Demand: one cache access per use (SPEC §IV-D2); where the chunk was decides the source.
    // Its moves become background transfers below.
    Tier tier = Tier::kSsd;
    // The rent's price of this chunk (see the file comment): a whole chunk, read from the SSD
    // or held in memory, unless an extent read says less below.
    Bytes price = chunk_bytes;
    if (demand) {
      const double ratio = double(r.size()) / double(std::max(1, slot.tokens));
      moves.clear();
      tier = pre != nullptr ? cache.Access(id, chunk_bytes, std::min(1.0, ratio), &moves, pre->ref)
                            : cache.Access(id, chunk_bytes, std::min(1.0, ratio), &moves);
    } else {
      TieredCache::ChunkRef& ref = prefetched_.At(kind, s).ref;
      tier = cache.Where(id, &ref);
      // Planned as a GPU or CPU hit: no concurrent request may evict it before the use.
      if (run_.holder() >= 0 && tier != Tier::kSsd) cache.Pin(ref);
    }
    if (pre != nullptr) {
      source = Source::kPrefetched;
      ++group->prefetch_used;
      // A prefetched chunk still counts where its data came from.
      if (pre->source == Source::kGpuHit) ++group->gpu_hits;
      if (pre->source == Source::kCpu) ++group->cpu_hits;
      if (pre->op != kNoOp) group->prefetch_deps.push_back(pre->op);
      if (!pre->all_rows && pre->source != Source::kGpuHit) {
        // Rows the prefetch missed come from CPU memory, moved by the strategy like any
        // CPU-cached rows.
        const std::size_t missing = Missing(r, current_.RowsOf(*pre), &missing_rows);
        if (missing > 0) {
          const Bytes extra = need_bytes[s] * Bytes(missing) / Bytes(r.size());
          AddRows(strategy,
                  {id, kind, missing_rows, CountRuns(missing_rows), extra, chunk_bytes, false},
                  detail, &group->from_cpu);
        }
      }
    } else if (tier == Tier::kGpu) {
      source = Source::kGpuHit;
      if (demand) ++group->gpu_hits;
    } else if (tier == Tier::kCpu) {
      source = Source::kCpu;
      if (demand) ++group->cpu_hits;
      AddRows(strategy, {id, kind, r, whole ? 1 : CountRuns(r), move_bytes, chunk_bytes, whole},
              detail, &group->from_cpu);
    } else {
      source = Source::kSsd;
      ++group->ssd_reads;
      // Extents only for a demand read of a partly needed chunk that this access leaves on
      // the SSD: a chunk the cache admits must be whole in memory, and a prefetched chunk's
      // demand access (which may admit it) comes a layer later.
      bool admitted = false;
      if (extent_reads && demand) {
        for (const CacheMove& m : moves) admitted |= m.chunk == id && m.from == Tier::kSsd;
      }
      if (extent_reads && demand && partial && !admitted) {
        extents.clear();
        const Bytes read = AppendExtents(r, token_bytes, chunk_bytes, &extents);
        // Packing saves of an extent read only what it reads beyond the rows.
        price = read - Bytes(r.size()) * token_bytes;
        group->ssd_read.bytes += read;
        group->ssd_read.ios += std::max<std::uint32_t>(1, std::uint32_t(extents.size()));
        if (detail) group->ssd_read.chunks.push_back({id, read, {}, extents});
      } else {
        group->ssd_read.bytes += chunk_bytes;
        ++group->ssd_read.ios;
        if (detail) group->ssd_read.chunks.push_back({id, chunk_bytes, {}, {}});
        // Every row needed, and the chunk not admitted: any layout reads all of its rows.
        if (extent_reads && demand && !admitted) price = 0;
      }
      AddRows(strategy, {id, kind, r, whole ? 1 : CountRuns(r), move_bytes, chunk_bytes, whole},
              detail, &group->from_ssd);
    }
    if (layout_bytes != nullptr) layout_bytes[slot.segment_index] += double(price);

    if (!demand) {
      PrefetchTable::Entry& e = prefetched_.At(kind, s);
      if (!e.valid) ++prefetched_.size;
      e.valid = true;
      e.source = source;
      e.op = kNoOp;  // set once the group is submitted
      e.all_rows = whole;
      e.row_begin = std::uint32_t(prefetched_.rows.size());
      e.row_count = std::uint32_t(r.size());
      prefetched_.rows.insert(prefetched_.rows.end(), r.begin(), r.end());
      group->fetched.push_back(std::uint32_t(s));
      continue;
    }
    for (const CacheMove& m : moves) {
      if (m.to == Tier::kGpu) {
        executor.OnResident(Tier::kGpu, m.chunk);
        if (m.from == Tier::kCpu) executor.OnEvicted(Tier::kCpu, m.chunk);
        const Bytes rest = m.chunk == id && m.bytes > move_bytes ? m.bytes - move_bytes
                           : m.chunk == id ? 0 : m.bytes;
        group->promote_bytes += rest;
        group->promote_count += rest > 0;
        if (detail && rest > 0) group->promote_chunks.push_back({m.chunk, rest, {}, {}});
      } else if (m.to == Tier::kCpu) {
        executor.OnResident(Tier::kCpu, m.chunk);
        if (m.from == Tier::kGpu) {
          executor.OnEvicted(Tier::kGpu, m.chunk);
          group->demote_bytes += m.bytes;
          group->demote_count += m.bytes > 0;
          if (detail) group->demote_chunks.push_back({m.chunk, m.bytes, {}, {}});
        }
      } else {
        executor.OnEvicted(m.from, m.chunk);
      }
      if (run_.options().log_chunk_decisions) {
        const char* what = m.from == Tier::kSsd   ? "admit"
                           : m.to == Tier::kSsd   ? "evict"
                           : m.to == Tier::kGpu   ? "promote"
                                                  : "demote";
        run_.log().LogDecision({run_.id(), layer, what, m.chunk.value,
                                std::string(TierName(m.from)) + "->" +
                                    std::string(TierName(m.to)),
                                false});
      }
    }
  }
}

// ---- submission ---------------------------------------------------------------------------------

void LoadPlanner::Submit(Group& g, Purpose purpose, int layer, std::vector<OpId> after,
                         const std::vector<OpId>* after_read, OpId* read_op) {
  g.terminal.clear();
  const TransferStrategy strategy = run_.system().transfer_strategy;
  auto submit = [&](TransferOp& from, TransferKind kind, std::vector<OpId> deps) {
    TransferOp op = std::move(from);
    op.kind = kind;
    op.purpose = purpose;
    op.request = run_.id();
    op.layer = layer;
    return run_.SubmitTransfer(std::move(op), std::move(deps), false);
  };
  OpId read = kNoOp;
  if (g.ssd_read.bytes > 0) {
    read = submit(g.ssd_read, TransferKind::kSsdRead, after_read ? *after_read : after);
  }
  if (read_op != nullptr) *read_op = read;
  // Rows just read: gathered (staged_gather) once the read is in, then copied.
  if (!g.from_ssd.empty()) {
    FinishOps(strategy, &g.from_ssd);
    OpId before = read;
    if (g.from_ssd.gather.bytes > 0) {
      before = submit(g.from_ssd.gather, TransferKind::kCpuGather, {read});
    }
    g.terminal.push_back(submit(g.from_ssd.h2d, TransferKind::kH2D, {before}));
  }
  // Rows in CPU memory (and rows a prefetch missed, once the prefetch is in): after `after`.
  if (!g.from_cpu.empty()) {
    FinishOps(strategy, &g.from_cpu);
    std::vector<OpId> deps = after;
    deps.insert(deps.end(), g.prefetch_deps.begin(), g.prefetch_deps.end());
    if (g.from_cpu.gather.bytes > 0) {
      const OpId gather = submit(g.from_cpu.gather, TransferKind::kCpuGather, deps);
      deps.assign(1, gather);
    }
    g.terminal.push_back(submit(g.from_cpu.h2d, TransferKind::kH2D, deps));
  } else {
    g.terminal.insert(g.terminal.end(), g.prefetch_deps.begin(), g.prefetch_deps.end());
  }
  // Cache moves: demote first (frees GPU space), then promote the rest of the chunks.
  OpId demote = kNoOp;
  if (g.demote_bytes > 0) {
    TransferOp op = MakeTransfer(TransferKind::kD2H, Purpose::kDemote, run_.id(), layer);
    op.bytes = g.demote_bytes;
    op.ios = g.demote_count;  // one DMA per chunk, listed or not
    op.chunks = std::move(g.demote_chunks);
    demote = run_.SubmitTransfer(std::move(op), g.terminal, true);
  }
  if (g.promote_bytes > 0) {
    TransferOp op = MakeTransfer(TransferKind::kH2D, Purpose::kPromote, run_.id(), layer);
    op.bytes = g.promote_bytes;
    op.ios = g.promote_count;
    op.chunks = std::move(g.promote_chunks);
    std::vector<OpId> deps = g.terminal;
    deps.push_back(demote);
    run_.SubmitTransfer(std::move(op), deps, true);
  }
  run_.rec.gpu_hit_chunks += g.gpu_hits;
  run_.rec.cpu_hit_chunks += g.cpu_hits;
  run_.rec.ssd_read_chunks += g.ssd_reads;
}

std::vector<OpId> LoadPlanner::Prefetch(int layer, KvKind kind, const Selection& sel,
                                        Purpose purpose, const std::vector<OpId>& after,
                                        std::vector<OpId>* reads) {
  Group g;
  Plan(layer, kind, sel, /*demand=*/false, &g);
  // Which terminal op brings each source's chunks.
  OpId from_ssd_op = kNoOp, from_cpu_op = kNoOp;
  const bool has_ssd = !g.from_ssd.empty(), has_cpu = !g.from_cpu.empty();
  OpId read = kNoOp;
  const std::vector<OpId> reads_before = *reads;
  Submit(g, purpose, layer, after, &reads_before, &read);
  if (read != kNoOp) reads->push_back(read);  // later prefetches queue behind it on the SSD
  std::size_t next = 0;
  if (has_ssd) from_ssd_op = g.terminal[next++];
  if (has_cpu) from_cpu_op = g.terminal[next++];
  for (std::uint32_t slot : g.fetched) {
    PrefetchTable::Entry& e = prefetched_.At(kind, slot);
    e.op = e.source == Source::kSsd ? from_ssd_op : e.source == Source::kCpu ? from_cpu_op : kNoOp;
    if (run_.options().log_chunk_decisions) {
      const Slot& sl = slots_[slot];
      const ChunkId id = ChunkId::Make(sl.segment, kind, std::uint32_t(layer), sl.chunk);
      run_.log().LogDecision({run_.id(), layer, "prefetch", id.value, "", false});
    }
  }
  return std::move(g.terminal);
}

}  // namespace kvtier
