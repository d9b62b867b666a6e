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
//
// Version 2 (`model=v2`; importance-statistics.md and docs/real-model-observations.md give the
// measurements it follows) keeps the head and query structure and replaces the layer-shared
// component c by
//   x[l,t] = sqrt((1-pi)(1-s)) c[l,t] + sqrt((1-pi) s) c'[l,t] + sqrt(pi) P[t]
//   y[l,t] = sqrt(1-nu) x[l,t] + sqrt(nu) X[l,t] + R(N-1-t)
//   P[l,t] = sqrt(1-g_p) Ps[l,t] + sqrt(g_p) Pq[l,t], constant in l when rho_p = 1, else a
//            chain like c with adjacent-layer correlation rho_p (a drift over the whole depth)
// - P (persistent): one per-token latent shared by every layer, so the same tokens win in
//   layer after layer (layer-set Jaccard that flattens far above random with distance, a large
//   layer-share dispersion); Ps is keyed by the prefix token, Pq by the query (g_p), so P is
//   largely the same for every query on a prefix (cross-query correlation of f);
// - c' (slow chain): as c, with adjacent-layer correlation rho_s (slow_corr) close to 1, so
//   sets drift over many layers (the slow decline of Jaccard with layer distance);
// - X: x at knots every m positions, linear in between (important phrases: neighbours share
//   importance, so a layer's set touches fewer chunks in stored order);
// - R: a recency boost by distance from the end of the prefix (N tokens), a profile;
// - w[l] varies per (request, layer): logit w = logit head_corr[l] + sigma_w u, u ~ unit
//   noise keyed by (query, layer), so head agreement, and ITF's pass/fallback, varies;
//   z = sqrt(w) y + sqrt(1-w) e  (e as in version 1), log2 score = tail z (+ sinks).
//
// Version 3 (`model=v3`) replaces version 2's persistent field and slow chain, which have one
// shape for every layer, by a per-layer depth profile of K shared fields fitted from the
// recording's own layer-pair Jaccard matrix, and adds region-level query focus:
//   x[l,t] = sum_k B[l,k] F_k[t] + sqrt(r_l) c[l,t],   r_l = 1 - sum_k B[l,k]^2
//   F_k[t] = sqrt(1-g_p) Fs_k[t](prefix token) + sqrt(g_p) Fq_k[t](query)
//   y[l,t] = sqrt(1-nu) x[l,t] + sqrt(nu) X[l,t]                      (smoothing, as v2)
//   y'[l,t] = sqrt(1-phi) y[l,t] + sqrt(phi) Q[t] + R(N-1-t)          (focus, recency)
// - B (loadings, a depth profile of K values per row, read by relative depth like head_corr):
//   layers l and l' share the fields F_k with correlation B_l . B_l' (plus the residual chain
//   c's sqrt(r_l r_l') ChainCorrelation(rho, l, l')). Blocks of layers that keep the same tokens, a first layer
//   that keeps others, layers far apart that agree: any layer-pair structure of rank K;
// - Q (focus, focus_tokens M): one field per query, piecewise linear between knots every M
//   positions, in every layer: a query attends more to some regions of the prefix (the
//   document it asks about) than other queries of the same prefix do;
// - c, e, w (head_corr, head_spread), sinks, tail and recency as version 2.
// Version 4 (`model=v4`) is version 3 with skewed shared fields (`skew` s): layer l's share of
// the K fields, P[l,t] = sum_k B[l,k] F_k[t] (variance |B_l|^2), enters as
//   |B_l| (exp(s z) - exp(s^2/2)) / (sign(s) sqrt((exp(s^2) - 1) exp(s^2))),  z = P / |B_l|
// (a standardised lognormal of z; s = 0 is version 3's P), so with s > 0 the tokens the
// fields favour are kept by nearly every layer and the others are pulled less far down: at
// the same layer-set Jaccard more tokens are kept by some layer. Real attention does that
// (docs/real-model-observations.md: SmolLM2's share of tokens kept by no layer), and a
// history packer gains less from it than from version 3's symmetric fields.
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
  // before versions existed), 2 (model=v2), 3 (model=v3) or 4 (model=v4).
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
  // Version 2 only (ignored by version 1; these defaults reduce v2 to v1's structure).
  double persistent = 0;          // pi: share of the layer-shared field held by P[t]
  double slow = 0;                // s: share of the chain part on the slow chain
  double slow_corr = 0.99;        // rho_s: adjacent-layer correlation of the slow chain
  double persistent_query = 0;    // g_p: query share of the persistent field
  double persistent_corr = 1;     // rho_p: adjacent-layer correlation of P (1: one P for all)
  double smooth = 0;              // nu: share of the field that varies smoothly along positions
  int smooth_tokens = 4;          // m: knot spacing of the smooth part, tokens
  double head_spread = 0;         // sigma_w: sd of the per-(request, layer) logit of head_corr
  // Recency boost of the shared field, in its sd units, at distances 4^i - 1 tokens from the
  // end of the prefix (0, 3, 15, 63, 255, ...), linear in log4(1 + distance) in between,
  // the last value beyond. Empty: none.
  std::vector<double> recency;
  // Version 3 only (version 2's keys persistent, persistent_corr, slow and slow_corr are not
  // used; persistent_query is the query share g_p of the fields F_k).
  int factors = 0;                // K: fields shared across layers
  std::vector<double> loadings;   // B: rows of K values, row i at relative depth i/(rows-1)
  double focus = 0;               // phi: share of the field held by the query's focus Q
  int focus_tokens = 256;         // M: knot spacing of Q, tokens
  // Version 4 only (version 3's keys and this): the skew s of the shared fields, [-1.5, 1.5].
  double skew = 0;

  // Throws InputError naming the offending parameter (`where` prefixes the message).
  void Validate(const std::string& where) const;
  // "seed=1 head_corr=0.8,0.6 layer_corr=0.9 ..." (one line, the INI keys of FORMAT.md).
  // Version 1 prints exactly the keys it always printed; versions 2 to 4 append
  // "model=v2" / "model=v3" / "model=v4" and their parameters.
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

// Correlation of the layer chain's fields of layers l and l2 (every version: layer l's field is
// cos(a) A_i + sin(a) A_{i+1} for anchors A every pi/2 of rotation, l acos(layer_corr) = i pi/2
// + a): cos(a - a2) in one anchor interval, sin(a) cos(a2) in adjacent ones, 0 beyond. What
// version 3's fit factors the layer correlation with.
double ChainCorrelation(double layer_corr, int l, int l2);

// A head's own noise in every version's last step, N = es * U1 + eq * U2 (U: Unit(), the sum
// of two uniforms, unit variance): the half-width of its support and its CDF (closed form, four
// uniforms; a weight below 1e-4 of the other is left out). What SampleTopKCounts draws from.
double HeadNoiseSupport(double es, double eq);
double HeadNoiseCdf(double es, double eq, double x);

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
  // Versions 3 and 4: layer l's loadings on the K shared fields (K values), by relative depth.
  std::span<const double> loadings(int layer) const {
    return std::span<const double>(b_).subspan(std::size_t(layer) * params_.factors,
                                               std::size_t(params_.factors));
  }

  // Version 1's anchor fields of one request, kept across its layers. Layer l mixes the
  // anchors i and i+1 of the chain (l * acos(layer_corr) = i pi/2 + a), so with layer_corr 0.9
  // each anchor serves about seven layers; its static and query rows (unit noise per token)
  // are computed once per request instead of once per layer: 4 of version 1's 4 + 2 x heads
  // hashes per token and layer become ~0.7 (a spec request probes 3 heads: 10 -> ~6.7). The
  // scores are bit-identical with or without it (traces_anchor_cache_test). Belongs to one
  // request (one token_keys, one query_key); Clear() it for another. Not thread-safe.
  class AnchorCache {
   public:
    void Clear() { rows_.clear(); }
    std::size_t bytes() const;

   private:
    friend class ImportanceModel;
    struct Row {
      std::uint64_t anchor = 0;
      bool query = false;
      std::vector<float> unit;  // Unit noise of tokens 0..unit.size()-1
    };
    // The row of (anchor, static or query) covering n tokens, computed if absent or short.
    const float* Get(const ImportanceModel& m, std::span<const std::uint32_t> keys,
                     std::uint64_t query_key, std::uint64_t anchor, bool query, std::int64_t n);
    std::vector<Row> rows_;
  };

  // Fills out[j * n + t] for j < heads.size(), t < n with the scores of tokens 0..n-1.
  // `prefix_tokens` (version 2's recency): the request's whole prefix length, of which the n
  // tokens are the first; -1: token_keys.size(). `anchors` (version 1; ignored by versions 2
  // to 4): the request's AnchorCache, or nullptr to compute the anchor fields every call.
  // REQUIRES: token_keys.size() >= n; 0 <= layer < layers(); every head in [0, kv_heads()).
  void Scores(std::span<const std::uint32_t> token_keys, std::uint64_t query_key, int layer,
              std::span<const int> heads, std::int64_t n, float* out,
              std::int64_t prefix_tokens = -1, AnchorCache* anchors = nullptr) const;

  // H2O's selection sampled from the model's statistics instead of scored head by head
  // (`workload.h2o_selection = sampled`, docs/configuration.md; the exact path is Scores() of
  // every head and core/itf.h CountTopKPerHead). (*counts)[t] (resized to n) = how many of
  // `heads` heads keep token t among their top k of tokens 0..n-1.
  //
  // Every head's log2 score is the layer's common field c[t] (plus the sinks' boost) and the
  // head's own noise N = es * U1 + eq * U2, independent across heads and tokens given c (U:
  // Unit(), a sum of two uniforms). A head keeps the tokens above its k-th score T_h, and T_h
  // concentrates (relative spread ~ 1/sqrt(n)) at the T solving sum_t P(c[t] + N > T) = k. So
  // given c the heads keeping token t are Binomial(heads, p_t), p_t = P(N > T - c[t]), and the
  // count is drawn so, from N's exact CDF (four uniforms: a closed form). The draw inverts the
  // binomial at u = F_N(es * U1' + eq * U2'), U1' keyed by the token (as a head's static noise)
  // and U2' by the query, so requests sharing a prefix share the static part of the draw as
  // they share a head's static noise. O(n) per layer instead of O(heads * n). What it does not
  // keep: each head keeps exactly k (the count's total is heads * k in expectation, not
  // exactly), and which head keeps which token (a kCounted selection does not carry it).
  // docs/performance.md (session 11) has the comparison with the exact path; the test
  // (tests/traces/h2o_sampling_test.cc) pins it.
  // REQUIRES: as Scores(); 0 <= k <= n; 1 <= heads <= 65535.
  void SampleTopKCounts(std::span<const std::uint32_t> token_keys, std::uint64_t query_key,
                        int layer, int heads, std::int64_t n, std::int64_t k,
                        std::vector<std::uint16_t>* counts, std::int64_t prefix_tokens = -1,
                        AnchorCache* anchors = nullptr) const;

 private:
  ProceduralParams params_;
  int layers_;
  int kv_heads_;
  // The layer's common field: (*field)[t] for t < n, the log2 score of token t before each
  // head's own noise es * U(static) + eq * U(query) and the sinks' boost (every version's
  // Scores is HeadRows over it). v2 to v4 may fill more than n entries (smoothing knots).
  // FieldV3 serves versions 3 and 4.
  void Field(std::span<const std::uint32_t> token_keys, std::uint64_t query_key, int layer,
             std::int64_t n, std::int64_t prefix_tokens, AnchorCache* anchors,
             std::vector<float>* field, double* es, double* eq) const;
  void FieldV2(std::span<const std::uint32_t> token_keys, std::uint64_t query_key, int layer,
               std::int64_t n, std::int64_t prefix_tokens, std::vector<float>* field,
               double* es, double* eq) const;
  void FieldV3(std::span<const std::uint32_t> token_keys, std::uint64_t query_key, int layer,
               std::int64_t n, std::int64_t prefix_tokens, std::vector<float>* field,
               double* es, double* eq) const;
  // Every version's last step: each requested head's row = the layer's common field plus the
  // head's own static (es) and query (eq) noise, the first sink_tokens boosted.
  void HeadRows(const std::uint32_t* keys, const float* common, std::int64_t n,
                std::uint64_t query_key, int layer, std::span<const int> heads, double es,
                double eq, float* out) const;

  std::vector<double> w_;  // head_corr per layer
  std::vector<double> b_;  // versions 3, 4: loadings per layer, layers x factors
  double phi_;             // rotation per layer (acos rho)
  double phi_slow_;        // version 2's slow chain (acos rho_s)
  double phi_persist_;     // version 2's persistent field (acos rho_p; 0: constant)
};

}  // namespace kvtier
