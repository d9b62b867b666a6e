#pragma once
// The procedural importance model: per (request, layer, KV head, prefix token) an H2O-like score,
// regenerated deterministically from a few parameters and a seed, so synthetic traces of
// 30B-class models cost no storage. Scores for one (request, layer, head subset) are generated
// lazily with a counter-based hash keyed by (seed, prefix token identity or query, layer, head,
// token); nothing depends on the order of calls, so replay is bit-identical.
//
// Model (all components are unit-variance, independent, counter-generated noise):
//   z[l,h,t]   = sqrt(1-g) * zs[l,h,t](prefix) + sqrt(g) * zq[l,h,t](query)
//   z*[l,h,t]  = sqrt(w_l) * c*[l,t] + sqrt(1-w_l) * e*[l,h,t]          (* = s or q)
//   c*[l,t]    = cos(a_l) A*_i(t) + sin(a_l) A*_{i+1}(t),  l*phi = i*pi/2 + a_l, phi = acos(rho)
//   log2 score = tail * z + (t < sink_tokens ? sink_boost : 0),  score = 2^(log2 score)
// - w_l (head_corr): correlation of two heads of layer l -> head similarity (Observation I/II);
// - rho (layer_corr): correlation of the shared component of adjacent layers (Observation III);
//   the shared component rotates slowly through a chain of anchor fields A_0, A_1, ...;
// - g (query_dependence): correlation of the same head for two queries on the same prefix is
//   1 - g -> recall of a statically pre-identified set (§III-A, ~80%);
// - sinks: the first tokens get a large boost in every head; tail: lognormal-like heavy tail.
// The prefix part is keyed by the prefix token's identity (a chain hash of the prefix symbols up
// to it), so requests sharing a prefix share exactly that part, as a cache would share the KV.
// Thread-compatible; Scores() is const and may run concurrently.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/request.h"

namespace kvtier {

struct ProceduralParams {
  // Model version: 1 (the formula above; every trace and `workload.importance` string written
  // before versions existed) or 2 (model=v2: the structure of ImportanceModel v2 below).
  int model = 1;
  std::uint64_t seed = 1;
  // Correlation of two heads' log-scores per layer, as a depth profile: entry i stands for
  // relative depth i / (size - 1); layers in between interpolate linearly. One entry = constant.
  std::vector<double> head_corr = {0.8};
  double layer_corr = 0.9;        // rho in [0, 1]
  double query_dependence = 0.2;  // g in [0, 1]
  int sink_tokens = 4;            // leading prefix tokens boosted in every head
  double sink_boost = 6.0;        // log2 units
  double tail = 1.5;              // std of log2 score of non-sink tokens
  // Version 2 only (ignored by version 1; defaults reduce v2 to v1's structure).
  double persistent = 0;          // pi: share of the layer-shared field held by P[t]
  double persistent_query = 0;    // g_p: query share of the persistent field
  double head_spread = 0;         // sigma_w: sd of the per-(request, layer) logit of head_corr
  double tail_shape = 0;          // kappa: heavy-tail skew of the shared field (0: none)

  // Throws InputError naming the offending parameter (`where` prefixes the message).
  void Validate(const std::string& where) const;
  // "seed=1 head_corr=0.8,0.6 layer_corr=0.9 ..." (one line, the INI keys of FORMAT.md).
  // Version 1 prints exactly the keys it always printed; version 2 appends "model=v2" and its
  // parameters.
  std::string ToString() const;
  // Parses the ToString() form ("seed=1 head_corr=0.8,0.6 layer_corr=0.9 ..."; missing keys
  // keep their defaults), as experiments name an importance model in `workload.importance`.
  // Throws ConfigError prefixed by `where` for an unknown key or an unparsable value.
  static ProceduralParams Parse(const std::string& text, const std::string& where);
};

// 32-bit key per prefix token: the chain hash of the prefix symbols up to the token's symbol and
// the token's offset in it. Equal for two requests exactly where their prefixes agree (so far).
// Writes request.prefix_tokens() keys (at most `max_tokens` when >= 0).
void PrefixTokenKeys(const Request& request, std::vector<std::uint32_t>* keys,
                     std::int64_t max_tokens = -1);

// Default query key of a request (used when a trace record gives none).
std::uint64_t DefaultQueryKey(std::uint64_t seed, RequestId id);

class ImportanceModel {
 public:
  // `layers` and `kv_heads` are the replayed model's; the head_corr profile is read by
  // relative depth, so one parameter set serves any model size.
  // REQUIRES: params.Validate() passes; layers >= 1; kv_heads >= 1.
  ImportanceModel(const ProceduralParams& params, int layers, int kv_heads);

  const ProceduralParams& params() const { return params_; }
  int layers() const { return layers_; }
  int kv_heads() const { return kv_heads_; }
  double head_corr(int layer) const { return w_[layer]; }

  // Fills out[j * n + t] for j < heads.size(), t < n with the scores of tokens 0..n-1.
  // REQUIRES: token_keys.size() >= n; 0 <= layer < layers(); every head in [0, kv_heads()).
  void Scores(std::span<const std::uint32_t> token_keys, std::uint64_t query_key, int layer,
              std::span<const int> heads, std::int64_t n, float* out) const;

 private:
  ProceduralParams params_;
  int layers_;
  int kv_heads_;
  std::vector<double> w_;  // head_corr per layer
  double phi_;             // rotation per layer (acos rho)
};

}  // namespace kvtier
