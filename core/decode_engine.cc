#include "core/decode_engine.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace kvtier {
namespace {

constexpr DecodePolicyInfo kDecodePolicies[] = {
    {"none", DecodePolicy::kNone, "no decode: a request ends at its first token"},
    {"full_gpu", DecodePolicy::kFullGpu, "16-bit KV on the GPU; the batch limited by memory"},
    {"kivi", DecodePolicy::kKivi,
     "KIVI: K and V only as decode.bits codes (group decode.group) + decode.residual 16-bit tokens"},
    {"offload_all", DecodePolicy::kOffloadAll,
     "FlexGen-like: all 16-bit KV in CPU memory, each layer's streamed to the GPU every step"},
    {"specache", DecodePolicy::kSpeCache,
     "SpeCache: KIVI codes on the GPU, the top decode.topk 16-bit pairs per KV head prefetched a "
     "step ahead by a speculative token"},
    {"specache_nospec", DecodePolicy::kSpeCacheNoSpec,
     "SpeCache without speculation: each layer fetches its own scores' top-k, then attends "
     "(no overlap)"},
};

bool LowBit(DecodePolicy p) {
  return p == DecodePolicy::kKivi || p == DecodePolicy::kSpeCache ||
         p == DecodePolicy::kSpeCacheNoSpec;
}
bool TopK(DecodePolicy p) {
  return p == DecodePolicy::kSpeCache || p == DecodePolicy::kSpeCacheNoSpec;
}
// The policy keeps every token's 16-bit KV in CPU memory (new KV is offloaded).
bool Offloads(DecodePolicy p) { return TopK(p) || p == DecodePolicy::kOffloadAll; }

TransferOp Transfer(TransferKind kind, Purpose purpose, RequestId request, int layer) {
  TransferOp op;
  op.kind = kind;
  op.purpose = purpose;
  op.request = request;
  op.layer = layer;
  return op;
}

}  // namespace

std::span<const DecodePolicyInfo> DecodePolicies() { return kDecodePolicies; }
std::vector<Choice> DecodePolicyChoices() { return ChoicesOf(DecodePolicies()); }
DecodePolicy FindDecodePolicy(std::string_view name, std::string_view key) {
  return FindEntry(DecodePolicies(), name, key, "decode policy").policy;
}
std::string_view DecodePolicyName(DecodePolicy policy) {
  for (const DecodePolicyInfo& info : kDecodePolicies) {
    if (info.policy == policy) return info.name;
  }
  return "?";
}

double LowBitBytesPerTokenLayer(const ModelSpec& model, int bits, int group) {
  // Per element: bits / 8 bytes of code, plus one 16-bit scale and one 16-bit zero-point per
  // group of `group` elements (models/kivi.h stores them as floats; a GPU kernel as fp16).
  const double elements = 2.0 * model.kv_heads * model.head_dim;  // K and V
  return elements * (bits / 8.0 + 4.0 / group);
}

double DecodeLayerKvBytes(const ModelSpec& model, const DecodeBatchOptions& o, std::int64_t cached) {
  const double kv16 = 2.0 * double(model.KBytesPerTokenLayer());
  const double c = double(cached);
  switch (o.policy) {
    case DecodePolicy::kNone: return 0;
    case DecodePolicy::kFullGpu:
    case DecodePolicy::kOffloadAll: return c * kv16;
    case DecodePolicy::kKivi:
    case DecodePolicy::kSpeCache:
    case DecodePolicy::kSpeCacheNoSpec: {
      const double r = std::min<double>(c, o.residual);
      double bytes = (c - r) * LowBitBytesPerTokenLayer(model, o.bits, o.group) + r * kv16;
      // The fetched pairs: k positions per KV head, K and V (at most the low-bit positions).
      if (TopK(o.policy)) bytes += std::min<double>(o.topk, c - r) * kv16;
      return bytes;
    }
  }
  return 0;
}

DecodeEngine::DecodeEngine(const ModelSpec& model, const DecodeBatchOptions& decode,
                           TransferStrategy strategy, Bytes reused_gpu_bytes, Executor* executor,
                           RunLog* log)
    : model_(model), opt_(decode), strategy_(strategy), executor_(executor), log_(log) {
  KVTIER_CHECK(opt_.on(), "DecodeEngine needs a decode policy");
  budget_ = double(opt_.gpu_memory) - double(model_.WeightBytes()) - double(reused_gpu_bytes) -
            double(opt_.gpu_reserve);
  kv16_ = 2.0 * double(model_.KBytesPerTokenLayer());
  lowbit_ = LowBitBytesPerTokenLayer(model_, opt_.bits, opt_.group);
  prefetch_.assign(std::size_t(model_.layers), kNoOp);
  last_offload_.assign(std::size_t(model_.layers), kNoOp);
}

std::int64_t DecodeEngine::StepsTokens(const Request& r) const {
  std::int64_t out = r.output_tokens;
  if (opt_.max_output_tokens > 0) out = std::min(out, opt_.max_output_tokens);
  return std::max<std::int64_t>(0, out - 1);
}

Bytes DecodeEngine::Footprint(const Request& r) const {
  const std::int64_t peak = r.prefix_tokens() + r.query_tokens + StepsTokens(r) + 1;
  const double layer = DecodeLayerKvBytes(model_, opt_, peak);
  // offload_all holds two layers' buffers (the one computing, the one loading).
  const double layers = opt_.policy == DecodePolicy::kOffloadAll ? 2.0 : double(model_.layers);
  return Bytes(layers * layer);
}

bool DecodeEngine::CanJoin(const Request& r) const {
  if (StepsTokens(r) == 0 || seqs_.empty()) return true;
  return int(seqs_.size()) < opt_.max_batch && double(used_ + Footprint(r)) <= budget_;
}

OpId DecodeEngine::SubmitTransfer(TransferOp op, std::vector<OpId> after) {
  after.erase(std::remove(after.begin(), after.end(), kNoOp), after.end());
  if (op.ios == 0) op.ios = 1;
  Pending p;
  p.is_transfer = true;
  p.record = PlannedTransfer(op, op.request);
  p.op = executor_->Submit(std::move(op), after);
  pending_.push_back(p);
  return p.op;
}

OpId DecodeEngine::SubmitCompute(ComputeOp op, std::vector<OpId> after) {
  after.erase(std::remove(after.begin(), after.end(), kNoOp), after.end());
  return executor_->Submit(op, after);
}

OpId DecodeEngine::SubmitTopK(Purpose purpose, int layer, const std::vector<std::int64_t>& seqs,
                              std::vector<OpId> after, Bytes* h2d_bytes) {
  RowOps ops;
  const Bytes row = model_.RowBytes();
  for (const std::int64_t m : seqs) {
    // m: the positions the step reading the pairs attends; k of its low-bit ones per KV head.
    const std::int64_t candidates = m - std::min<std::int64_t>(m, opt_.residual);
    const std::int64_t k = std::min<std::int64_t>(opt_.topk, candidates);
    if (k <= 0) continue;
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      RowLoad load;
      load.kind = kind;
      load.runs = std::uint32_t(k * model_.kv_heads);  // scattered: one run per row
      load.bytes = Bytes(load.runs) * row;
      load.chunk_bytes = Bytes(m) * Bytes(model_.kv_heads) * row;  // the layer's whole K (or V)
      AddRows(strategy_, load, /*detail=*/false, &ops);
    }
  }
  if (ops.empty()) return kNoOp;
  FinishOps(strategy_, &ops);
  if (ops.gather.bytes > 0) {
    TransferOp& g = ops.gather;
    g.kind = TransferKind::kCpuGather;
    g.purpose = purpose;
    g.layer = layer;
    after = {SubmitTransfer(std::move(g), std::move(after))};
  }
  TransferOp& h = ops.h2d;
  h.kind = TransferKind::kH2D;
  h.purpose = purpose;
  h.layer = layer;
  *h2d_bytes += h.bytes;
  return SubmitTransfer(std::move(h), std::move(after));
}

Status DecodeEngine::Join(const Request& r, bool warmup, Seconds first_token_s,
                          std::int64_t reused) {
  const std::int64_t outputs = StepsTokens(r);
  if (outputs == 0) return Status::OK();
  const Bytes fp = Footprint(r);
  if (double(fp) > budget_) {
    return Status::OutOfSpace(
        "decode: request " + std::to_string(r.id) + " (" +
        std::to_string(r.prefix_tokens() + r.query_tokens) + " prompt + " +
        std::to_string(outputs + 1) + " output tokens) needs " + std::to_string(fp) +
        " B of GPU memory under decode.policy = " + std::string(DecodePolicyName(opt_.policy)) +
        "; the batch has " + std::to_string(std::int64_t(budget_)) +
        " B (gpu.memory - weights - cache.gpu_capacity - decode.gpu_reserve)");
  }
  Seq s;
  s.id = r.id;
  s.warmup = warmup;
  s.prompt = r.prefix_tokens() + r.query_tokens;
  s.outputs = outputs;
  s.first_token_s = first_token_s;
  s.footprint = fp;
  s.predecoded = opt_.policy != DecodePolicy::kSpeCache;
  used_ += fp;
  const double layers = model_.layers;
  // Where the policy keeps the prompt: the 16-bit KV the prefill computed goes to CPU memory
  // (Algorithm 1: layer by layer, one DMA per layer); a reused prefix's low-bit copy comes
  // from CPU memory (its 16-bit rows are there, in the prefix cache or read from it).
  if (Offloads(opt_.policy) && s.prompt - reused > 0) {
    TransferOp d2h = Transfer(TransferKind::kD2H, Purpose::kDecodeOffload, r.id, -1);
    d2h.bytes = Bytes(double(s.prompt - reused) * kv16_ * layers);
    d2h.ios = std::uint32_t(model_.layers);
    join_ops_.push_back(SubmitTransfer(std::move(d2h), {}));
  }
  if (LowBit(opt_.policy) && reused > 0) {
    TransferOp h2d = Transfer(TransferKind::kH2D, Purpose::kDecodeFetch, r.id, -1);
    h2d.bytes = Bytes(double(reused) * lowbit_ * layers);
    h2d.ios = std::uint32_t(model_.layers);
    join_ops_.push_back(SubmitTransfer(std::move(h2d), {}));
  }
  seqs_.push_back(s);
  return Status::OK();
}

bool DecodeEngine::Held(OpId op) const {
  return std::find(held_.begin(), held_.end(), op) != held_.end();
}

Status DecodeEngine::RetireDone(bool all) {
  Status first;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    if (all) executor_->Wait(p.op);
    if (!executor_->Done(p.op) || (!all && Held(p.op))) {
      pending_[kept++] = std::move(p);
      continue;
    }
    const OpTimes t = executor_->Retire(p.op);
    TransferRecord& tr = p.record;
    SettleTransfer(t, &tr);
    if (!t.status.ok() && first.ok()) {
      first = NameFailure(t.status,
                          DescribeTransfer(tr.kind, tr.purpose, tr.request_id, tr.layer));
    }
    log_->LogTransfer(tr);
  }
  pending_.resize(kept);
  if (all) held_.clear();
  return first;
}

Status DecodeEngine::Step() {
  KVTIER_CHECK(!seqs_.empty(), "DecodeEngine::Step with an empty batch");
  const Seconds start = executor_->Now();
  const DecodePolicy pol = opt_.policy;
  const int L = model_.layers;
  // Per layer, the batch's rows, query-key pairs and KV bytes (the same at every layer).
  std::int64_t rows = 0, context = 0;
  double pairs = 0, read = 0, write = 0, score_read = 0, pairs_scores = 0;
  double offload_tokens = 0, fetch_bytes = 0;
  int tokens = 0;
  double gpu_bytes = 0;
  // The positions attended by the step reading the top-k pairs, one entry per sequence:
  std::vector<std::int64_t> next_topk;  // specache: next step's, of the sequences that go on
  std::vector<std::int64_t> topk;       // specache_nospec: this step's, of every sequence
  for (Seq& s : seqs_) {
    if (s.join_s < 0) s.join_s = start;
    const std::int64_t m = s.cached() + 1;  // its cached positions and the step's token
    const double mm = double(m);
    context += s.cached();
    gpu_bytes += double(s.footprint);
    const double r = std::min<double>(mm, opt_.residual);
    const double kivi = (mm - r) * lowbit_ + r * kv16_;
    const double fetched = std::min<double>(opt_.topk, mm - r) * kv16_;
    write += kv16_;  // the step's token's K and V (its low-bit codes included in the rounding)
    offload_tokens += 1;
    const bool token = s.predecoded;  // a pre-decoding step produces no token
    tokens += token ? 1 : 0;
    switch (pol) {
      case DecodePolicy::kNone: break;
      case DecodePolicy::kFullGpu:
        rows += 1, pairs += mm, read += mm * kv16_;
        break;
      case DecodePolicy::kKivi:
        rows += 1, pairs += mm, read += kivi;
        break;
      case DecodePolicy::kOffloadAll:
        rows += 1, pairs += mm, read += mm * kv16_;
        fetch_bytes += double(s.cached()) * kv16_;
        break;
      case DecodePolicy::kSpeCache:
        if (!s.predecoded) {
          rows += 1, pairs += mm, read += kivi;  // Algorithm 2: the first token over the codes
        } else {
          // Algorithm 3: the output row attends its positions, the speculative row those and
          // the output token; both read the codes and the fetched pairs.
          rows += 2, pairs += 2 * mm + 1, read += kivi + fetched;
        }
        if (s.produced + (token ? 1 : 0) < s.outputs) next_topk.push_back(m + (token ? 1 : 0));
        break;
      case DecodePolicy::kSpeCacheNoSpec:
        rows += 1, pairs += mm, read += kivi + fetched;
        pairs_scores += mm, score_read += kivi / 2;  // the scores read the keys' codes
        topk.push_back(m);
        break;
    }
  }
  std::vector<OpId> computes;
  Bytes h2d_bytes = 0, d2h_bytes = 0;
  auto layer_op = [&](int l, DecodePart part, std::int64_t n, double p, double rd, double wr) {
    ComputeOp op;
    op.kind = ComputeKind::kDecodeStep;
    op.layer = l;
    op.decode_part = part;
    op.new_tokens = n;
    op.context_tokens = std::int64_t(p);
    op.kv_read_bytes = Bytes(rd);
    op.kv_write_bytes = Bytes(wr);
    return op;
  };
  auto offload = [&](int l, OpId after) {
    TransferOp d2h = Transfer(TransferKind::kD2H, Purpose::kDecodeOffload, 0, l);
    d2h.bytes = Bytes(offload_tokens * kv16_);
    d2h.ios = 1;
    d2h_bytes += d2h.bytes;
    return SubmitTransfer(std::move(d2h), {after});
  };
  std::vector<OpId> held_next;
  const std::vector<OpId> joins = std::move(join_ops_);
  join_ops_.clear();
  OpId prev = kNoOp;       // the last compute
  OpId prev_load = kNoOp;  // offload_all: the previous layer's load (the link in order)
  for (int l = 0; l < L; ++l) {
    const std::size_t li = std::size_t(l);
    switch (pol) {
      case DecodePolicy::kNone: break;
      case DecodePolicy::kFullGpu:
      case DecodePolicy::kKivi:
        prev = SubmitCompute(layer_op(l, DecodePart::kWhole, rows, pairs, read, write), {prev});
        computes.push_back(prev);
        break;
      case DecodePolicy::kOffloadAll: {
        // Two buffers: layer l's load waits for layer l-2's compute (its buffer), for the
        // previous load (FIFO on the link) and for last step's offload of this layer.
        std::vector<OpId> after = {prev_load, last_offload_[li]};
        if (l >= 2) after.push_back(computes[li - 2]);
        after.insert(after.end(), joins.begin(), joins.end());
        TransferOp h2d = Transfer(TransferKind::kH2D, Purpose::kDecodeFetch, 0, l);
        h2d.bytes = Bytes(fetch_bytes);
        h2d.ios = std::uint32_t(2 * seqs_.size());  // K and V of each sequence: contiguous
        h2d_bytes += h2d.bytes;
        prev_load = h2d.bytes > 0 ? SubmitTransfer(std::move(h2d), after) : kNoOp;
        prev = SubmitCompute(layer_op(l, DecodePart::kWhole, rows, pairs, read, write),
                             {prev, prev_load});
        computes.push_back(prev);
        last_offload_[li] = offload(l, prev);
        held_next.push_back(last_offload_[li]);
        break;
      }
      case DecodePolicy::kSpeCache: {
        prev = SubmitCompute(layer_op(l, DecodePart::kWhole, rows, pairs, read, write),
                             {prev, prefetch_[li]});
        computes.push_back(prev);
        // The speculative token's top-k for the next step, prefetched while the rest of the
        // step computes (after this layer's attention; joins' prompts must be in CPU memory).
        std::vector<OpId> after = {prev};
        after.insert(after.end(), joins.begin(), joins.end());
        prefetch_[li] = SubmitTopK(Purpose::kDecodePrefetch, l, next_topk, after, &h2d_bytes);
        held_next.push_back(prefetch_[li]);
        offload(l, prev);
        break;
      }
      case DecodePolicy::kSpeCacheNoSpec: {
        const OpId scores = SubmitCompute(
            layer_op(l, DecodePart::kScores, rows, pairs_scores, score_read, 0), {prev});
        std::vector<OpId> after = {scores};
        after.insert(after.end(), joins.begin(), joins.end());
        const OpId fetch = SubmitTopK(Purpose::kDecodeFetch, l, topk, after, &h2d_bytes);
        prev = SubmitCompute(layer_op(l, DecodePart::kAttend, rows, pairs, read, write),
                             {scores, fetch});
        computes.push_back(scores);
        computes.push_back(prev);
        offload(l, prev);
        break;
      }
    }
  }
  ComputeOp out;
  out.kind = ComputeKind::kOutputLayer;
  out.new_tokens = rows;
  out.context_tokens = 1;
  const OpId head = SubmitCompute(out, {prev});
  computes.push_back(head);
  Status st = executor_->Wait(head);
  // The step's computes are all done (a chain up to the head, or aborted with it).
  Seconds busy = 0, end = start;
  for (OpId c : computes) {
    if (!executor_->Done(c)) executor_->Wait(c);
    const OpTimes t = executor_->Retire(c);
    if (t.status.ok()) busy += t.end_s - t.start_s;
    if (st.ok() && !t.status.ok()) st = t.status;
    end = std::max(end, t.end_s);
  }
  held_ = std::move(held_next);
  // The step's failure: a transfer's own failure (a prefetch of the previous step, say) rather
  // than the aborted computes after it, as Pipeline::Run reports a request's.
  const Status retired = RetireDone(false);
  if (!retired.ok() && (st.ok() || (st.code() == Status::Code::kAborted &&
                                     retired.code() != Status::Code::kAborted))) {
    st = retired;
  }
  ++steps_;
  DecodeStepRecord rec;
  rec.step = steps_ - 1;
  rec.start_s = start;
  rec.end_s = end;
  rec.batch = int(seqs_.size());
  rec.tokens = tokens;
  rec.rows = rows;
  rec.context_tokens = context;
  rec.gpu_bytes = Bytes(gpu_bytes);
  rec.compute_s = busy;
  rec.stall_s = std::max(0.0, (end - start) - busy);
  rec.h2d_bytes = h2d_bytes;
  rec.d2h_bytes = d2h_bytes;
  log_->LogDecodeStep(rec);
  log_->Flush();  // a durable log writes a batch every so many (analysis/results_db.cc)
  tokens_ += tokens;
  busy_s_ += end - start;
  batch_sum_ += double(seqs_.size());
  if (!st.ok()) {
    if (failure_.ok()) failure_ = st;
    return st;
  }
  // Advance the sequences; log and release the ones that produced their last token.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < seqs_.size(); ++i) {
    Seq& s = seqs_[i];
    ++s.steps;
    s.stall_s += rec.stall_s;
    if (s.predecoded) {
      ++s.produced;
    } else {
      s.predecoded = true;
    }
    if (s.produced < s.outputs) {
      seqs_[kept++] = s;
      continue;
    }
    DecodeRequestRecord dr;
    dr.request_id = s.id;
    dr.warmup = s.warmup;
    dr.prompt_tokens = s.prompt;
    dr.output_tokens = s.outputs + 1;
    dr.first_token_s = s.first_token_s;
    dr.join_s = s.join_s;
    dr.end_s = end;
    dr.steps = s.steps;
    dr.tpot_s = (end - s.first_token_s) / double(s.outputs);
    dr.stall_s = s.stall_s;
    log_->LogDecodeRequest(dr);
    used_ -= s.footprint;
    ++finished_;
  }
  seqs_.resize(kept);
  return Status::OK();
}

Status DecodeEngine::Finish() {
  Status st = failure_;
  while (st.ok() && !seqs_.empty()) st = Step();
  Status retired = RetireDone(true);
  if (st.ok()) st = retired;
  log_->LogMetric("decode_requests", double(finished_));
  log_->LogMetric("decode_tokens", double(tokens_));
  log_->LogMetric("decode_steps", double(steps_));
  log_->LogMetric("decode_busy_s", busy_s_);
  log_->LogMetric("decode_throughput", busy_s_ > 0 ? double(tokens_) / busy_s_ : 0);
  log_->LogMetric("decode_mean_batch", steps_ > 0 ? batch_sum_ / double(steps_) : 0);
  return st;
}

}  // namespace kvtier
