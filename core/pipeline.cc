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
#include "core/request_run.h"
#include "core/schedule.h"
#include "core/selector.h"

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
  reorderer_ = std::make_unique<Reorderer>(s.reorder_history_weight, s.reorder_min_accesses,
                                           s.chunk_tokens, s.reorder_min_gain);
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
  Bytes bytes = 0;
  std::vector<ChunkIo> chunks;
  for (int l = 0; l < model_.layers; ++l) {
    for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
      for (KvKind kind : layout_.kinds()) {
        const Bytes b = layout_.ChunkBytes(*seg, c, kind);
        bytes += b;
        if (options_.chunk_detail) chunks.push_back({ChunkId::Make(segment, kind, l, c), b, {}, {}});
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
  std::vector<float> scores;
  std::fill(rs.kept_fraction.begin(), rs.kept_fraction.end(), 0.0f);
  for (int l = 0; l < model_.layers; ++l) {
    scores_->Scores(rs.request(), l, rs.n, heads, &scores);
    Selection observed;
    observed.kind = Selection::Kind::kPerHead;
    observed.per_head = SelectPerHead(scores, model_.kv_heads, rs.n, k);
    rs.Keep(observed);
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
  std::vector<CacheMove> moves;
  for (std::uint32_t old_id : reorderer_->Due(*tree_)) {
    // A request in flight reads this segment's chunks (and has them pinned): it stays due and
    // is repacked by a later pass.
    if (SegmentInUse(old_id)) continue;
    const Segment* old = tree_->FindSegment(old_id);
    const std::span<const KvKind> kinds = layout_.kinds();
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
          const Bytes b = layout_.ChunkBytes(*old, c, kind);
          read.bytes += b;
          ++read.ios;
          if (options_.chunk_detail) read.chunks.push_back({id, b, {}, {}});
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
      const Bytes bytes = layout_.ChunkBytes(*repacked, c, slot.old_id.kind());
      if (cache_->Insert(id, bytes, slot.tier, &moves)) {
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
          const Bytes b = layout_.ChunkBytes(*repacked, c, kind);
          write.bytes += b;
          ++write.ios;
          if (options_.chunk_detail) {
            write.chunks.push_back({ChunkId::Make(new_id, kind, l, c), b, {}, {}});
          }
        }
      }
    }
    OpId r = rs.SubmitTransfer(std::move(read), {}, true);
    rs.SubmitTransfer(std::move(write), {r}, true);
    log_->LogDecision({request, -1, "reorder", 0,
                       "segment " + std::to_string(old_id) + " -> " + std::to_string(new_id),
                       /*timing_dependent=*/true});
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
    tr->descriptors = 0;
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
