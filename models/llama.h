#pragma once
// LlamaModel: a CPU forward pass (Eigen, float32) for Llama-architecture GGUF models, built so
// kvtier can measure what prefix-KV policies do to a real model: prefill a prefix into a KvCache,
// then run a query against that cache with only some prefix tokens kept (per layer, optionally
// per KV head, as SPEC/H2O select them), and read back H2O attention column sums and logits.
//
// Model: token embedding -> n_layers x [RMSNorm, attention with RoPE and grouped-query heads,
// residual, RMSNorm, SwiGLU FFN, residual] -> RMSNorm -> output projection (`output.weight`,
// or the embedding when tied). RoPE rotates adjacent pairs (2i, 2i+1) of each head with
// angle pos * freq_base^(-2i/rope_dims), the layout GGUF stores q/k in (llama.cpp
// ROPE_TYPE_NORMAL). Query head h uses KV head h / (n_heads / n_kv_heads).
//
// Weights are dequantized to row-major float32 at Load (SmolLM2-135M: ~540 MB). Products with
// >= 256 rows are split by rows over OpenMP threads (OMP_NUM_THREADS, default all cores), and so
// is the per-head attention loop of large prefills; decode steps and short queries run on one
// thread (fork/join costs more than it saves there, badly so on a loaded machine).
//
// Thread safety: a loaded LlamaModel is immutable; Forward may run concurrently on distinct
// KvCaches (each call is itself multithreaded, so concurrency rarely helps).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/kivi.h"
#include "models/tokenizer.h"

namespace kvtier {

class GgufFile;

struct LlamaConfig {
  int n_layers = 0;
  int d_model = 0;         // embedding length
  int n_heads = 0;         // query heads
  int n_kv_heads = 0;      // key/value heads (GQA); n_heads % n_kv_heads == 0
  int head_dim = 0;        // attention.key_length, else d_model / n_heads
  int d_ff = 0;            // feed_forward_length
  int vocab_size = 0;
  int context_length = 0;  // the most positions a Forward may reach
  int rope_dims = 0;       // rope.dimension_count (<= head_dim), else head_dim
  double rope_theta = 10000.0;
  float rms_eps = 1e-5f;

  int group_size() const { return n_heads / n_kv_heads; }  // query heads per KV head
};

// The K and V of tokens at positions 0..n_tokens-1, per layer, float32. Layout per layer:
// [n_tokens][n_kv_heads][head_dim], row-major. K is stored after RoPE at the token's own
// position, so any subset of tokens keeps its original positions. A KvCache belongs to the model
// that made it (same shapes); Forward appends to it.
struct KvCache {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_tokens = 0;
  std::vector<std::vector<float>> k;  // [layer] -> n_tokens * n_kv_heads * head_dim floats
  std::vector<std::vector<float>> v;

  // REQUIRES: indices in range.
  const float* K(int layer, int token, int kv_head) const {
    return k[layer].data() + (static_cast<size_t>(token) * n_kv_heads + kv_head) * head_dim;
  }
  const float* V(int layer, int token, int kv_head) const {
    return v[layer].data() + (static_cast<size_t>(token) * n_kv_heads + kv_head) * head_dim;
  }
  // Bytes of K and V at float32 (what a real cache would hold at fp16 is half of this).
  size_t Bytes() const;
  // Drops tokens [n, n_tokens) (e.g. to reuse a prefix with another query). REQUIRES: n <= n_tokens.
  void Truncate(int n);
};

// Which cached tokens one layer attends to.
struct LayerKeep {
  enum class Mode { kAll, kShared, kPerKvHead };
  Mode mode = Mode::kAll;
  std::vector<int32_t> shared;                   // kShared: one index set for all KV heads
  std::vector<std::vector<int32_t>> per_kv_head;  // kPerKvHead: n_kv_heads index sets

  static LayerKeep All() { return {}; }
  static LayerKeep Shared(std::vector<int32_t> kept) { return {Mode::kShared, std::move(kept), {}}; }
  static LayerKeep PerKvHead(std::vector<std::vector<int32_t>> kept) {
    return {Mode::kPerKvHead, {}, std::move(kept)};
  }
};

// A selection over the first `n_prefix` cached tokens (the reused prefix). Cached tokens at
// positions >= n_prefix (query or generated tokens appended later) are always attended, so the
// same selection can be passed to every decode step. Index sets hold positions in
// [0, n_prefix), strictly increasing; they may be empty (the layer/head then sees no prefix).
// An empty `layers` means no selection (attend to everything). Otherwise layers.size() must be
// n_layers. Violations throw InputError.
struct PrefixSelection {
  int n_prefix = 0;
  std::vector<LayerKeep> layers;

  bool empty() const { return layers.empty(); }
  // The same kept set in every layer and head.
  static PrefixSelection SameEverywhere(int n_layers, int n_prefix, std::vector<int32_t> kept);
};

// H2O importance (Zhang et al., "H2O: Heavy-Hitter Oracle", sec. 3; SPEC's important-token
// selection): for each attended column j, the sum over the Forward's query rows i of the softmax
// weight a[i][j]. Columns are positions: [0, n_cached) the cache as it was before the call,
// [n_cached, n_cached + n_new) the new tokens. Columns not attended (not kept, or causally
// masked for every row) are 0. Every row's weights sum to 1, so each head's column sums add up
// to n_query_rows.
struct AttentionImportance {
  int n_query_rows = 0;
  int n_cached = 0;
  int n_columns = 0;                                   // n_cached + n_query_rows
  std::vector<std::vector<std::vector<float>>> per_q_head;   // [layer][q_head][column]
  std::vector<std::vector<std::vector<float>>> per_kv_head;  // [layer][kv_head][column], group sum
};

struct ForwardOptions {
  bool all_logits = false;    // logits for every new position, not only the last
  bool importance = false;    // fill ForwardResult::importance
  bool update_cache = true;   // append the new tokens' K/V to the cache
};

struct ForwardResult {
  int n_new = 0;
  int first_position = 0;      // position of the first new token (= cache size before the call)
  int logits_rows = 0;         // n_new with all_logits, else 1 (the last position)
  std::vector<float> logits;   // [logits_rows][vocab_size]
  std::vector<float> hidden;   // [n_new][d_model], after the final RMSNorm (for NextTokenLogProbs)
  AttentionImportance importance;  // empty unless ForwardOptions::importance

  // The last position's logits (vocab_size floats).
  std::span<const float> LastLogits(int vocab_size) const {
    return std::span<const float>(logits).subspan(static_cast<size_t>(logits_rows - 1) * vocab_size,
                                                  vocab_size);
  }
};

// Low-bit attention for one decode forward (KIVI and SpeCache; models/decode.h drives it).
// A cached position p reads its key from `lowbit` when p < lowbit->key_tokens() and its value
// when p < lowbit->value_tokens(), unless p is fetched (then both are read in full precision
// from the KvCache: SpeCache's C' ∪ C_K, eq. 1); the residual window and the new rows are full
// precision. New rows attend causally to each other.
struct LowBitAttention {
  const KiviCache* lowbit = nullptr;  // REQUIRED, synced to the KvCache (KiviCache::Sync)
  // SpeCache: per layer, per KV head, the cached positions read in 16 bits (distinct, in
  // [0, cache size)). Null or empty: none (KIVI).
  const std::vector<std::vector<std::vector<int32_t>>>* fetched = nullptr;
  // SpeCache without speculation (paper Table 4, non-speculative fetching): when > 0, each
  // layer first attends row 0 over the low-bit cache, takes each KV head's top self_select_k
  // low-bit positions by that attention (summed over the head's query heads), reads them in 16
  // bits and computes the layer's attention again. `fetched` is then ignored.
  int self_select_k = 0;
  // Speculative top-k: the ranked top capture_k positions in [0, capture_limit) of row
  // capture_row's attention, per KV head (summed over its query heads). -1: none.
  int capture_row = -1;
  int capture_k = 0;
  int capture_limit = 0;
  // Measurement: row exact_row's exact attention (full-precision keys at every position): its
  // ranked top exact_k low-bit positions per KV head and the share of its low-bit attention
  // mass that the 16-bit set covers. -1: none.
  int exact_row = -1;
  int exact_k = 0;
  bool keep_exact_scores = false;  // also return the exact per-KV-head scores
};

// What ForwardLowBit measured, per layer and KV head (empty when not asked for).
struct LowBitAttentionResult {
  std::vector<std::vector<std::vector<int32_t>>> selected;    // self-selected sets, ranked
  std::vector<std::vector<std::vector<int32_t>>> captured;    // capture_row's top-k, ranked
  std::vector<std::vector<std::vector<int32_t>>> exact_topk;  // exact_row's top-k, ranked
  // exact_row's exact attention, summed over each KV head's query heads, columns
  // [0, cache size + exact_row] (keep_exact_scores only).
  std::vector<std::vector<std::vector<float>>> exact_scores;
  // Sums over (layer, query head) of exact_row's attention: mass on low-bit positions
  // (`low_bit`, `heads` terms), and, over the terms whose low-bit mass is > 0 (`shares`), the
  // share of that mass on the 16-bit set (the hit rate) and on the exact top-k (its best case).
  struct Mass {
    double low_bit = 0, hit_share = 0, oracle_share = 0;
    std::int64_t heads = 0, shares = 0;
  } mass;
};

class LlamaModel {
 public:
  // Loads a Llama-architecture GGUF (general.architecture == "llama"): config from metadata,
  // all weights dequantized, the tokenizer when the file has one. Throws ModelFileError naming
  // the file and the key or tensor that is missing, mis-shaped or of an unsupported type.
  static std::unique_ptr<LlamaModel> Load(const std::string& path);
  ~LlamaModel();

  const LlamaConfig& config() const { return config_; }
  const std::string& path() const { return path_; }
  // Null when the file carries no tokenizer metadata.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // Ids from the tokenizer; throws InputError when the model has none.
  std::vector<int32_t> Tokenize(const std::string& text) const;

  // An empty cache shaped for this model.
  KvCache NewCache() const;

  // Runs `tokens` at positions cache->n_tokens, cache->n_tokens + 1, ... . Each new token
  // attends to the cached tokens that `selection` keeps (all when it is empty) and causally to
  // the new tokens up to itself. With update_cache the new K/V are appended to `cache`.
  // Throws InputError when tokens is empty, an id is outside the vocabulary, the positions would
  // pass config().context_length ("... longer than the context ..."), or the selection is
  // malformed. REQUIRES: cache made by this model's NewCache (or a Forward on one).
  ForwardResult Forward(std::span<const int32_t> tokens, KvCache* cache,
                        const PrefixSelection& selection = {},
                        const ForwardOptions& options = {}) const;

  // A decode forward with low-bit attention (LowBitAttention): `tokens` run at positions
  // cache->n_tokens, ..., logits for every row; the first `append_rows` rows' K/V are appended
  // to `cache` (SpeCache keeps the output token's, not the speculative token's). `out` (may be
  // null) receives the measurements. Throws InputError as Forward does.
  // REQUIRES: attention.lowbit synced to `cache`; rows named by attention are new rows.
  ForwardResult ForwardLowBit(std::span<const int32_t> tokens, KvCache* cache, int append_rows,
                              const LowBitAttention& attention,
                              LowBitAttentionResult* out) const;

  // Several sequences' forwards in one pass over the weights (their rows share every
  // projection and FFN product; attention stays per sequence): the result of each item is
  // what Forward (no selection; `importance` as ForwardOptions::importance) or ForwardLowBit
  // would return for it alone, logits for every row. Items must use distinct caches.
  struct BatchForward {
    std::span<const int32_t> tokens;
    KvCache* cache = nullptr;
    int append_rows = 0;                       // first rows whose K/V are appended
    const LowBitAttention* low_bit = nullptr;  // null: 16-bit attention over the whole cache
    LowBitAttentionResult* low_bit_out = nullptr;
    bool importance = false;                   // 16-bit items: fill ForwardResult::importance
  };
  std::vector<ForwardResult> ForwardBatch(std::span<const BatchForward> batch) const;

  // Forward on an empty cache; returns the cache through `cache`.
  ForwardResult Prefill(std::span<const int32_t> tokens, KvCache* cache,
                        const ForwardOptions& options = {}) const;

  // log p(next[i] | tokens up to row i of `result`), for i < next.size() <= result.n_new.
  // Computes logits from result.hidden in blocks, so long texts need not keep all logits.
  std::vector<double> NextTokenLogProbs(const ForwardResult& result,
                                        std::span<const int32_t> next) const;

  // Greedy decoding: prefills `prompt` (into a fresh cache), then emits up to max_new tokens,
  // stopping after `stop_id` (pass -1 for none). Returns the new tokens only.
  std::vector<int32_t> Generate(std::span<const int32_t> prompt, int max_new,
                                int32_t stop_id = -1) const;

  // exp(mean negative log-likelihood) of tokens[1..] given the preceding tokens, one prefill.
  // REQUIRES: tokens.size() >= 2. Throws InputError when longer than the context.
  double Perplexity(std::span<const int32_t> tokens) const;

 private:
  struct Weights;
  LlamaModel();

 public:
  class Attention;  // one layer's attention (llama.cc): Forward's and ForwardLowBit's

 private:
  void CheckInput(std::span<const int32_t> tokens, const KvCache& cache) const;
  // The layers: embedding, per layer norm/QKV/RoPE, `attention`, output projection and FFN;
  // appends the first `append_rows` new rows' K/V to `cache`.
  ForwardResult Run(std::span<const int32_t> tokens, KvCache* cache, int append_rows,
                    bool all_logits, Attention* attention) const;
  struct RunItem {
    std::span<const int32_t> tokens;
    KvCache* cache;
    int append_rows;
    Attention* attention;
  };
  // Run for several sequences, their rows stacked in every product (RunItem order).
  std::vector<ForwardResult> RunBatch(std::span<const RunItem> items, bool all_logits) const;

  std::string path_;
  LlamaConfig config_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

// Index of the largest logit (lowest index on ties).
int32_t ArgMax(std::span<const float> logits);

}  // namespace kvtier
