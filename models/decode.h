#pragma once
// Decoding with a low-bit KV cache on the real model: the 16-bit cache, KIVI, SpeCache and
// SpeCache without speculation (Jie et al., "SpeCache: Speculative Key-Value Caching for
// Efficient Generation of LLMs", ICML 2025). A Decoder takes a prompt prefilled at full
// precision (SpeCache Algorithm 1: the prefill computes with the 16-bit KV, then quantizes it)
// and decodes one output token per Step:
//   full             attention over the 16-bit cache (the reference);
//   kivi             attention over the low-bit copy (models/kivi.h) plus the 16-bit residual
//                    window of the most recent tokens;
//   specache         §3.3 / Algorithms 2-3: each step decodes the output token T_t and the
//                    speculative token T'_{t+1} together (positions P and P+1, eq. 1). Both attend
//                    to the low-bit cache in which the prefetched top-k positions K_t of every
//                    layer and KV head are replaced by their 16-bit K and V. The speculative
//                    token's attention (summed over the KV head's query heads) picks K_{t+1},
//                    the top-k low-bit positions, for the next step. Only the output token's
//                    K/V is appended (the next step recomputes T_{t+1} exactly). The next output
//                    token is row 0's argmax, the next speculative token row 1's. Pre-decoding
//                    (Algorithm 2) runs before the first step: T_1 alone over the low-bit cache
//                    picks K_1 and yields T'_2; it appends nothing.
//   specache_nospec  Table 4's non-speculative fetching: the output token alone; each layer
//                    attends over the low-bit cache, fetches its own top-k and attends again
//                    (same accuracy behaviour as a speculative token that is always exact).
// Top-k candidates are the positions whose key or value is low-bit (the residual window is in
// 16 bits already); with fewer candidates than k all of them are fetched.
//
// Step(token) takes the output token from the caller, so a caller can decode greedily (pass
// the argmax of the previous Step) or teacher-forced (pass the text's next token); the
// speculative token is always the decoder's own guess.
//
// Measurement (DecodeOptions::measure): every step also computes the output token's exact
// attention (16-bit keys everywhere) per layer and query head: the share of its attention mass
// on low-bit positions, and the share of that mass that falls on the 16-bit set (the hit rate)
// and on the exact top-k (the best any k-set can do).
//
// Thread safety: a Decoder is single-threaded state over an immutable LlamaModel; run one
// Decoder per thread.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/kivi.h"
#include "models/llama.h"

namespace kvtier {

enum class DecodeMethod { kFull, kKivi, kSpeCache, kSpeCacheNoSpec };
// "full", "kivi", "specache", "specache_nospec".
const char* DecodeMethodName(DecodeMethod method);

struct DecodeOptions {
  DecodeMethod method = DecodeMethod::kFull;
  KiviConfig quant;       // kivi, specache, specache_nospec
  int k = 64;             // specache*: 16-bit pairs per layer and KV head
  bool measure = false;   // exact attention of the output token every step (costs ~1 attention)
  int measure_k = 0;      // size of the exact top-k (0: k; kivi: none, only the masses)
  bool keep_exact_scores = false;  // DecodeStepInfo::exact_scores (the recorder)
};

using PositionSets = std::vector<std::vector<std::vector<int32_t>>>;  // [layer][kv_head]

// What one Step did.
struct DecodeStepInfo {
  int context = 0;   // cached positions before the step (the output token's position)
  int low_bit = 0;   // of them, positions with a low-bit key or value (top-k candidates)
  // The 16-bit set the output token attended with, ranked (specache: chosen by the previous
  // speculative token or pre-decoding; specache_nospec: by its own low-bit attention).
  PositionSets fetched;
  // measure: the output token's exact top-measure_k low-bit positions, ranked.
  PositionSets exact;
  // measure && keep_exact_scores: its exact attention per KV head (sum over the KV head's query
  // heads), columns [0, context] (the last is the output token itself); for `full`, columns
  // [0, context].
  std::vector<std::vector<std::vector<float>>> exact_scores;
  LowBitAttentionResult::Mass mass;  // measure: sums over layers and query heads
  int forwards = 0;                  // forward passes the step ran (2 with pre-decoding)
};

class Decoder {
 public:
  // `prefilled` holds the prompt's K/V computed at full precision (Prefill). Throws
  // InputError for a bad configuration (KiviConfig::Validate, k < 1 for specache*).
  Decoder(const LlamaModel& model, KvCache prefilled, const DecodeOptions& options);

  // Decodes `token` as the output token at position cache().n_tokens and returns the logits
  // of the token after it (vocab_size floats, valid until the next Step). Throws InputError
  // when the step would pass the context length (specache needs one position more for the
  // speculative token) or the token is not in the vocabulary.
  std::span<const float> Step(int32_t token);

  // Steps several decoders at once, decoders[i] with output token tokens[i]: the same as
  // calling Step on each, but their forwards share one pass over the weights
  // (LlamaModel::ForwardBatch), as a batched decode does. REQUIRES: distinct decoders of one
  // model; tokens.size() == decoders.size(). Read each one's logits with logits().
  static void StepBatch(std::span<Decoder* const> decoders, std::span<const int32_t> tokens);
  // The logits the last Step / StepBatch returned.
  std::span<const float> logits() const { return logits_; }

  const DecodeStepInfo& last() const { return last_; }
  const KvCache& cache() const { return cache_; }
  const DecodeOptions& options() const { return options_; }
  // The speculative token the next step will decode (specache; -1 before the first Step).
  int32_t speculative_token() const { return speculative_; }

 private:
  // StepBatch's halves: pre-decoding (specache's first step) and the step's forward.
  bool NeedsPreDecode() const;
  LlamaModel::BatchForward PreparePreDecode(int32_t token);
  void FinishPreDecode(const ForwardResult& r);
  LlamaModel::BatchForward Prepare(int32_t token);
  void Finish(const ForwardResult& r);

  const LlamaModel& model_;
  DecodeOptions options_;
  KvCache cache_;
  KiviCache low_;
  PositionSets next_fetch_;  // specache: K_t for the coming step
  bool predecoded_ = false;
  int32_t speculative_ = -1;
  std::vector<float> logits_;
  DecodeStepInfo last_;
  // The forward being prepared / finished.
  int32_t tokens_[2] = {0, 0};
  LowBitAttention plan_;
  LowBitAttentionResult plan_out_;
};

// Bytes of K and V the GPU holds for one sequence of `context` tokens under `options`
// (16-bit values for `full`; the KIVI copy plus, for specache*, k fetched 16-bit pairs per
// layer and KV head), and the ratio to the 16-bit cache (SpeCache Table 1's "KV cache size").
std::uint64_t DecodeGpuKvBytes(const LlamaConfig& config, const DecodeOptions& options,
                               int context);
double DecodeKvSizeRatio(const LlamaConfig& config, const DecodeOptions& options, int context);

}  // namespace kvtier
