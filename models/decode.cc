// Decoding with the 16-bit cache, KIVI and SpeCache (see decode.h).

#include "models/decode.h"

#include <algorithm>

#include "core/check.h"
#include "core/errors.h"

namespace kvtier {
namespace {

// Ranked top-k of scores[0, limit) (best first, ties to the lower index).
std::vector<int32_t> Ranked(const std::vector<float>& scores, int limit, int k) {
  k = std::max(0, std::min(k, limit));
  std::vector<int32_t> idx(limit);
  for (int j = 0; j < limit; ++j) idx[j] = j;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(k);
  return idx;
}

}  // namespace

const char* DecodeMethodName(DecodeMethod method) {
  switch (method) {
    case DecodeMethod::kFull: return "full";
    case DecodeMethod::kKivi: return "kivi";
    case DecodeMethod::kSpeCache: return "specache";
    case DecodeMethod::kSpeCacheNoSpec: return "specache_nospec";
  }
  return "?";
}

Decoder::Decoder(const LlamaModel& model, KvCache prefilled, const DecodeOptions& options)
    : model_(model), options_(options), cache_(std::move(prefilled)) {
  const LlamaConfig& c = model.config();
  if (options_.measure_k <= 0) options_.measure_k = std::max(options_.k, 0);
  if (options_.method != DecodeMethod::kFull) {
    options_.quant.Validate(c.head_dim);
    low_ = KiviCache(options_.quant, c.n_layers, c.n_kv_heads, c.head_dim);
    low_.Sync(cache_);  // the prefill's KV, quantized layer by layer (Algorithm 1)
  }
  const bool fetches = options_.method == DecodeMethod::kSpeCache ||
                       options_.method == DecodeMethod::kSpeCacheNoSpec;
  if (fetches && options_.k < 1) {
    throw InputError("decode: " + std::string(DecodeMethodName(options_.method)) +
                     " needs k >= 1, got " + std::to_string(options_.k));
  }
}

std::span<const float> Decoder::Step(int32_t token) {
  Decoder* self = this;
  StepBatch(std::span<Decoder* const>(&self, 1), std::span<const int32_t>(&token, 1));
  return logits_;
}

void Decoder::StepBatch(std::span<Decoder* const> decoders, std::span<const int32_t> tokens) {
  KVTIER_CHECK(decoders.size() == tokens.size(), "StepBatch: one token per decoder");
  if (decoders.empty()) return;
  const LlamaModel& model = decoders[0]->model_;
  for (Decoder* d : decoders) {
    KVTIER_CHECK(&d->model_ == &model, "StepBatch: decoders of different models");
    d->last_ = DecodeStepInfo();
    d->last_.context = d->cache_.n_tokens;
  }
  // Pre-decoding first (SpeCache's first step), for the decoders that need it.
  std::vector<LlamaModel::BatchForward> batch;
  std::vector<Decoder*> pre;
  for (size_t i = 0; i < decoders.size(); ++i) {
    if (decoders[i]->NeedsPreDecode()) {
      batch.push_back(decoders[i]->PreparePreDecode(tokens[i]));
      pre.push_back(decoders[i]);
    }
  }
  if (!batch.empty()) {
    const std::vector<ForwardResult> r = model.ForwardBatch(batch);
    for (size_t i = 0; i < pre.size(); ++i) pre[i]->FinishPreDecode(r[i]);
  }
  batch.clear();
  for (size_t i = 0; i < decoders.size(); ++i) batch.push_back(decoders[i]->Prepare(tokens[i]));
  const std::vector<ForwardResult> r = model.ForwardBatch(batch);
  for (size_t i = 0; i < decoders.size(); ++i) decoders[i]->Finish(r[i]);
}

bool Decoder::NeedsPreDecode() const {
  return options_.method == DecodeMethod::kSpeCache && !predecoded_;
}

LlamaModel::BatchForward Decoder::PreparePreDecode(int32_t token) {
  // Pre-decoding (Algorithm 2): T_1 over the low-bit cache picks K_1 and yields T'_2; it
  // appends nothing.
  const LlamaConfig& c = model_.config();
  if (static_cast<int64_t>(cache_.n_tokens) + 2 > c.context_length) {
    throw InputError(model_.path() + ": specache step at position " +
                     std::to_string(cache_.n_tokens) + " needs two positions; the context length is " +
                     std::to_string(c.context_length));
  }
  tokens_[0] = token;
  plan_ = LowBitAttention();
  plan_.lowbit = &low_;
  plan_.capture_row = 0;
  plan_.capture_k = options_.k;
  plan_.capture_limit = low_.low_bit_tokens();
  LlamaModel::BatchForward b;
  b.tokens = std::span<const int32_t>(tokens_, 1);
  b.cache = &cache_;
  b.append_rows = 0;
  b.low_bit = &plan_;
  b.low_bit_out = &plan_out_;
  return b;
}

void Decoder::FinishPreDecode(const ForwardResult& r) {
  next_fetch_ = std::move(plan_out_.captured);
  speculative_ = ArgMax(r.LastLogits(model_.config().vocab_size));
  predecoded_ = true;
  ++last_.forwards;
}

LlamaModel::BatchForward Decoder::Prepare(int32_t token) {
  const LlamaConfig& c = model_.config();
  const int P = cache_.n_tokens;
  const int R = options_.quant.residual;
  tokens_[0] = token;
  LlamaModel::BatchForward b;
  b.tokens = std::span<const int32_t>(tokens_, 1);
  b.cache = &cache_;
  b.append_rows = 1;
  if (options_.method == DecodeMethod::kFull) {
    b.importance = options_.measure;
    return b;
  }
  last_.low_bit = low_.low_bit_tokens();
  plan_ = LowBitAttention();
  plan_.lowbit = &low_;
  if (options_.measure) {
    plan_.exact_row = 0;
    plan_.exact_k = options_.measure_k;
    plan_.keep_exact_scores = options_.keep_exact_scores;
  }
  if (options_.method == DecodeMethod::kSpeCacheNoSpec) plan_.self_select_k = options_.k;
  if (options_.method == DecodeMethod::kSpeCache) {
    if (static_cast<int64_t>(P) + 2 > c.context_length) {
      throw InputError(model_.path() + ": specache step at position " + std::to_string(P) +
                       " needs two positions; the context length is " +
                       std::to_string(c.context_length));
    }
    // Decoding (Algorithm 3, eq. 1): [T_t, T'_{t+1}] with C' ∪ C_{K_t}; T'_{t+1}'s attention
    // picks K_{t+1} among the positions that are low-bit once T_t's K/V is appended.
    tokens_[1] = speculative_;
    b.tokens = std::span<const int32_t>(tokens_, 2);
    plan_.fetched = &next_fetch_;
    plan_.capture_row = 1;
    plan_.capture_k = options_.k;
    plan_.capture_limit = std::min(LowBitTokens(P + 1, R), P + 1);
  }
  b.low_bit = &plan_;
  b.low_bit_out = &plan_out_;
  return b;
}

void Decoder::Finish(const ForwardResult& r) {
  const LlamaConfig& c = model_.config();
  ++last_.forwards;
  if (options_.method == DecodeMethod::kFull) {
    if (options_.measure) {
      const int P = last_.context;
      last_.exact.assign(c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads));
      if (options_.keep_exact_scores) last_.exact_scores = r.importance.per_kv_head;
      for (int l = 0; l < c.n_layers; ++l) {
        for (int g = 0; g < c.n_kv_heads; ++g) {
          last_.exact[l][g] = Ranked(r.importance.per_kv_head[l][g], P, options_.measure_k);
        }
      }
    }
  } else {
    if (options_.method == DecodeMethod::kSpeCacheNoSpec) {
      last_.fetched = std::move(plan_out_.selected);
    } else if (options_.method == DecodeMethod::kSpeCache) {
      last_.fetched = std::move(next_fetch_);
      next_fetch_ = std::move(plan_out_.captured);
      speculative_ = ArgMax(std::span<const float>(r.logits).subspan(
          static_cast<size_t>(c.vocab_size), c.vocab_size));
    }
    last_.exact = std::move(plan_out_.exact_topk);
    last_.exact_scores = std::move(plan_out_.exact_scores);
    last_.mass = plan_out_.mass;
    low_.Sync(cache_);  // T_t's K/V: quantized once it leaves the residual window
  }
  const auto row0 = std::span<const float>(r.logits).first(c.vocab_size);
  logits_.assign(row0.begin(), row0.end());
}

std::uint64_t DecodeGpuKvBytes(const LlamaConfig& c, const DecodeOptions& o, int context) {
  const std::uint64_t pair = 2ull * c.head_dim * 2;  // 16-bit K and V of one position, one head
  if (o.method == DecodeMethod::kFull) {
    return pair * context * c.n_layers * c.n_kv_heads;
  }
  std::uint64_t b = KiviCache::GpuBytes(o.quant, context, c.n_layers, c.n_kv_heads, c.head_dim);
  if (o.method != DecodeMethod::kKivi) {
    const int fetched = std::min(o.k, LowBitTokens(context, o.quant.residual));
    b += pair * fetched * c.n_layers * c.n_kv_heads;
  }
  return b;
}

double DecodeKvSizeRatio(const LlamaConfig& c, const DecodeOptions& o, int context) {
  DecodeOptions full;
  const std::uint64_t f = DecodeGpuKvBytes(c, full, context);
  return f ? static_cast<double>(DecodeGpuKvBytes(c, o, context)) / f : 0;
}

}  // namespace kvtier
