#include "traces/decode_model.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "core/check.h"
#include "core/errors.h"
#include "traces/hash.h"
#include "traces/key_values.h"

namespace kvtier {
namespace {

constexpr std::uint64_t kTagStable = 0xD1;
constexpr std::uint64_t kTagDrift = 0xD2;
constexpr std::uint64_t kTagStep = 0xD4;
constexpr std::uint64_t kTagSpec = 0xD5;
constexpr std::uint64_t kTagRequest = 0xD6;

inline std::uint32_t Salt(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return static_cast<std::uint32_t>(hash::Combine(hash::Combine(hash::Combine(a, b), c), d));
}
inline std::uint32_t At(std::uint32_t salt, std::int64_t t) {
  return hash::Hash32(salt + static_cast<std::uint32_t>(t) * 0x9E3779B9u);
}
// The sum of the two 16-bit halves of h, minus its mean: variance 2 (65536^2 - 1) / 12.
inline float Halves(std::uint32_t h) {
  return static_cast<float>(h & 0xFFFFu) + static_cast<float>(h >> 16) - 65535.0f;
}
// Unit-variance noise from 4 (2) 32-bit hashes, i.e. 8 (4) uniform 16-bit halves. Irwin-Hall
// with 8 terms: quantiles within 1.3% of the Gaussian's up to 2 sd (the top 2%, where top-k
// sets of a few percent of the candidates are decided), 4% at 3 sd, bounded at 4.9 sd; the
// drift adds ceil(3T) terms of 4 halves. Gaussian enough that top-k overlap depends on the
// correlation of two score vectors, not on how the correlation is composed (the fit's first
// estimate relies on it).
constexpr float kHalfSd = 37837.23f;  // sqrt(2 * (65536^2 - 1) / 12)
inline float Gauss4(std::uint32_t salt, std::int64_t t) {
  return (Halves(At(salt, t)) + Halves(At(salt ^ 0x5BD1E995u, t)) +
          Halves(At(salt ^ 0x1B873593u, t)) + Halves(At(salt ^ 0xCC9E2D51u, t))) *
         (0.5f / kHalfSd);
}
inline float Gauss2(std::uint32_t salt, std::int64_t t) {
  return (Halves(At(salt, t)) + Halves(At(salt ^ 0x5BD1E995u, t))) * (0.70710678f / kHalfSd);
}

// out[t] = Gauss4(salt, t) and out[t] += c * Gauss2(salt, t) over n positions: the model's hot
// loops (every field of every set), vectorised at O3 (no branches; the values are the same).
__attribute__((optimize("O3"))) void FillGauss4(std::uint32_t salt, std::int64_t n, float* out) {
  for (std::int64_t t = 0; t < n; ++t) out[t] = Gauss4(salt, t);
}
__attribute__((optimize("O3"))) void AddGauss2(std::uint32_t salt, float c, std::int64_t n,
                                               float* out) {
  for (std::int64_t t = 0; t < n; ++t) out[t] += c * Gauss2(salt, t);
}

// The drift's kernel: w_j = exp(-j / T), j = 0 .. ceil(3T) - 1 (at most kMaxDriftTaps).
constexpr int kMaxDriftTaps = 192;
std::vector<double> DriftKernel(double drift_steps) {
  const int taps = std::clamp(static_cast<int>(std::ceil(3 * drift_steps)), 1, kMaxDriftTaps);
  std::vector<double> w(taps);
  for (int j = 0; j < taps; ++j) w[j] = std::exp(-double(j) / drift_steps);
  return w;
}

// A depth profile read at layer l of `layers` (entry i at relative depth i / (size - 1)).
double ProfileAt(const std::vector<double>& v, int l, int layers) {
  if (v.size() == 1 || layers <= 1) return v.front();
  const double x = double(l) / double(layers - 1) * double(v.size() - 1);
  const std::size_t i = std::min<std::size_t>(static_cast<std::size_t>(x), v.size() - 2);
  const double f = x - double(i);
  return v[i] * (1 - f) + v[i + 1] * f;
}

std::vector<double> ParseDoubles(const std::string& value) {
  std::vector<double> out = ParseNumbers(value);
  if (out.empty()) throw std::invalid_argument("empty list");
  return out;
}

std::string Join(const std::vector<double>& v) {
  std::ostringstream o;
  o.precision(6);
  for (std::size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
  return o.str();
}

}  // namespace

std::string DecodeModelParams::ToString() const {
  std::ostringstream o;
  o.precision(6);
  o << "decode=v1 seed=" << seed << " drift_steps=" << drift_steps << " stable=" << Join(stable)
    << " drift=" << Join(drift) << " spec_corr=" << Join(spec_corr) << " tail=" << Join(tail)
    << " spec_tail=" << Join(spec_tail) << " sinks=" << Join(sinks);
  return o.str();
}

DecodeModelParams DecodeModelParams::Parse(const std::string& text, const std::string& where) {
  DecodeModelParams p;
  ForEachKeyValue(text, where, [&](const std::string& key, const std::string& value,
                                   const std::string&) {
    try {
      if (key == "decode") {
        if (value != "v1") throw ConfigError(where + ": decode: expected v1, got '" + value + "'");
      } else if (key == "seed") {
        p.seed = ParseSeed(value);  // "-1" was 2^64 - 1
      } else if (key == "drift_steps") {
        p.drift_steps = ParseNumber(value);
      } else if (key == "stable") {
        p.stable = ParseDoubles(value);
      } else if (key == "drift") {
        p.drift = ParseDoubles(value);
      } else if (key == "spec_corr") {
        p.spec_corr = ParseDoubles(value);
      } else if (key == "sinks") {
        p.sinks = ParseDoubles(value);
      } else if (key == "tail") {
        p.tail = ParseDoubles(value);
      } else if (key == "spec_tail") {
        p.spec_tail = ParseDoubles(value);
      } else {
        throw ConfigError(where + ": unknown decode model key '" + key +
                          "' (decode, seed, drift_steps, stable, drift, spec_corr, tail, spec_tail, sinks)");
      }
    } catch (const std::invalid_argument&) {
      throw ConfigError(where + ": " + key + ": cannot parse '" + value + "'");
    } catch (const std::out_of_range&) {
      throw ConfigError(where + ": " + key + ": out of range: '" + value + "'");
    }
  });
  p.Validate(where);
  return p;
}

void DecodeModelParams::Validate(const std::string& where) const {
  auto fail = [&](const std::string& what) { throw ConfigError(where + ": " + what); };
  if (!(drift_steps > 0 && drift_steps <= 64)) fail("drift_steps: must be in (0, 64]");
  auto unit = [&](const std::vector<double>& v, const char* name) {
    if (v.empty()) fail(std::string(name) + ": empty");
    for (double x : v) {
      if (!(x >= 0 && x <= 1)) fail(std::string(name) + ": values must be in [0, 1]");
    }
  };
  unit(stable, "stable");
  unit(drift, "drift");
  unit(spec_corr, "spec_corr");
  if (stable.size() != drift.size()) fail("stable and drift: must have the same length");
  for (std::size_t i = 0; i < stable.size(); ++i) {
    if (stable[i] + drift[i] > 1 + 1e-9) fail("stable + drift: must be <= 1 at every depth");
  }
  for (const auto* v : {&tail, &spec_tail}) {
    const std::string name = v == &tail ? "tail" : "spec_tail";
    if (v->empty()) fail(name + ": empty");
    for (double x : *v) {
      if (!(x >= 0 && x <= 3)) fail(name + ": values must be in [0, 3]");
    }
  }
  if (sinks.empty()) fail("sinks: empty");
  for (double x : sinks) {
    if (!(x >= 0 && x <= 1e6)) fail("sinks: values must be in [0, 1e6]");
  }
}

double DriftCorrelation(double drift_steps, double lag) {
  KVTIER_CHECK(drift_steps > 0, "drift_steps must be positive");
  const std::vector<double> w = DriftKernel(drift_steps);
  const int d = static_cast<int>(std::llround(std::fabs(lag)));
  double dot = 0, norm = 0;
  for (std::size_t j = 0; j < w.size(); ++j) {
    norm += w[j] * w[j];
    if (j + d < w.size()) dot += w[j] * w[j + d];
  }
  return dot / norm;
}

DecodeSetModel::DecodeSetModel(DecodeModelParams params, int layers) : params_(std::move(params)) {
  KVTIER_CHECK(layers >= 1, "a decode model needs at least one layer");
  params_.Validate("decode model");
  layers_.resize(layers);
  for (int l = 0; l < layers; ++l) {
    DecodeLayerParams& p = layers_[l];
    p.stable = ProfileAt(params_.stable, l, layers);
    p.drift = std::min(ProfileAt(params_.drift, l, layers), 1 - p.stable);
    p.spec_corr = ProfileAt(params_.spec_corr, l, layers);
    p.tail = ProfileAt(params_.tail, l, layers);
    p.spec_tail = ProfileAt(params_.spec_tail, l, layers);
    p.sinks = static_cast<int>(std::lround(ProfileAt(params_.sinks, l, layers)));
  }
}

std::uint64_t DecodeRequestKey(std::uint64_t seed, RequestId id) {
  return hash::Combine(hash::Combine(seed, kTagRequest), static_cast<std::uint64_t>(id));
}

void DecodeSetModel::Fields(std::uint64_t key, int step, int layer, int head,
                            std::int64_t candidates, bool with_spec, DecodeFields* f,
                            bool with_drift) const {
  KVTIER_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
  KVTIER_CHECK(step >= 0 && head >= 0 && candidates >= 0, "negative argument");
  const std::int64_t n = candidates;
  const std::size_t un = static_cast<std::size_t>(n);
  const std::uint64_t lh =
      (static_cast<std::uint64_t>(layer) << 20) ^ static_cast<std::uint64_t>(head);
  const std::uint64_t seed = params_.seed;
  const std::uint32_t s_stable = Salt(seed, key, lh, kTagStable);
  const std::uint32_t s_step = Salt(seed, key, lh, (kTagStep << 32) ^ std::uint64_t(step));
  f->stable.resize(un);
  f->step.resize(un);
  f->drift.assign(un, 0.0f);
  FillGauss4(s_stable, n, f->stable.data());
  FillGauss4(s_step, n, f->step.data());
  if (with_drift) {  // the kernel-weighted innovations of steps step - j, unit variance
    const std::vector<double> w = DriftKernel(params_.drift_steps);
    double norm = 0;
    for (double x : w) norm += x * x;
    for (std::size_t j = 0; j < w.size(); ++j) {
      const std::uint32_t s_in = Salt(seed, key, lh,
                                      (kTagDrift << 32) ^ static_cast<std::uint64_t>(
                                                              std::int64_t(step) - std::int64_t(j)));
      AddGauss2(s_in, static_cast<float>(w[j] / std::sqrt(norm)), n, f->drift.data());
    }
  }
  f->spec.clear();
  if (with_spec) {
    const std::uint32_t s_spec = Salt(seed, key, lh, (kTagSpec << 32) ^ std::uint64_t(step));
    f->spec.resize(un);
    FillGauss4(s_spec, n, f->spec.data());
  }
}

void DecodeSetModel::HeavyTail(double sigma, const std::vector<float>& g, std::vector<float>* out) {
  out->resize(g.size());
  if (!(sigma > 1e-6)) {
    std::copy(g.begin(), g.end(), out->begin());
    return;
  }
  // exp(sigma g) standardised with the log-normal's mean e^{sigma^2/2} and sd.
  const double mean = std::exp(sigma * sigma / 2);
  const double inv_sd = 1.0 / std::sqrt((std::exp(sigma * sigma) - 1) * std::exp(sigma * sigma));
  for (std::size_t t = 0; t < g.size(); ++t) {
    (*out)[t] = static_cast<float>((std::exp(sigma * double(g[t])) - mean) * inv_sd);
  }
}

namespace {

// The top min(k, n) positions of `score`, ranked best first, ties to the lower index. The k-th
// largest value is found on a copy of the scores (contiguous floats), then the positions above
// it and, in index order, those equal to it.
void TopK(const std::vector<float>& score, std::int64_t k, std::vector<float>* tmp,
          std::vector<std::int64_t>* out) {
  const std::int64_t n = static_cast<std::int64_t>(score.size());
  const std::int64_t kk = std::min(k, n);
  out->clear();
  if (kk == 0) return;
  tmp->assign(score.begin(), score.end());
  std::nth_element(tmp->begin(), tmp->begin() + (kk - 1), tmp->end(), std::greater<float>());
  const float v = (*tmp)[kk - 1];
  for (std::int64_t t = 0; t < n; ++t) {
    if (score[t] > v) out->push_back(t);
  }
  for (std::int64_t t = 0; t < n && std::int64_t(out->size()) < kk; ++t) {
    if (score[t] == v) out->push_back(t);
  }
  std::sort(out->begin(), out->end(), [&](std::int64_t a, std::int64_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  });
}

}  // namespace

void DecodeSetModel::Combine(const DecodeLayerParams& lp, std::span<const float> stable,
                             const DecodeFields& f, int k, std::vector<std::int64_t>* output,
                             std::vector<std::int64_t>* prefetched, std::vector<float>* scratch) {
  const std::int64_t n = static_cast<std::int64_t>(f.step.size());
  KVTIER_CHECK(stable.size() >= f.step.size() && f.drift.size() == f.step.size(),
               "fields of different lengths");
  const float ca = static_cast<float>(std::sqrt(lp.stable));
  const float cb = static_cast<float>(std::sqrt(lp.drift));
  const float cw = static_cast<float>(std::sqrt(std::max(0.0, 1 - lp.stable - lp.drift)));
  std::vector<float>& z = scratch[0];
  z.resize(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) z[t] = ca * stable[t] + cb * f.drift[t] + cw * f.step[t];
  const std::int64_t sinks = std::min<std::int64_t>(lp.sinks, n);
  constexpr float kSink = 1e30f;
  for (std::int64_t t = 0; t < sinks; ++t) z[t] = kSink * (1.0f - 1e-3f * static_cast<float>(t));
  std::vector<float>& tmp = scratch[2];
  if (output != nullptr) TopK(z, k, &tmp, output);
  if (prefetched != nullptr) {
    KVTIER_CHECK(f.spec.size() == f.step.size(), "prefetched sets need the spec field");
    // y = c M(z) + sqrt(1 - c^2) N, M the spec tail's transform of the (non-sink) scores.
    std::vector<float>& y = scratch[1];
    std::vector<float> zs(z.begin() + sinks, z.end());
    HeavyTail(lp.spec_tail, zs, &zs);
    const float c = static_cast<float>(lp.spec_corr);
    const float e = static_cast<float>(std::sqrt(std::max(0.0, 1 - lp.spec_corr * lp.spec_corr)));
    y.resize(static_cast<std::size_t>(n));
    for (std::int64_t t = 0; t < sinks; ++t) y[t] = z[t];
    for (std::int64_t t = sinks; t < n; ++t) y[t] = c * zs[t - sinks] + e * f.spec[t];
    TopK(y, k, &tmp, prefetched);
  }
}

void DecodeSetModel::Sets(std::uint64_t key, int step, int layer, int head,
                          std::int64_t candidates, int k, std::vector<std::int64_t>* output,
                          std::vector<std::int64_t>* prefetched) const {
  KVTIER_CHECK(k >= 0, "negative k");
  DecodeFields f;
  Fields(key, step, layer, head, candidates, prefetched != nullptr, &f,
         /*with_drift=*/layers_[layer].drift > 0);
  std::vector<float> scratch[3], stable;
  HeavyTail(layers_[layer].tail, f.stable, &stable);
  Combine(layers_[layer], stable, f, k, output, prefetched, scratch);
}

}  // namespace kvtier
