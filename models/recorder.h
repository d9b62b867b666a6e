#pragma once
// Recorder: real importance traces from a real model (`kvtier trace record`). Requests are
// built from real text, run through LlamaModel, and written as a format-v1 trace with explicit
// importance (traces/FORMAT.md): per request the prefix and query token ids and, per layer and
// KV head, the H2O column sums of the query rows over the prefix tokens (SPEC §IV-A's metric),
// quantized to 16 (or 8) bits.
//
// Two steps, so tests can drive the second with their own token ids:
//   BuildFewShotPrompts / BuildRagPrompts  text -> PromptGroups (one prefix, several queries);
//   RecordTrace                            PromptGroups -> trace file.
// RecordTrace prefills each distinct prefix once into a KvCache, then runs each of its queries
// against the full prefix KV with importance on (the cache is restored after each query), and
// optionally greedy-decodes `decode_steps` tokens after it (models/decode.h): with SpeCache at
// `decode_quant.bits` bits (or with the 16-bit cache when decode_bits is 0), storing per step
//   - the top decode_k positions of the output token's exact attention summed over layers and
//     KV heads (trace extension 1, "decode top-k");
//   - per layer and KV head, the output token's exact top decode_k low-bit positions and the
//     decode_k positions fetched in 16 bits for the step (chosen by the previous step's
//     speculative token), ranked (extension 2, traces/FORMAT.md; absent prefetched sets with
//     16-bit decoding, where every cached position is a candidate).
// Arrival times follow a Poisson process; records are written in arrival order, queries of
// different prefixes interleaved (a seeded shuffle), so the trace has prefix reuse.
//
// Memory: records are held until all are recorded (explicit scores are ~2 B per layer, KV head
// and prefix token: 30 x 3 x 2 x 512 = 92 KB per SmolLM2 request at a 512-token prefix).
// Not thread-safe; RecordTrace uses the model's own threading.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/eval.h"
#include "models/llama.h"

namespace kvtier {

// One reusable prefix and the queries asked with it, as token ids.
struct PromptGroup {
  std::vector<int32_t> prefix;
  std::vector<std::vector<int32_t>> queries;
};

struct FewShotPromptOptions {
  int prompts = 8;               // distinct prefixes
  int queries_per_prompt = 4;    // queries sharing each prefix
  int examples_min = 2;          // examples per prefix, uniform in [min, max] (paper: 2-10)
  int examples_max = 10;
  int max_prefix_tokens = 2048;  // examples are dropped from the end beyond this
  std::uint64_t seed = 1;
};

// Few-shot prompts as in SPEC §VI-A: `examples` gold-answered examples of the task's pool as the
// shared prefix (a task header line first), a task item's question as the query (its context,
// "...\nAnswer:"; items taken in order, each used once).
std::vector<PromptGroup> BuildFewShotPrompts(const LlamaModel& model, const McTask& task,
                                             const FewShotPromptOptions& options);

struct RagPromptOptions {
  int prompts = 8;              // distinct prefixes (document sets)
  int queries_per_prompt = 4;
  int docs_per_prompt = 3;      // documents per prefix
  int doc_tokens = 160;         // tokens per document excerpt (cut at a word boundary)
  int max_prefix_tokens = 2048;
  std::uint64_t seed = 1;
};

// RAG-style prompts: documents are consecutive excerpts of the texts in `text_dir` (*.txt, the
// repository's data/texts); a prefix is "Document i:\n<excerpt>\n\n" for `docs_per_prompt`
// excerpts; each query asks where a phrase taken from one of those documents (a different
// document and place per query) occurs: "Question: Which document mentions \"<phrase>\", and
// what does it say about it?\nAnswer:". So different queries on one prefix are about different
// parts of it, the RAG case of SPEC §III-B. Throws InputError when no text is found.
std::vector<PromptGroup> BuildRagPrompts(const LlamaModel& model, const std::string& text_dir,
                                         const RagPromptOptions& options);

struct RecordOptions {
  std::string model_name = "smollm2-135m";  // header model descriptor (configs/models/)
  std::string workload = "fewshot";         // header metadata
  std::string source;                       // header metadata: where the text came from
  int bits = 16;                            // 8 or 16
  double rate = 1.0;                        // Poisson arrivals, requests per second
  std::uint64_t seed = 1;                   // arrivals and interleaving
  int decode_steps = 0;                     // greedy decode steps with top-k (0 = none)
  int decode_k = 16;                        // positions per decode step (and set)
  int decode_bits = 2;                      // SpeCache's low-bit copy: 1 or 2; 0 = 16-bit decode
  KiviConfig decode_quant;                  // group, residual, improved 1-bit (bits: decode_bits)
  std::int64_t output_tokens = 0;           // Request::output_tokens when decode_steps == 0
  // Called after each request with (done, total).
  std::function<void(int, int)> progress;
};

struct RecordSummary {
  std::int64_t records = 0;
  std::uint64_t bytes = 0;
  std::int64_t prefix_tokens = 0;   // tokens prefilled (distinct prefixes)
  std::int64_t query_tokens = 0;    // query tokens run with importance
  std::int64_t decode_tokens = 0;
  double seconds = 0;               // model time (prefill + queries + decode)
  double tokens_per_s() const {
    return seconds > 0 ? (prefix_tokens + query_tokens + decode_tokens) / seconds : 0;
  }
  double requests_per_s() const { return seconds > 0 ? records / seconds : 0; }
};

// Records `groups` into a trace at `path`. Throws InputError when a group has no queries, a
// prefix is empty, a prompt exceeds the model's context, or the file cannot be written.
RecordSummary RecordTrace(const LlamaModel& model, const std::vector<PromptGroup>& groups,
                          const RecordOptions& options, const std::string& path);

}  // namespace kvtier
