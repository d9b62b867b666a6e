#pragma once
// Test helpers for models/: a tiny Llama GGUF the tests write themselves, a tiny byte-level BPE
// vocabulary, and a naive double-precision reference forward pass to compare LlamaModel with.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "models/gguf_writer.h"

namespace kvtier::testing {

struct TinySpec {
  int n_layers = 2;
  int d_model = 64;
  int n_heads = 4;
  int n_kv_heads = 2;
  int d_ff = 96;
  int context_length = 64;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied = false;  // no output.weight: the embedding doubles as output projection
  uint32_t seed = 1;
};

// The tiny vocabulary: 256 byte symbols (GPT-2 order of bytes_to_unicode), then the merges'
// results, then <|im_start|> and <|im_end|> (control). Merges, in rank order:
// "h e", "l l", "he ll", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ t", "Ġt he".
struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  int32_t Id(const std::string& token) const;
};
TinyVocab MakeTinyVocab();
// Adds the tokenizer.* metadata of `vocab` to `w`.
void AddTinyTokenizer(const TinyVocab& vocab, GgufWriter* w);

// Writes a tiny Llama GGUF with random weights and a mix of tensor types (F32, F16, Q4_0, Q4_1,
// Q8_0) to `path`; returns the vocabulary size.
int WriteTinyLlama(const std::string& path, const TinySpec& spec);

// Naive double-precision forward over `tokens` (positions 0..T-1) of the Llama GGUF at `path`.
// Tokens [0, n_prefix) attend causally to everything before them. Tokens at i >= n_prefix attend
// to the prefix positions in kept[layer][kv_head] (all of [0, n_prefix) when kept is empty) and
// to [n_prefix, i]. Returns logits for rows >= n_prefix and, per layer and query head, the sum
// over those rows of attention weights on each column [0, T).
struct RefResult {
  std::vector<std::vector<double>> logits;                   // [row - n_prefix][vocab]
  std::vector<std::vector<std::vector<double>>> colsum;      // [layer][q_head][column]
};
RefResult ReferenceForward(const std::string& path, const std::vector<int32_t>& tokens,
                           int n_prefix,
                           const std::vector<std::vector<std::set<int32_t>>>& kept);

// Naive double-precision reference of decoding with a low-bit KV cache (models/decode.h), for
// the Llama GGUF at `path`: the prompt is prefilled at full precision, then `outputs[t]` is
// the output token of step t. The KIVI copy is requantized from scratch every step (eq. 2 / 3
// written out again here, in float like the model's), each head's attention reads explicit
// per-position keys and values, top-k sets are chosen by sorting.
struct RefDecodeOptions {
  std::string method = "full";  // full | kivi | specache | specache_nospec
  int bits = 2;
  int group = 4;
  int residual = 8;
  bool improved_1bit = true;
  int k = 4;
};
struct RefDecodeResult {
  std::vector<std::vector<double>> logits;  // per step: logits of the token after the output
  // per step, [layer][kv_head]: the positions the output token read in 16 bits (specache*)
  std::vector<std::vector<std::vector<std::set<int32_t>>>> fetched;
  std::vector<int32_t> speculative;  // specache: the speculative token decoded with each step
};
RefDecodeResult ReferenceDecode(const std::string& path, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& outputs, const RefDecodeOptions& o);

}  // namespace kvtier::testing
