#pragma once
// Procedural decode top-k sets (SpeCache): for decode step s of a request, each layer and KV
// head, the output token's exact top-k positions O_s and the set P_s the speculative token of
// step s-1 prefetched, generated on demand from counter-based hashes (bit-identical on every
// call, independent of call order), with parameters fitted to a recording by
// `kvtier trace fit --decode` (traces/decode_fit.h). What it reproduces is what
// traces/decode_stats.h measures: the step-to-step overlap of O (by lag and k) and the
// overlap of P with O (the speculative hit rate), per layer.
//
// The output token's score of candidate position t at step s (layer l, head h) is
//   z_s(t) = sqrt(a_l) S(t) + sqrt(b_l) D_s(t) + sqrt(1 - a_l - b_l) E_s(t),
// three unit-variance fields drawn per (request, layer, head, t): S constant over the decode
// (the keys a head keeps attending to), with a heavy upper tail of shape sigma_l (S = exp(sigma
// G), G Gaussian, standardised with the log-normal's mean and sd; sigma = 0: S = G): a few
// positions that stand out and stay, which is what makes the real model's small top-k sets
// more stable and better predicted than its larger ones; E new at every step; D drifting: an exponentially
// weighted sum of per-step innovations, D_s = sum_j w_j V_{s-j} / |w|, w_j = exp(-j / T) for
// j < ceil(3T), so D correlates by DriftCorrelation(T, d) ~ exp(-d / T) at lag d, the same for
// every position and step. Positions t < sinks_l get a boost that puts them at the top of
// every set (attention sinks). The speculative token's score is
//   y_s(t) = c_l M_l(z_s(t)) + sqrt(1 - c_l^2) N_s(t),
// N fresh noise, M_l the same log-normal transform with shape tau_l (spec_tail; 0: identity).
// M changes no ranking of z, only the scale the speculative token's error is added on: with a
// heavy upper tail the top positions stand apart and the error reshuffles mostly the rest,
// which is how the real model's speculative hit falls with k while the output's own step-to-
// step overlap does not. O_s and P_s are
// the top-k of z_s and y_s over the step's candidates [0, candidates), ranked best first, ties
// to the lower index, so the top-k' set of any k' < k is a prefix. Scores at lag d >= 1 then
// correlate by r(d) = a_l + b_l DriftCorrelation(T, d) at every position.
// Every field is nearly Gaussian (Irwin-Hall sums of 16-bit uniforms from counter-based
// hashes), so with sigma = 0 top-k overlap depends on these correlations only, not on how a
// correlation is composed (the fit's first estimate relies on it, traces/decode_fit.h).
// Bit-identical on one platform; the tail and the kernel use libm's exp.
// The per-layer parameters are depth profiles read by relative depth (entry i at depth
// i/(size-1), linear in between; sinks rounded), so a fit of one model replays on another.
// Cost: about (13 + 2 ceil(3T)) 32-bit hashes per candidate and set. Thread-compatible: a
// const DecodeSetModel may be shared.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/request.h"

namespace kvtier {

struct DecodeModelParams {
  std::uint64_t seed = 1;
  double drift_steps = 8;            // T, the drift's correlation time in decode steps, (0, 64]
  std::vector<double> stable = {0.5};  // a_l, in [0, 1]
  std::vector<double> drift = {0.2};   // b_l, in [0, 1], a_l + b_l <= 1 (same length as stable)
  std::vector<double> spec_corr = {0.8};  // c_l, in [0, 1]
  std::vector<double> tail = {0};      // sigma_l, the stable field's tail, in [0, 3]
  std::vector<double> spec_tail = {0};  // tau_l, the scale of the speculative error, in [0, 3]
  std::vector<double> sinks = {0};     // positions 0..sinks_l-1 always on top (rounded), >= 0

  // "decode=v1 seed=1 drift_steps=8 stable=0.5,... drift=... spec_corr=... tail=...
  // spec_tail=... sinks=..."
  std::string ToString() const;
  // Parses ToString's form (keys in any order, missing keys keep their defaults). Throws
  // ConfigError naming `where` and the key on a bad or unknown key or value.
  static DecodeModelParams Parse(const std::string& text, const std::string& where);
  // Throws ConfigError naming `where` when a value is out of range.
  void Validate(const std::string& where) const;
};

// The correlation of the drift field at lag d (steps, rounded) with correlation time T: the
// truncated kernel's autocorrelation, ~exp(-d / T); 1 at d = 0, 0 from d >= ceil(3T).
double DriftCorrelation(double drift_steps, double lag);

// The per-layer values of a model with `layers` layers.
struct DecodeLayerParams {
  double stable = 0, drift = 0, spec_corr = 0, tail = 0, spec_tail = 0;
  int sinks = 0;
};

// The unit-variance fields of one (request, step, layer, head) over the candidates: G of the
// stable field (before its tail), D, E and N (spec: empty when not asked for). Separate from
// the parameters that combine them, so a fit can redraw sets for new parameters cheaply.
struct DecodeFields {
  std::vector<float> stable, drift, step, spec;
};

class DecodeSetModel {
 public:
  // REQUIRES: params.Validate passes; layers >= 1.
  DecodeSetModel(DecodeModelParams params, int layers);

  const DecodeModelParams& params() const { return params_; }
  const DecodeLayerParams& layer(int l) const { return layers_[l]; }

  // The sets of decode step `step` of the request keyed `key`, for (layer, head), over
  // positions [0, candidates): min(k, candidates) positions each, ranked best first. Either
  // output pointer may be null (not computed).
  void Sets(std::uint64_t key, int step, int layer, int head, std::int64_t candidates, int k,
            std::vector<std::int64_t>* output, std::vector<std::int64_t>* prefetched) const;

  // Sets() in parts: the fields (which depend on the seed and drift_steps only), the stable
  // field's tail (HeavyTail(layer.tail, fields.stable), the same at every step), and their
  // combination under one layer's parameters. `scratch` is three reusable buffers.
  // Without `with_drift` the drift field is zero (for a layer whose drift share is 0).
  void Fields(std::uint64_t key, int step, int layer, int head, std::int64_t candidates,
              bool with_spec, DecodeFields* fields, bool with_drift = true) const;
  // out = (exp(sigma g) - e^{sigma^2/2}) / sd, the standardised log-normal; g when sigma is 0.
  // `out` may alias `g`.
  static void HeavyTail(double sigma, const std::vector<float>& g, std::vector<float>* out);
  // `stable` holds at least the fields' candidates (the stable field of a longer context: its
  // first positions are the same).
  static void Combine(const DecodeLayerParams& layer, std::span<const float> stable,
                      const DecodeFields& fields, int k, std::vector<std::int64_t>* output,
                      std::vector<std::int64_t>* prefetched, std::vector<float>* scratch);

 private:
  DecodeModelParams params_;
  std::vector<DecodeLayerParams> layers_;
};

// The key of request `id` under a model seeded `seed` (what generated traces use).
std::uint64_t DecodeRequestKey(std::uint64_t seed, RequestId id);

// Top-k candidates of SpeCache's step with `context` cached positions and KIVI residual R:
// positions with a low-bit key or value, floor(context / R) * R (keys are quantized in whole
// windows of R, values up to context - R; models/kivi.h KeyQuantizedTokens/ValueQuantizedTokens).
inline std::int64_t SpeCacheCandidates(std::int64_t context, std::int64_t residual) {
  return residual > 0 ? context / residual * residual : context;
}

}  // namespace kvtier
