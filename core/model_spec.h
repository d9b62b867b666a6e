#pragma once
// ModelSpec: the shape of a transformer as the policies and the cost model need it, read from
// configs/models/*.ini ([model] section). KV sizes follow from it; FLOPs and bytes of a layer
// live in models/cost_model.h. Plain value; thread-compatible.

#include <cstdint>
#include <string>

#include "core/types.h"

namespace kvtier {

// OPT: LayerNorm, ReLU FFN of ffn = 4h (two matrices), no GQA, learned positions.
// Llama: RMSNorm, SwiGLU FFN (three matrices), RoPE, optional GQA (kv_heads < heads).
enum class ModelFamily : std::uint8_t { kOpt, kLlama };

struct ModelSpec {
  std::string name;              // "opt-13b"
  ModelFamily family = ModelFamily::kLlama;
  int layers = 0;                // transformer blocks
  int hidden = 0;                // model dimension d
  int heads = 0;                 // query heads
  int kv_heads = 0;              // key/value heads (== heads without GQA)
  int head_dim = 0;              // usually hidden / heads
  int ffn = 0;                   // FFN inner dimension
  int vocab = 0;
  int dtype_bytes = 2;           // bytes per KV element (fp16 = 2)
  int max_context = 0;           // longest sequence the model accepts

  // Bytes of K (or V) of one token in one layer: kv_heads * head_dim * dtype_bytes.
  Bytes KBytesPerTokenLayer() const {
    return Bytes(kv_heads) * Bytes(head_dim) * Bytes(dtype_bytes);
  }
  // K + V of one token over all layers. OPT-30B: 2 * 48 * 7168 * 2 = 1,376,256 B.
  Bytes KvBytesPerToken() const { return 2 * Bytes(layers) * KBytesPerTokenLayer(); }
  // Bytes of one K or V chunk of `chunk_tokens` tokens (one layer, all KV heads).
  Bytes ChunkBytes(int chunk_tokens) const { return Bytes(chunk_tokens) * KBytesPerTokenLayer(); }
  // Bytes of one probe-key chunk: keys of `probe_heads` KV heads only.
  Bytes ProbeChunkBytes(int chunk_tokens, int probe_heads) const {
    return Bytes(chunk_tokens) * Bytes(probe_heads) * Bytes(head_dim) * Bytes(dtype_bytes);
  }
  // Bytes of one row: one token's key (or value) of one KV head in one layer.
  Bytes RowBytes() const { return Bytes(head_dim) * Bytes(dtype_bytes); }

  // Parameters of one transformer layer: Q, K, V, O, the FFN's matrices (OPT two, Llama three),
  // two norms (LayerNorm weight and bias, RMSNorm a weight) and OPT's biases. The cost model
  // reads every one of them once per layer step (models/cost_model.h).
  double LayerParams() const;
  // Parameters outside the layers: the final norm, the LM head and the token embeddings
  // (counted apart, as untied: Mistral-7B, Llama-2; a tied model holds one copy less).
  double OuterParams() const;
  // Bytes of all weights in GPU memory at dtype_bytes each (the decode batch's budget,
  // core/decode_engine.h). Mistral-7B: 7.24e9 parameters, 14.5 GB.
  Bytes WeightBytes() const {
    return Bytes((double(layers) * LayerParams() + OuterParams()) * double(dtype_bytes));
  }
};

std::string_view ModelFamilyName(ModelFamily family);  // "opt", "llama"

}  // namespace kvtier
