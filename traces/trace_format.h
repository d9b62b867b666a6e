#pragma once
// In-memory form of an importance trace, format v1 (byte layout: traces/FORMAT.md).
// A trace is a header (version, producer, source model, chunk size, optional procedural
// importance model, free metadata) and a stream of records, one per request: the Request
// (arrival, prefix symbols, query length), optional query token ids, and an importance payload
// in one of three forms (none / explicit quantized scores / procedural), plus optional
// extensions (decode-step attention top-k, summed and per layer / KV head). Plain values;
// thread-compatible.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/request.h"
#include "traces/importance_model.h"

namespace kvtier {

inline constexpr char kTraceMagic[8] = {'K', 'V', 'T', 'R', 'A', 'C', 'E', '1'};
inline constexpr std::uint32_t kTraceVersion = 1;

enum class PrefixKind : std::uint8_t { kTokens = 0, kBlocks = 1 };
enum class ImportanceKind : std::uint8_t { kNone = 0, kExplicit = 1, kProcedural = 2 };
const char* ImportanceKindName(ImportanceKind kind);  // "none", "explicit", "procedural"

// The model the trace was recorded on (or generated for).
struct ModelDescriptor {
  std::string name;  // "opt-13b", "smollm2-135m"
  int layers = 0;
  int heads = 0;     // query heads
  int kv_heads = 0;  // KV heads (rows of importance per layer)
};

struct TraceHeader {
  std::uint32_t version = kTraceVersion;
  std::string producer;  // "kvtier trace gen 0.1", "kvtier trace import-mooncake"
  ModelDescriptor model;
  int chunk_tokens = 0;  // 0 when not relevant
  // Parameters of the importance model for procedural records (absent: none may be procedural).
  std::optional<ProceduralParams> procedural;
  // Free key/value metadata: "workload", "arrival" ("poisson" | "closed:<clients>"), "source".
  std::vector<std::pair<std::string, std::string>> metadata;

  std::string Meta(const std::string& key, const std::string& fallback = "") const;
};

// Explicit importance: rows (layer-major, then head) of `tokens` scores each, quantized in the
// log2 domain with a per-row range [lo, hi]: code 0 is a score of exactly 0; code c >= 1 is
// 2^(lo + (c - 1) * (hi - lo) / (2^bits - 2)). 16 bits: relative step (hi - lo) / 65534 in log2.
struct ExplicitScores {
  int layers = 0;
  int kv_heads = 0;
  std::int64_t tokens = 0;
  int bits = 16;                     // 8 or 16
  std::vector<float> lo, hi;         // per row: log2 range of the row's nonzero scores
  std::vector<std::uint16_t> codes;  // rows * tokens

  std::int64_t rows() const { return std::int64_t(layers) * kv_heads; }
  // Encoded payload size in bytes (what the record stores for the scores).
  std::uint64_t EncodedBytes() const;
  // Dequantized first n scores of (layer, head) into out[0..n).
  void Row(int layer, int head, std::int64_t n, float* out) const;

  // Quantizes scores[(layer * kv_heads + head) * tokens + t]. Throws InputError on a NaN,
  // infinite or negative score (naming row and token). REQUIRES: bits is 8 or 16.
  static ExplicitScores Quantize(int layers, int kv_heads, std::int64_t tokens,
                                 std::span<const float> scores, int bits = 16);
};

// Decode-step attention top-k (SpeCache-style), an optional record extension: for each of
// `steps` decode steps, `k` token positions (into prefix + query + generated tokens) with the
// highest attention, aggregated over heads and layers.
struct DecodeTopK {
  int steps = 0;
  int k = 0;
  std::vector<std::int64_t> positions;  // steps * k
};

// Decode-step top-k sets per layer and KV head (SpeCache; extension tag 2). For decode step s
// (s = 0 decodes the first output token after the prompt) and each (layer, KV head), up to k
// positions (into prefix + query + generated tokens), ranked best first, so the top-k' sets of
// any k' <= k are prefixes:
//   output      the output token's exact (16-bit) attention top-k among the step's candidates,
//               summed over the KV head's query heads;
//   prefetched  the set the step read in 16 bits: SpeCache's K_t, chosen by the previous step's
//               speculative token (by pre-decoding for step 0) over the low-bit copy.
// candidates[s] is how many positions were candidates (positions [0, candidates[s]) have a
// low-bit key or value; with a 16-bit decode every cached position is one); context[s] is the
// number of cached positions at step s. A set holds min(k, candidates[s]) positions. The
// decode configuration (bits, group, residual) is in the header metadata (`decode_*` keys).
struct DecodeTopKSets {
  int steps = 0;
  int k = 0;
  int layers = 0;
  int kv_heads = 0;
  std::vector<std::int64_t> context, candidates;  // per step
  // Ranked sets, [(step * layers + layer) * kv_heads + head]; either may be empty (absent).
  std::vector<std::vector<std::int64_t>> output, prefetched;

  std::size_t Index(int step, int layer, int head) const {
    return (static_cast<std::size_t>(step) * layers + layer) * kv_heads + head;
  }
};

struct TraceRecord {
  Request request;
  PrefixKind prefix_kind = PrefixKind::kTokens;
  std::vector<std::uint64_t> query_ids;  // query token ids when known (else empty)
  ImportanceKind importance = ImportanceKind::kNone;
  std::uint64_t query_key = 0;   // procedural: key of the query-dependent part
  ExplicitScores explicit_scores;  // when importance == kExplicit
  std::optional<DecodeTopK> decode_topk;
  std::optional<DecodeTopKSets> decode_sets;

  void Clear();
};

// Retargeting (FORMAT.md §Retargeting): layer l of a target model with `target_layers` layers
// reads layer floor(l * source_layers / target_layers); head h reads head h % source_heads.
inline int RetargetLayer(int layer, int target_layers, int source_layers) {
  return static_cast<int>(std::int64_t(layer) * source_layers / target_layers);
}
inline int RetargetHead(int head, int source_heads) { return head % source_heads; }

}  // namespace kvtier
