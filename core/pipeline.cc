#include "core/pipeline.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_map>

#include "core/check.h"
#include "core/itf.h"
#include "core/prefetch.h"
#include "core/request_run.h"
#include "core/schedule.h"
#include "core/selector.h"
#include "core/transfer_strategy.h"

namespace kvtier {

// ---- construction ---------------------------------------------------------------------------

Pipeline::Pipeline(const ModelSpec& model, const PipelineOptions& options, Executor* executor,
                   ScoreSource* scores, RunLog* log)
    : model_(model),
      options_(options),
      layout_(StoredLayout::Of(model, options.system)),
      executor_(executor),
      scores_(scores),
      log_(log) {
  const SystemOptions& s = options_.system;
  selector_info_ = &FindSelector(s.select);
  reuses_ = FindSchedule(s.schedule).reuses;
  selector_ = NewSelector(s.select, model_, s);
  schedule_ = NewSchedule(s.schedule, model_, s, selector_.get());
  recompute_ = NewSchedule("recompute", model_, s, nullptr);
  cache_ = std::make_unique<TieredCache>(NewCachePolicy(s.cache_policy, "cache.policy"), s.cache);
  tree_ = std::make_unique<RadixTree>(1, s.chunk_tokens);
  ReordererOptions ro;
  ro.history_weight = s.reorder_history_weight;
  ro.min_accesses = s.reorder_min_accesses;
  ro.chunk_tokens = s.chunk_tokens;
  ro.min_gain = s.reorder_min_gain;
  // A saved chunk of a kept set is one K and one V chunk a layer does not touch.
  ro.saved_chunk_bytes =
      Bytes(s.chunk_tokens) * (layout_.TokenBytes(KvKind::kKey) + layout_.TokenBytes(KvKind::kValue));
  for (KvKind kind : layout_.kinds()) {
    ro.written_bytes_per_token += Bytes(model_.layers) * layout_.TokenBytes(kind);
  }
  reorderer_ = std::make_unique<Reorderer>(ro);
  KVTIER_CHECK(options_.max_in_flight >= 1 && options_.max_in_flight <= TieredCache::kMaxHolders,
               "PipelineOptions::max_in_flight must be in [1, TieredCache::kMaxHolders]");
  if (s.decode.on()) {
    KVTIER_CHECK(options_.max_in_flight == 1, "decode runs with one prefill at a time");
    decode_ = std::make_unique<DecodeEngine>(model_, s.decode, s.transfer_strategy,
                                             reuses_ ? s.cache.gpu_capacity : 0, executor_, log_);
  }
}

Pipeline::~Pipeline() = default;

// ---- store, reorder, background -----------------------------------------------------------------

void Pipeline::StoreNewPrefix(RequestRun& rs, OpId after) {
  const SystemOptions& sys = options_.system;
  if (!reuses_ || rs.nr <= 0) return;
  std::uint32_t segment = 0;
  if (tree_version_ == rs.tree_version) {
    segment = tree_->Insert(rs.request().prefix, rs.match);
  } else {
    // Concurrent requests changed the tree during this one (their stores, a repack): Insert
    // needs a match of the tree as it is. rs.match stays what this request reused (the
    // reorderer's statistics are about it). Part or all of NR may be stored by now.
    const Match now = tree_->Lookup(rs.request().prefix);
    rs.nr = rs.request().prefix_tokens() - now.reused_tokens;
    segment = tree_->Insert(rs.request().prefix, now);
  }
  ++tree_version_;
  if (segment == 0) return;
  if (!sys.store_new) return;
  const Segment* seg = tree_->FindSegment(segment);
  // Every layer stores the same chunks: their sizes are looked up once (a search of the
  // segment's packs each), not once per layer (2-4% of a warm H2O run on the Mooncake trace).
  std::vector<Bytes> chunk_bytes;
  chunk_bytes.reserve(std::size_t(seg->num_chunks) * layout_.kinds().size());
  Bytes layer_bytes = 0;
  for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
    for (KvKind kind : layout_.kinds()) {
      chunk_bytes.push_back(layout_.ChunkBytes(*seg, c, kind));
      layer_bytes += chunk_bytes.back();
    }
  }
  const Bytes bytes = layer_bytes * Bytes(model_.layers);
  std::vector<ChunkIo> chunks;
  if (options_.chunk_detail) {
    chunks.reserve(chunk_bytes.size() * std::size_t(model_.layers));
    for (int l = 0; l < model_.layers; ++l) {
      std::size_t i = 0;
      for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
        for (KvKind kind : layout_.kinds()) {
          chunks.push_back({ChunkId::Make(segment, kind, l, c), chunk_bytes[i++], {}, {}});
        }
      }
    }
  }
  const std::uint32_t ios =
      seg->num_chunks * std::uint32_t(model_.layers) * std::uint32_t(layout_.kinds().size());
  TransferOp d2h = MakeTransfer(TransferKind::kD2H, Purpose::kStore, rs.id(), -1);
  d2h.bytes = bytes;
  d2h.ios = 1;
  OpId copied = rs.SubmitTransfer(std::move(d2h), {after}, true);
  TransferOp write = MakeTransfer(TransferKind::kSsdWrite, Purpose::kStore, rs.id(), -1);
  write.bytes = bytes;
  write.ios = ios;
  write.chunks = std::move(chunks);
  rs.SubmitTransfer(std::move(write), {copied}, true);
  log_->LogDecision({rs.id(), -1, "store", 0,
                     "segment " + std::to_string(segment) + " tokens " + std::to_string(rs.nr),
                     false});
}

// What the model's attention over R observed once the query was computed: per layer, the
// tokens each KV head's top-k (k = ceil(select.retention * n)) keeps, as H2O would keep them,
// from the ScoreSource (the trace in replay; hw replays the same trace). Replaces the
// request's kept fractions.
void Pipeline::ObserveImportance(RequestRun& rs) {
  const std::int64_t k = RetainedTokens(options_.system.retention, rs.n);
  std::vector<int> heads(static_cast<std::size_t>(model_.kv_heads));
  std::iota(heads.begin(), heads.end(), 0);
  std::fill(rs.kept_fraction.begin(), rs.kept_fraction.end(), 0.0f);
  rs.kept_sets.clear();
  // H2O's selection exactly (ScoreSource::TopKPerHead: the heads' union and per-token head
  // counts, which AddKept() reads as it reads the per-head sets), so an H2O selection memo
  // answers it.
  for (int l = 0; l < model_.layers; ++l) {
    rs.AddKept(scores_->TopKPerHead(rs.request(), l, rs.n, heads, k));
  }
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
  Request dummy;
  dummy.id = request;
  RequestRun rs(*this, dummy, /*warmup=*/false, /*holder=*/-1);  // submits background work
  // With reorder.from_memory a segment the caches do not hold whole is never due: its repack
  // would read the SSD (it stays a candidate, and is due once a pass finds it held).
  const auto cost = [this, &sys](std::uint32_t id) {
    double reads = 0;
    const double bytes = RepackSsdBytes(id, &reads);
    return sys.reorder_from_memory && reads > 0 ? std::numeric_limits<double>::infinity() : bytes;
  };
  for (std::uint32_t old_id : reorderer_->Due(*tree_, cost)) {
    // A request in flight reads this segment's chunks (and has them pinned): it stays due and
    // is repacked by a later pass.
    if (SegmentInUse(old_id)) continue;
    RepackSegment(rs, request, old_id);
  }
}

double Pipeline::RepackSsdBytes(std::uint32_t id, double* reads) const {
  const Segment* seg = tree_->FindSegment(id);
  KVTIER_CHECK(seg != nullptr, "RepackSsdBytes: unknown segment");
  double bytes = 0, read = 0;
  for (int l = 0; l < model_.layers; ++l) {
    for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
      for (KvKind kind : layout_.kinds()) {
        // Written back repacked (the same tokens: the same bytes), read if no cache holds it.
        const double b = double(layout_.ChunkBytes(*seg, c, kind));
        bytes += b;
        if (cache_->Where(ChunkId::Make(id, kind, std::uint32_t(l), c)) == Tier::kSsd) read += b;
      }
    }
  }
  if (reads != nullptr) *reads = read;
  return bytes + read;
}

// A repack (SPEC §IV-D1) of segment old_id, as background work:
//   1. the old chunks: those no cache holds are read from the SSD; those the GPU holds are
//      copied to host memory (one DMA each, as demotions); those the CPU holds are there;
//      every old chunk leaves the caches, its statistics kept for step 3;
//   2. the tree replaces the segment by its repacked copy (RadixTree::Repack);
//   3. every new chunk inherits the cache statistics of the old chunks its rows come from
//      (InheritStats, core/cache_policy.h: weighted by rows), and the new chunks of each
//      (layer, kind) take over the GPU and then the CPU room the old ones held, most likely
//      touched first (1 - prod(1 - p) over their tokens' mean importance p), as far as it goes;
//   4. a CPU gather lays the rows out in the new order (one memcpy per run of rows that were
//      consecutive in one old chunk); the new chunks placed in the GPU are copied there as the
//      transfer strategy moves whole chunks from host memory (core/transfer_strategy.h:
//      staged_gather's gather is the assembly gather of those chunks, its H2D one DMA per
//      kind); the whole repacked segment is written to the SSD.
// So a segment the caches hold is repacked without reading the SSD, and its chunks keep their
// standing in the caches instead of restarting at zero. Executors charge (sim) or issue (hw)
// exactly these ops; chunk lists name the old chunks read, copied and gathered from (a gather
// lists one entry per run, in the new order) and the new chunks copied and written.
void Pipeline::RepackSegment(RequestRun& rs, RequestId request, std::uint32_t old_id) {
  const SystemOptions& sys = options_.system;
  const int ct = sys.chunk_tokens;
  const bool detail = options_.chunk_detail;
  const std::span<const KvKind> kinds = layout_.kinds();
  const std::size_t nk = kinds.size();
  const std::size_t layers = std::size_t(model_.layers);
  const Segment old = *tree_->FindSegment(old_id);  // a copy: Repack drops the segment
  const std::uint32_t old_chunks = old.num_chunks;
  const Reorderer::Evidence evidence = reorderer_->EvidenceOf(old_id);
  const double cost = RepackSsdBytes(old_id);

  // 1. The old chunks, before they leave the caches.
  struct OldChunk {
    bool has_stats = false;
    ChunkStats stats;
  };
  std::vector<OldChunk> olds(layers * nk * old_chunks);
  std::vector<Bytes> gpu_room(layers * nk, 0), cpu_room(layers * nk, 0);
  TransferOp read = MakeTransfer(TransferKind::kSsdRead, Purpose::kReorder, request, -1);
  TransferOp d2h = MakeTransfer(TransferKind::kD2H, Purpose::kReorder, request, -1);
  std::vector<CacheMove> moves;
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::uint32_t c = 0; c < old_chunks; ++c) {
      for (std::size_t k = 0; k < nk; ++k) {
        const ChunkId id = ChunkId::Make(old_id, kinds[k], std::uint32_t(l), c);
        const Bytes b = layout_.ChunkBytes(old, c, kinds[k]);
        OldChunk& o = olds[(l * nk + k) * old_chunks + c];
        if (const std::optional<ChunkStats> st = cache_->Stats(id)) {
          o.has_stats = true;
          o.stats = *st;
        }
        switch (cache_->Where(id)) {
          case Tier::kSsd:
            read.bytes += b;
            ++read.ios;
            if (detail) read.chunks.push_back({id, b, {}, {}});
            ++totals_.repack_chunks_from_ssd;
            break;
          case Tier::kGpu:
            d2h.bytes += b;
            ++d2h.ios;
            if (detail) d2h.chunks.push_back({id, b, {}, {}});
            gpu_room[l * nk + k] += b;
            ++totals_.repack_chunks_from_memory;
            break;
          case Tier::kCpu:
            cpu_room[l * nk + k] += b;
            ++totals_.repack_chunks_from_memory;
            break;
        }
        moves.clear();
        cache_->Erase(id, &moves);
        for (const CacheMove& m : moves) executor_->OnEvicted(m.from, m.chunk);
      }
    }
  }

  // 2. The repacked segment.
  const std::span<const float> mean = reorderer_->MeanImportance(old_id);
  const std::vector<float> importance(mean.begin(), mean.end());
  const std::uint32_t new_id = tree_->Repack(old_id, importance);
  ++tree_version_;
  reorderer_->Repacked(old_id, new_id);
  ++totals_.repacked_segments;
  const Segment& seg = *tree_->FindSegment(new_id);
  const std::uint32_t new_chunks = seg.num_chunks;

  // Where each stored row of the new layout comes from, and the runs: maximal sequences of new
  // rows taken from consecutive rows of one old chunk (one memcpy each). The layout is the same
  // in every (layer, kind).
  struct Run {
    std::uint32_t from;  // old chunk
    std::uint16_t row;   // its first row there
    std::uint16_t rows;
  };
  std::vector<std::uint32_t> src_chunk(std::size_t(new_chunks) * std::size_t(ct), ~0u);
  std::vector<std::uint16_t> src_row(src_chunk.size(), 0);
  std::vector<double> miss(new_chunks, 1.0);  // per new chunk: prod (1 - p) of its tokens
  for (std::int64_t o = 0; o < seg.tokens; ++o) {
    const std::uint32_t c = seg.ChunkOf(o, ct);
    const std::size_t pos = std::size_t(c) * std::size_t(ct) + seg.RowOf(o, ct);
    src_chunk[pos] = old.ChunkOf(o, ct);
    src_row[pos] = old.RowOf(o, ct);
    miss[c] *= 1.0 - std::clamp(double(importance[std::size_t(o)]), 0.0, 1.0);
  }
  std::vector<Run> runs;
  std::vector<std::uint32_t> run_begin(new_chunks + 1, 0);
  // Per new chunk, the rows each old chunk gave (for the statistics it inherits).
  std::vector<std::vector<std::pair<std::uint32_t, std::int64_t>>> given(new_chunks);
  for (std::uint32_t c = 0; c < new_chunks; ++c) {
    run_begin[c] = std::uint32_t(runs.size());
    const int rows = seg.TokensInChunk(c, ct);
    for (int r = 0; r < rows; ++r) {
      const std::size_t pos = std::size_t(c) * std::size_t(ct) + std::size_t(r);
      const std::uint32_t from = src_chunk[pos];
      KVTIER_DCHECK(from != ~0u, "a repacked row with no source");
      if (!runs.empty() && r > 0 && runs.back().from == from &&
          runs.back().row + runs.back().rows == src_row[pos]) {
        ++runs.back().rows;
      } else {
        runs.push_back({from, src_row[pos], 1});
      }
      auto g = std::find_if(given[c].begin(), given[c].end(),
                            [&](const auto& e) { return e.first == from; });
      if (g == given[c].end()) {
        given[c].emplace_back(from, 1);
      } else {
        ++g->second;
      }
    }
  }
  run_begin[new_chunks] = std::uint32_t(runs.size());
  // Placement order: most likely touched by a layer first, then by index.
  std::vector<std::uint32_t> order(new_chunks);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return miss[a] < miss[b]; });

  // 3. Statistics and placement of the new chunks.
  std::vector<std::uint8_t> on_gpu(layers * nk * new_chunks, 0);
  std::vector<StatsShare> shares;
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < nk; ++k) {
      for (std::uint32_t c = 0; c < new_chunks; ++c) {
        shares.clear();
        for (const auto& [from, rows] : given[c]) {
          const OldChunk& o = olds[(l * nk + k) * old_chunks + from];
          shares.push_back({o.has_stats ? &o.stats : nullptr, rows});
        }
        ChunkStats inherited;
        if (InheritStats(shares, &inherited)) {
          cache_->Inherit(ChunkId::Make(new_id, kinds[k], std::uint32_t(l), c),
                          layout_.ChunkBytes(seg, c, kinds[k]), inherited);
        }
      }
      Bytes room[2] = {gpu_room[l * nk + k], cpu_room[l * nk + k]};
      for (std::uint32_t c : order) {
        const ChunkId id = ChunkId::Make(new_id, kinds[k], std::uint32_t(l), c);
        const Bytes b = layout_.ChunkBytes(seg, c, kinds[k]);
        for (int t = 0; t < 2; ++t) {
          const Tier tier = t == 0 ? Tier::kGpu : Tier::kCpu;
          // Only into room the old chunks left (and that is free): nothing else is evicted.
          if (b > room[t] || cache_->used(tier) + b > cache_->capacity(tier)) continue;
          moves.clear();
          const bool placed = cache_->Insert(id, b, tier, &moves);
          KVTIER_DCHECK(placed && moves.size() == 1, "a repacked chunk placed into free room");
          if (!placed) continue;
          executor_->OnResident(tier, id);
          room[t] -= b;
          if (tier == Tier::kGpu) on_gpu[(l * nk + k) * new_chunks + c] = 1;
          break;
        }
      }
    }
  }

  // 4. The ops: the gathers into the new layout (under staged_gather, the chunks bound for the
  // GPU in a gather of their own, which their staged H2D copies), the H2D, the SSD write.
  const TransferStrategy strategy = sys.transfer_strategy;
  const bool staged = strategy == TransferStrategy::kStagedGather;
  TransferOp gather_gpu = MakeTransfer(TransferKind::kCpuGather, Purpose::kReorder, request, -1);
  TransferOp gather_rest = MakeTransfer(TransferKind::kCpuGather, Purpose::kReorder, request, -1);
  TransferOp write = MakeTransfer(TransferKind::kSsdWrite, Purpose::kReorder, request, -1);
  RowOps to_gpu;
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::uint32_t c = 0; c < new_chunks; ++c) {
      for (std::size_t k = 0; k < nk; ++k) {
        const KvKind kind = kinds[k];
        const ChunkId id = ChunkId::Make(new_id, kind, std::uint32_t(l), c);
        const Bytes b = layout_.ChunkBytes(seg, c, kind);
        const bool gpu = on_gpu[(l * nk + k) * new_chunks + c] != 0;
        TransferOp& gather = staged && gpu ? gather_gpu : gather_rest;
        gather.bytes += b;
        gather.ios += run_begin[c + 1] - run_begin[c];
        if (detail) {
          for (std::uint32_t i = run_begin[c]; i < run_begin[c + 1]; ++i) {
            const Run& run = runs[i];
            std::vector<std::uint16_t> rows(run.rows);
            std::iota(rows.begin(), rows.end(), run.row);
            gather.chunks.push_back({ChunkId::Make(old_id, kind, std::uint32_t(l), run.from),
                                     Bytes(run.rows) * layout_.TokenBytes(kind), std::move(rows),
                                     {}});
          }
        }
        if (gpu) AddRows(strategy, {id, kind, {}, 1, b, b, true}, detail, &to_gpu);
        write.bytes += b;
        ++write.ios;
        if (detail) write.chunks.push_back({id, b, {}, {}});
      }
    }
  }
  const OpId r = read.bytes > 0 ? rs.SubmitTransfer(std::move(read), {}, true) : kNoOp;
  const OpId d = d2h.bytes > 0 ? rs.SubmitTransfer(std::move(d2h), {}, true) : kNoOp;
  // The copy to the GPU follows the gather that laid its chunks out: under staged_gather the
  // gather of the GPU-bound chunks (it is the strategy's gather, not a second one), else the
  // one gather of every new chunk.
  auto copy_to_gpu = [&](OpId after) {
    FinishOps(strategy, &to_gpu);
    TransferOp h2d = std::move(to_gpu.h2d);
    h2d.kind = TransferKind::kH2D;
    h2d.purpose = Purpose::kReorder;
    h2d.request = request;
    h2d.layer = -1;
    rs.SubmitTransfer(std::move(h2d), {after}, true);
  };
  const OpId g_gpu =
      gather_gpu.bytes > 0 ? rs.SubmitTransfer(std::move(gather_gpu), {r, d}, true) : kNoOp;
  if (staged && !to_gpu.empty()) copy_to_gpu(g_gpu);
  const OpId g_rest =
      gather_rest.bytes > 0 ? rs.SubmitTransfer(std::move(gather_rest), {r, d}, true) : kNoOp;
  if (!staged && !to_gpu.empty()) copy_to_gpu(g_rest);
  rs.SubmitTransfer(std::move(write), {g_gpu, g_rest}, true);
  // Why: the evidence (reuses measured, chunks their layers touched stored and packed, the rent
  // they paid) against the repack's SSD bytes.
  char why[200];
  std::snprintf(why, sizeof why,
                ": %lld reuses, %.0f -> %.0f chunks (saving %.4f), rent %.0f B, %.0f B",
                (long long)evidence.reuses, evidence.stored_chunks, evidence.packed_chunks,
                evidence.Saving(), evidence.rent_bytes, cost);
  log_->LogDecision({request, -1, "reorder", 0,
                     "segment " + std::to_string(old_id) + " -> " + std::to_string(new_id) + why,
                     /*timing_dependent=*/true});
}

void Pipeline::RecordEvidence(const RequestRun& rs) {
  // The pieces of each segment the request reused (a segment can serve several nodes in a row).
  std::vector<std::uint32_t> segments;
  for (const MatchPiece& piece : rs.match.pieces) segments.push_back(piece.segment);
  std::sort(segments.begin(), segments.end());
  segments.erase(std::unique(segments.begin(), segments.end()), segments.end());
  // What each layer's loads of the segment cost (the rent's price), when the planner priced a
  // kept set per layer: kept_sets has one per layer in layer order (the layer-wise schedule).
  const std::span<const std::uint32_t> mapped = rs.planner().segments();
  const std::size_t layers = rs.kept_sets.size();
  const bool priced = layers == std::size_t(model_.layers) &&
                      rs.layout_bytes.size() == layers * mapped.size();
  std::vector<Reorderer::Piece> pieces;
  std::vector<double> layer_bytes;
  for (std::uint32_t id : segments) {
    if (tree_->FindSegment(id) == nullptr) continue;
    pieces.clear();
    for (const MatchPiece& p : rs.match.pieces) {
      if (p.segment == id) pieces.push_back({p.prefix_begin, p.prefix_end, p.segment_begin});
    }
    layer_bytes.clear();
    const auto index = std::size_t(std::find(mapped.begin(), mapped.end(), id) - mapped.begin());
    if (priced && index < mapped.size()) {
      for (std::size_t l = 0; l < layers; ++l) {
        layer_bytes.push_back(rs.layout_bytes[l * mapped.size() + index]);
      }
    }
    reorderer_->RecordEvidence(*tree_, id, pieces, rs.kept_sets, layer_bytes);
  }
}

bool Pipeline::SegmentInUse(std::uint32_t id) const {
  for (const RequestRun* other : in_flight_) {
    for (const MatchPiece& piece : other->match.pieces) {
      if (piece.segment == id) return true;
    }
  }
  return false;
}

namespace {


}  // namespace

void Pipeline::AddBackground(OpId op, const TransferRecord& record) {
  const std::uint64_t number = background_next_++;
  background_.emplace_hint(background_.end(), number, Background{op, record});
  if (!background_notices_) return;
  if (executor_->Watch(op)) {
    watched_.emplace(op, number);
  } else {
    background_notices_ = false;  // an executor keeps notices for every op or for none
    watched_.clear();
  }
}

void Pipeline::RetireOne(OpId op, TransferRecord& record) {
  OpTimes t = executor_->Retire(op);
  SettleTransfer(t, &record);
  if (!t.status.ok() && background_error_.ok()) {
    background_error_ = NameFailure(
        t.status, DescribeTransfer(record.kind, record.purpose, record.request_id, record.layer));
  }
  log_->LogTransfer(record);
  watched_.erase(op);
}

void Pipeline::RetireBackground(bool wait_all) {
  if (wait_all) {
    // Each in order, waited for. By number, not an iterator held across the wait: a request
    // running inside it may hand over more.
    for (std::uint64_t next = 0;;) {
      auto it = background_.lower_bound(next);
      if (it == background_.end()) break;
      const std::uint64_t number = it->first;
      next = number + 1;
      executor_->Wait(it->second.op);  // the status comes with Retire
      it = background_.find(number);
      if (it == background_.end()) continue;
      RetireOne(it->second.op, it->second.record);
      background_.erase(it);
    }
    return;
  }
  if (background_.empty()) return;
  if (!background_notices_) {
    for (auto it = background_.begin(); it != background_.end();) {
      if (executor_->Done(it->second.op)) {
        RetireOne(it->second.op, it->second.record);
        it = background_.erase(it);
      } else {
        ++it;
      }
    }
    return;
  }
  // The ops done now are those a poll of every one would find; retired in the same order.
  done_ops_.clear();
  executor_->TakeDone(&done_ops_);
  done_numbers_.clear();
  for (OpId op : done_ops_) {
    auto w = watched_.find(op);
    if (w != watched_.end()) done_numbers_.push_back(w->second);  // else retired already
  }
  std::sort(done_numbers_.begin(), done_numbers_.end());
  for (std::uint64_t number : done_numbers_) {
    auto it = background_.find(number);
    KVTIER_DCHECK(it != background_.end(), "Pipeline: a watched background op was lost");
    RetireOne(it->second.op, it->second.record);
    background_.erase(it);
  }
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
  int holder = -1;
  if (options_.max_in_flight > 1) {
    // The lowest free pin slot; released at the end of this call.
    for (int h = 0; h < TieredCache::kMaxHolders; ++h) {
      if ((holders_in_use_ & (1u << h)) == 0) {
        holder = h;
        break;
      }
    }
    KVTIER_CHECK(holder >= 0, "Pipeline::Run: no free pin slot");
    holders_in_use_ |= 1u << holder;
  }
  cache_->SetHolder(holder);
  MaybeReorder(request.id);
  const SystemOptions& sys = options_.system;
  RequestRun rs(*this, request, warmup, holder);
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
  if (reuses_) rs.match = tree_->Lookup(request.prefix);
  rs.tree_version = tree_version_;
  in_flight_.push_back(&rs);
  rs.n = rs.match.reused_tokens;
  rs.nr = request.prefix_tokens() - rs.n;
  rs.rec.reused_tokens = rs.n;
  rs.layer_compute.assign(std::size_t(model_.layers), kNoOp);
  rs.layer_gpu_ops.assign(std::size_t(model_.layers), {});
  rs.kept_fraction.assign(std::size_t(rs.n), 0.0f);

  // The system's schedule; with nothing reusable every system recomputes.
  Status st;
  if (!reuses_ || rs.n == 0) {
    st = recompute_->Prefill(rs);
  } else {
    rs.planner().Map(rs.match, *tree_);
    st = schedule_->Prefill(rs);
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
    output = rs.SubmitCompute(out, {last});
    st = rs.Wait(output);
  }
  rs.rec.end_s = executor_->Now();

  if (st.ok()) {
    StoreNewPrefix(rs, output);
    // The importance history (the reorderer's statistics, which a history selector also
    // chooses from): the share of layers that kept each reused token. A history selector's own
    // choices would only feed the history back to itself; what the request's attention
    // observed is recorded instead.
    if ((sys.reorder || selector_info_->history) && rs.n > 0) {
      if (selector_info_->history) ObserveImportance(rs);
      if (sys.reorder) RecordEvidence(rs);  // packed by the history before this request's
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
    if (!executor_->Done(o.op)) rs.Wait(o.op);
    OpTimes t = executor_->Retire(o.op);
    times[o.op] = {t.start_s, t.end_s};
    if (!t.status.ok()) {
      Status& first = t.status.code() == Status::Code::kAborted ? aborted : own_failure;
      if (first.ok()) {
        first = NameFailure(t.status,
                            o.is_transfer ? DescribeTransfer(o.transfer.kind, o.transfer.purpose,
                                                             o.transfer.request_id, o.layer)
                                          : DescribeCompute(o.compute_kind, rs.id(), o.layer));
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
  // A request that decodes joins the batch with its first token (core/decode_engine.h).
  if (st.ok() && decode_ != nullptr) st = decode_->Join(request, warmup, rs.rec.end_s, rs.n);
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
    totals_.kv_chunks += rs.kv_chunks;
    if (rs.n > 0) totals_.kv_layers += model_.layers;
    for (const LayerRecord& lr : rs.layers) {
      totals_.prefetched_chunks += lr.prefetched_chunks;
      totals_.prefetch_used_chunks += lr.prefetch_used_chunks;
    }
  }
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), &rs));
  if (holder >= 0) {
    cache_->ReleasePins(holder);
    holders_in_use_ &= ~(1u << holder);
  }
  cache_->SetHolder(-1);
  return st;
}

void Pipeline::Prewarm(const Request& request) {
  const SystemOptions& sys = options_.system;
  if (!reuses_) return;
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
        if (!layout_.Has(kind)) continue;
        const ChunkId id = ChunkId::Make(segment, kind, l, c);
        const Bytes b = layout_.ChunkBytes(*seg, c, kind);
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

Status Pipeline::DecodeStep() {
  KVTIER_CHECK(decoding() && in_flight_.empty(), "Pipeline::DecodeStep: nothing to decode");
  return decode_->Step();
}

Status Pipeline::Finish() {
  KVTIER_CHECK(in_flight_.empty(), "Pipeline::Finish with requests in flight");
  const Status decode_failure = decode_ != nullptr ? decode_->Finish() : Status::OK();
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
  log_->LogMetric("kv_chunks_per_layer",
                  t.kv_layers > 0 ? double(t.kv_chunks) / double(t.kv_layers) : 0);
  if (options_.system.reorder) {
    log_->LogMetric("repack_chunks_from_memory", double(t.repack_chunks_from_memory));
    log_->LogMetric("repack_chunks_from_ssd", double(t.repack_chunks_from_ssd));
  }
  log_->Flush();
  Status failure = std::move(background_error_);
  background_error_ = Status::OK();
  return failure.ok() ? decode_failure : failure;
}

Status ServeWithDecode(Pipeline& pipeline, Executor& executor,
                       const std::function<const Request*(bool*)>& next,
                       const std::function<void(const Request&, bool, const Status&)>& done,
                       long long* served) {
  KVTIER_CHECK(pipeline.decodes(), "ServeWithDecode: the system does not decode");
  const Request* request = nullptr;
  bool warmup = false, more = true;
  Status decode_failure;
  for (;;) {
    if (request == nullptr && more) {
      request = next(&warmup);
      more = request != nullptr;
    }
    if (request == nullptr && !pipeline.decoding()) break;
    if (request != nullptr && pipeline.CanAdmit(*request)) {
      if (request->arrival_s > executor.Now() && !pipeline.decoding()) {
        executor.IdleUntil(request->arrival_s);
      }
      if (request->arrival_s <= executor.Now()) {
        const Status st = pipeline.Run(*request, warmup);
        ++*served;
        const Request* ran = request;
        request = nullptr;
        done(*ran, warmup, st);
        continue;
      }
    }
    // An empty batch admits any request (DecodeEngine::CanJoin), so here something decodes.
    KVTIER_CHECK(pipeline.decoding(), "ServeWithDecode: waiting for memory with nothing decoding");
    if (Status st = pipeline.DecodeStep(); !st.ok()) {
      decode_failure = st;  // stop taking requests; the rest is logged by Finish
      break;
    }
  }
  Status finish = pipeline.Finish();
  return finish.ok() ? decode_failure : finish;
}

}  // namespace kvtier
