#pragma once
// The tiny model, scores and requests the Pipeline tests over FakeExecutor, the hw executor's
// tests and the parity tests share (each had its own copy): a model small enough that a chunk
// is a few hundred bytes, importance every head agrees on, and requests sharing a prefix.

#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <vector>

#include "core/model_spec.h"
#include "core/request.h"

namespace kvtier::testing {

// `layers` layers of 4 heads (4 KV heads) of dimension 4, fp16: K (or V) of one token in one
// layer is 4 * 4 * 2 = 32 B; a 4-token chunk 128 B.
inline ModelSpec TinyModel(int layers = 3) {
  ModelSpec m;
  m.name = "tiny";
  m.family = ModelFamily::kLlama;
  m.layers = layers;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 4;
  m.ffn = 32;
  m.vocab = 100;
  m.dtype_bytes = 2;
  m.max_context = 4096;
  return m;
}

// Every head ranks tokens the same way: ITF's probes agree, so it keeps a shared subset of
// each chunk. A ScriptedScores::Fn.
inline float Agreeing(const Request&, int layer, int, std::int64_t t) {
  return float((t * 7 + layer) % 13);
}

// Requests 1, 2, ... with prefixes of `lengths` tokens, all counting up from token 1000 (so
// each shares the shorter ones' prefix: the first stores it, the later ones reuse and extend
// it), 6 query tokens each.
inline std::vector<Request> PrefixRequests(std::initializer_list<std::int64_t> lengths) {
  std::vector<Request> out;
  int i = 0;
  for (const std::int64_t length : lengths) {
    Request r;
    r.id = RequestId(++i);
    r.prefix.resize(std::size_t(length));
    std::iota(r.prefix.begin(), r.prefix.end(), 1000);
    r.query_tokens = 6;
    out.push_back(r);
  }
  return out;
}

}  // namespace kvtier::testing
