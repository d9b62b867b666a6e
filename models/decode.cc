// Decoding with the 16-bit cache, KIVI and SpeCache (see decode.h).

#include "models/decode.h"

#include <algorithm>

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
  const LlamaConfig& c = model_.config();
  const int P = cache_.n_tokens;
  const int R = options_.quant.residual;
  last_ = DecodeStepInfo();
  last_.context = P;
  const int32_t tok[2] = {token, 0};
  const auto keep_logits = [&](const ForwardResult& r, int row) {
    const auto all = std::span<const float>(r.logits);
    const auto s = all.subspan(static_cast<size_t>(row) * c.vocab_size, c.vocab_size);
    logits_.assign(s.begin(), s.end());
  };

  if (options_.method == DecodeMethod::kFull) {
    ForwardOptions fo;
    fo.importance = options_.measure;
    const ForwardResult r = model_.Forward(std::span<const int32_t>(tok, 1), &cache_, {}, fo);
    last_.forwards = 1;
    if (options_.measure) {
      last_.exact.assign(c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads));
      if (options_.keep_exact_scores) last_.exact_scores = r.importance.per_kv_head;
      for (int l = 0; l < c.n_layers; ++l) {
        for (int g = 0; g < c.n_kv_heads; ++g) {
          last_.exact[l][g] = Ranked(r.importance.per_kv_head[l][g], P, options_.measure_k);
        }
      }
    }
    keep_logits(r, 0);
    return logits_;
  }

  last_.low_bit = low_.low_bit_tokens();
  LowBitAttention a;
  a.lowbit = &low_;
  if (options_.measure) {
    a.exact_row = 0;
    a.exact_k = options_.measure_k;
    a.keep_exact_scores = options_.keep_exact_scores;
  }
  LowBitAttentionResult out;
  ForwardResult r;
  switch (options_.method) {
    case DecodeMethod::kKivi:
      r = model_.ForwardLowBit(std::span<const int32_t>(tok, 1), &cache_, 1, a, &out);
      last_.forwards = 1;
      break;
    case DecodeMethod::kSpeCacheNoSpec:
      a.self_select_k = options_.k;
      r = model_.ForwardLowBit(std::span<const int32_t>(tok, 1), &cache_, 1, a, &out);
      last_.fetched = std::move(out.selected);
      last_.forwards = 1;
      break;
    case DecodeMethod::kSpeCache: {
      if (static_cast<int64_t>(P) + 2 > c.context_length) {
        throw InputError(model_.path() + ": specache step at position " + std::to_string(P) +
                         " needs two positions; the context length is " +
                         std::to_string(c.context_length));
      }
      if (!predecoded_) {
        // Pre-decoding (Algorithm 2): T_1 over the low-bit cache picks K_1 and yields T'_2.
        LowBitAttention pre;
        pre.lowbit = &low_;
        pre.capture_row = 0;
        pre.capture_k = options_.k;
        pre.capture_limit = low_.low_bit_tokens();
        LowBitAttentionResult po;
        const ForwardResult pr =
            model_.ForwardLowBit(std::span<const int32_t>(tok, 1), &cache_, 0, pre, &po);
        next_fetch_ = std::move(po.captured);
        speculative_ = ArgMax(pr.LastLogits(c.vocab_size));
        predecoded_ = true;
        ++last_.forwards;
      }
      // Decoding (Algorithm 3, eq. 1): [T_t, T'_{t+1}] with C' ∪ C_{K_t}; T'_{t+1}'s attention
      // picks K_{t+1} among the positions that are low-bit once T_t's K/V is appended.
      const int32_t both[2] = {token, speculative_};
      a.fetched = &next_fetch_;
      a.capture_row = 1;
      a.capture_k = options_.k;
      a.capture_limit = std::min(LowBitTokens(P + 1, R), P + 1);
      r = model_.ForwardLowBit(std::span<const int32_t>(both, 2), &cache_, 1, a, &out);
      ++last_.forwards;
      last_.fetched = std::move(next_fetch_);
      next_fetch_ = std::move(out.captured);
      speculative_ = ArgMax(std::span<const float>(r.logits).subspan(
          static_cast<size_t>(c.vocab_size), c.vocab_size));
      break;
    }
    case DecodeMethod::kFull:
      break;
  }
  last_.exact = std::move(out.exact_topk);
  last_.exact_scores = std::move(out.exact_scores);
  last_.mass = out.mass;
  low_.Sync(cache_);  // T_t's K/V: quantized once it leaves the residual window
  keep_logits(r, 0);
  return logits_;
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
