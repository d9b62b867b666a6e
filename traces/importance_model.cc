#include "traces/importance_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <sstream>

#include "core/check.h"
#include "core/errors.h"
#include "core/itf.h"
#include "traces/hash.h"

namespace kvtier {
namespace {

constexpr std::uint64_t kTagStaticAnchor = 0x51;
constexpr std::uint64_t kTagQueryAnchor = 0x52;
constexpr std::uint64_t kTagStaticHead = 0x53;
constexpr std::uint64_t kTagQueryHead = 0x54;
constexpr std::uint64_t kTagPersistStatic = 0x55;
constexpr std::uint64_t kTagPersistQuery = 0x56;
constexpr std::uint64_t kTagHeadSpread = 0x58;
constexpr std::uint64_t kTagSlowStatic = 0x59;
constexpr std::uint64_t kTagSlowQuery = 0x5A;
constexpr std::uint64_t kTagFactorStatic = 0x5B;
constexpr std::uint64_t kTagFactorQuery = 0x5C;
constexpr std::uint64_t kTagFocus = 0x5D;
constexpr std::uint64_t kTagSampleStatic = 0x5E;  // SampleTopKCounts' draw, token-keyed part
constexpr std::uint64_t kTagSampleQuery = 0x5F;   // ... and query-keyed part

// Two 16-bit halves summed: triangular on [-1, 1] (variance 1/6), scaled to unit variance.
// Closer to Gaussian than one uniform, so mixtures of components keep nearly the same shape
// and head/layer similarity depend on correlations, not on how many components are mixed.
constexpr float kUnitScale = 2.449489742783178f / 65535.0f;

inline float Unit(std::uint32_t h) {
  return (static_cast<float>(h & 0xFFFFu) + static_cast<float>(h >> 16) - 65535.0f) * kUnitScale;
}

// 2^y, monotone piecewise-linear (Schraudolph): exact at integers, within 6% in between. Only
// ranks and heavy-tailedness matter here, and it vectorises (with -fno-trapping-math for this
// file, traces/CMakeLists.txt: HeadRow's loop was scalar without it, and the per-head rows
// were 56% of sim_bench's as_h2o_lfu run). y is clamped to [-120, 120] by two selects, which
// give std::clamp's value for every float, NaN included.
inline float FastExp2(float y) {
  y = y < -120.0f ? -120.0f : y;
  y = 120.0f < y ? 120.0f : y;
  const std::int32_t bits = static_cast<std::int32_t>(y * 8388608.0f) + (127 << 23);
  return std::bit_cast<float>(bits);
}

std::uint32_t Salt(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return static_cast<std::uint32_t>(hash::Combine(hash::Combine(hash::Combine(a, b), c), d));
}

// out[t] = ca * U(salt_a, t) + cb * U(salt_b, t), prefix-keyed (token keys).
__attribute__((optimize("O3"))) void AnchorMixStatic(const std::uint32_t* keys, std::int64_t n,
                                                       std::uint32_t sa, std::uint32_t sb,
                                                       float ca, float cb, float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    out[t] = ca * Unit(hash::Hash32(keys[t] ^ sa)) + cb * Unit(hash::Hash32(keys[t] ^ sb));
  }
}

// out[t] += ca * U(salt_a + t*G) + cb * U(salt_b + t*G), query-keyed (token positions).
__attribute__((optimize("O3"))) void AnchorMixQuery(std::int64_t n, std::uint32_t sa,
                                                      std::uint32_t sb, float ca, float cb,
                                                      float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint32_t g = static_cast<std::uint32_t>(t) * 0x9E3779B9u;
    out[t] += ca * Unit(hash::Hash32(sa + g)) + cb * Unit(hash::Hash32(sb + g));
  }
}

__attribute__((optimize("O3"))) void HeadRow(const std::uint32_t* keys, const float* common,
                                             std::int64_t n, std::uint32_t ss, std::uint32_t sq,
                                             float es, float eq, float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint32_t g = static_cast<std::uint32_t>(t) * 0x9E3779B9u;
    const float z = common[t] + es * Unit(hash::Hash32(keys[t] ^ ss)) +
                    eq * Unit(hash::Hash32(sq + g));
    out[t] = FastExp2(z);
  }
}

// An anchor's unit row (ImportanceModel::AnchorCache): U(key ^ salt) per token, or
// U(salt + t*G) for the query's. Vectorised at -O3 like the mixes above (this file is -O2;
// written inline in AnchorCache::Get the loops ran one token at a time: 3% of a cold spec run
// on the Mooncake trace, perf). The same expressions, so the same floats.
__attribute__((optimize("O3"))) void UnitRowStatic(const std::uint32_t* keys, std::int64_t n,
                                                   std::uint32_t salt, float* out) {
  for (std::int64_t t = 0; t < n; ++t) out[t] = Unit(hash::Hash32(keys[t] ^ salt));
}
__attribute__((optimize("O3"))) void UnitRowQuery(std::int64_t n, std::uint32_t salt,
                                                  float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    out[t] = Unit(hash::Hash32(salt + static_cast<std::uint32_t>(t) * 0x9E3779B9u));
  }
}

// AnchorMixStatic and AnchorMixQuery from the anchors' unit rows (ImportanceModel::AnchorCache):
// the same expressions on the same values, so the same floats.
__attribute__((optimize("O3"))) void AnchorMixRows(const float* ua, const float* ub,
                                                     std::int64_t n, float ca, float cb,
                                                     float* out) {
  for (std::int64_t t = 0; t < n; ++t) out[t] = ca * ua[t] + cb * ub[t];
}
__attribute__((optimize("O3"))) void AnchorMixRowsAdd(const float* ua, const float* ub,
                                                        std::int64_t n, float ca, float cb,
                                                        float* out) {
  for (std::int64_t t = 0; t < n; ++t) out[t] += ca * ua[t] + cb * ub[t];
}

// Version 2's persistent field: out[t] += cs * U(key ^ ss) + cq * U(sq + t*G).
[[maybe_unused]] __attribute__((optimize("O3"))) void PersistentAdd(const std::uint32_t* keys, std::int64_t n,
                                                   std::uint32_t ss, std::uint32_t sq, float cs,
                                                   float cq, float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint32_t g = static_cast<std::uint32_t>(t) * 0x9E3779B9u;
    out[t] += cs * Unit(hash::Hash32(keys[t] ^ ss)) + cq * Unit(hash::Hash32(sq + g));
  }
}

// Version 3's shared field k: out[t] += cs * U(key ^ ss) (+ cq * U(sq + t*G) when cq != 0).
__attribute__((optimize("O3"))) void FactorAdd(const std::uint32_t* keys, std::int64_t n,
                                               std::uint32_t ss, std::uint32_t sq, float cs,
                                               float cq, float* out) {
  if (cq == 0.0f) {
    for (std::int64_t t = 0; t < n; ++t) out[t] += cs * Unit(hash::Hash32(keys[t] ^ ss));
    return;
  }
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint32_t g = static_cast<std::uint32_t>(t) * 0x9E3779B9u;
    out[t] += cs * Unit(hash::Hash32(keys[t] ^ ss)) + cq * Unit(hash::Hash32(sq + g));
  }
}

// Version 4's skewed fields: out[t] += sd * g(x[t] / sd), g(z) the standardised lognormal
// (exp(s z) - exp(s^2/2)) / (sign(s) sqrt((exp(s^2) - 1) exp(s^2))): mean 0 and variance 1
// for a standard normal z, increasing in z for either sign of s, z itself as s -> 0.
void SkewAdd(const float* x, std::int64_t n, double sd, double s, float* out) {
  const double mean = std::exp(s * s / 2);
  const double sign = std::copysign(1.0, s);
  const double scale = sd / (sign * std::sqrt(std::expm1(s * s) * std::exp(s * s)));
  const double a = s / sd;
  for (std::int64_t t = 0; t < n; ++t) out[t] += float(scale * (std::exp(a * x[t]) - mean));
}

// Version 3's focus: y[t] <- sqrt(1-phi) y[t] + sqrt(phi) Q[t], Q unit-variance noise at the
// knots 0, M, 2M, ... (keyed by the salt and the knot), linear in between, rescaled to unit
// variance. Positions, not tokens: two requests of one prefix with different queries differ.
void AddFocus(float* y, std::int64_t n, int m, double phi, std::uint32_t salt) {
  const float a = float(std::sqrt(1 - phi)), b = float(std::sqrt(phi));
  const auto knot = [&](std::int64_t j) {
    return Unit(hash::Hash32(salt + static_cast<std::uint32_t>(j) * 0x9E3779B9u));
  };
  std::int64_t j = -1;
  float k0 = 0, k1 = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    if (t / m != j) {
      j = t / m;
      k0 = knot(j);
      k1 = knot(j + 1);
    }
    const float f = float(t - j * m) / float(m);
    const float v = ((1 - f) * k0 + f * k1) / std::sqrt((1 - f) * (1 - f) + f * f);
    y[t] = a * y[t] + b * v;
  }
}

// Recency by distance from the end of the prefix (versions 2 and 3): shared[t] += R(last - t).
void AddRecency(const std::vector<double>& recency, std::int64_t prefix_tokens, std::int64_t n,
                float* shared) {
  if (recency.empty()) return;
  const std::int64_t last = std::max<std::int64_t>(prefix_tokens, n) - 1;
  const std::size_t m = recency.size();
  // Only distances below 4^(m-1) vary; beyond, the last value applies to every token.
  for (std::int64_t t = 0; t < n; ++t) {
    const double x = std::log2(1.0 + double(last - t)) / 2;  // log4(1 + distance)
    double b;
    if (x >= double(m - 1)) {
      b = recency[m - 1];
    } else {
      const std::size_t i = static_cast<std::size_t>(x);
      const double f = x - double(i);
      b = recency[i] * (1 - f) + recency[i + 1] * f;
    }
    shared[t] += float(b);
  }
}

// Version 2's smoothing along positions: y[t] <- sqrt(1-nu) y[t] + sqrt(nu) Y[t], where Y is
// y at the knots 0, m, 2m, ... linear in between, rescaled to y's variance. Knots past the
// field given reuse its last value. REQUIRES: y holds the field up to the knot after n - 1.
void SmoothField(std::vector<float>* y, std::int64_t n, int m, double nu) {
  thread_local std::vector<float> knots;
  const std::int64_t have = static_cast<std::int64_t>(y->size());
  const std::int64_t count = (n - 1) / m + 2;
  knots.resize(static_cast<std::size_t>(count));
  for (std::int64_t j = 0; j < count; ++j) knots[j] = (*y)[std::min(j * m, have - 1)];
  const float a = float(std::sqrt(1 - nu)), b = float(std::sqrt(nu));
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t j = t / m;
    const float f = float(t - j * m) / float(m);
    const float v = ((1 - f) * knots[j] + f * knots[j + 1]) / std::sqrt((1 - f) * (1 - f) + f * f);
    (*y)[t] = a * (*y)[t] + b * v;
  }
}

// SampleTopKCounts' tables for one (es, eq, heads): the CDF F of a head's noise
// N = es * U1 + eq * U2 on kGrid + 1 points over N's support [-nmax, nmax], and at each point
// x_i the CDF of Binomial(heads, 1 - F(x_i)) -- the number of heads whose noise exceeds x_i --
// as 32-bit thresholds, with a guide table of kGuide buckets of u to start its inversion.
class HeadNoiseTable {
 public:
  static constexpr int kGrid = 512;
  // 256 buckets: the inversion's walk from the guide takes ~0.2 steps (with 64 its branch
  // was a third of the draw's time).
  static constexpr int kGuideBits = 8;
  static constexpr int kGuide = 1 << kGuideBits;

  HeadNoiseTable(double es, double eq, int heads) : es_(es), eq_(eq), heads_(heads) {
    nmax_ = HeadNoiseSupport(es, eq);
    delta_ = 2 * nmax_ / kGrid;
    inv_delta_ = nmax_ > 0 ? 1 / delta_ : 0;
    f_.resize(kGrid + 1);
    p_.resize(kGrid + 1);
    cdf_.resize(std::size_t(kGrid + 1) * heads);
    guide_.resize(std::size_t(kGrid + 1) * kGuide);
    for (int i = 0; i <= kGrid; ++i) {
      const double x = -nmax_ + i * delta_;
      const double f = i == 0 ? 0.0 : i == kGrid ? 1.0 : HeadNoiseCdf(es, eq, x);
      f_[i] = float(f);
      p_[i] = 1 - f;
      FillBinomial(1 - f, &cdf_[std::size_t(i) * heads], &guide_[std::size_t(i) * kGuide]);
    }
  }

  bool Is(double es, double eq, int heads) const {
    return es == es_ && eq == eq_ && heads == heads_;
  }
  double nmax() const { return nmax_; }
  double inv_delta() const { return inv_delta_; }
  double delta() const { return delta_; }
  const float* f() const { return f_.data(); }
  // P(N > x_i): a head keeps a token whose field is T - x_i.
  double p(int i) const { return p_[std::size_t(std::clamp(i, 0, kGrid))]; }
  const double* p_data() const { return p_.data(); }  // p(0..kGrid), unclamped
  // The number of heads keeping a token at grid point i, drawn by inverting the binomial at u.
  int Count(int i, std::uint32_t u) const {
    int c = guide_[std::size_t(i) * kGuide + (u >> (32 - kGuideBits))];
    const std::uint32_t* cdf = &cdf_[std::size_t(i) * heads_];
    while (c < heads_ && u >= cdf[c]) ++c;
    return c;
  }

 private:
  // cdf[c] = P(X <= c) * 2^32 (saturating: 2^32 - 1 is never reached by a draw) for
  // X ~ Binomial(heads, p), c < heads; guide[j] = X's value at u = j * 2^(32 - kGuideBits).
  void FillBinomial(double p, std::uint32_t* cdf, std::uint16_t* guide) const {
    const int h = heads_;
    auto threshold = [](double cum) -> std::uint32_t {
      const double v = std::floor(cum * 4294967296.0);
      return v >= 4294967295.0 ? 0xFFFFFFFFu : v <= 0 ? 0u : std::uint32_t(v);
    };
    if (p <= 0) {
      for (int c = 0; c < h; ++c) cdf[c] = 0xFFFFFFFFu;
    } else if (p >= 1) {
      for (int c = 0; c < h; ++c) cdf[c] = 0;
    } else {
      double lp = double(h) * std::log1p(-p);  // log P(X = 0)
      const double lr = std::log(p) - std::log1p(-p);
      double cum = 0;
      for (int c = 0; c < h; ++c) {
        cum += std::exp(lp);
        cdf[c] = threshold(std::min(cum, 1.0));
        lp += std::log(double(h - c) / double(c + 1)) + lr;
      }
    }
    for (int j = 0; j < kGuide; ++j) {
      const std::uint64_t u = std::uint64_t(j) << (32 - kGuideBits);
      int c = 0;
      while (c < h && u >= cdf[c]) ++c;
      guide[j] = static_cast<std::uint16_t>(c);
    }
  }

  double es_, eq_;
  int heads_;
  double nmax_ = 0, delta_ = 0, inv_delta_ = 0;
  std::vector<float> f_;
  std::vector<double> p_;
  std::vector<std::uint32_t> cdf_;
  std::vector<std::uint16_t> guide_;
};

// The table of (es, eq, heads), built on first use: one per layer profile value in version 1
// and per (request, layer) with v2/v3's head_spread, so a few dozen are kept per thread.
const HeadNoiseTable& NoiseTableFor(double es, double eq, int heads) {
  thread_local std::vector<std::unique_ptr<HeadNoiseTable>> tables;
  for (const auto& t : tables) {
    if (t->Is(es, eq, heads)) return *t;
  }
  if (tables.size() >= 64) tables.erase(tables.begin());
  tables.push_back(std::make_unique<HeadNoiseTable>(es, eq, heads));
  return *tables.back();
}

// The draw's uniform per token and its grid point: u = F(es * U(key ^ ss) + eq * U(sq + t G))
// (F linear between grid points), the grid point nearest to T - c[t].
__attribute__((optimize("O3"))) void SampleInputs(const std::uint32_t* keys, const float* c,
                                                  std::int64_t n, std::uint32_t ss,
                                                  std::uint32_t sq, float es, float eq,
                                                  float nmax, float inv_delta, float tg,
                                                  const float* f, std::int32_t* grid,
                                                  std::uint32_t* u) {
  constexpr int kGrid = HeadNoiseTable::kGrid;
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint32_t g = static_cast<std::uint32_t>(t) * 0x9E3779B9u;
    const float v = es * Unit(hash::Hash32(keys[t] ^ ss)) + eq * Unit(hash::Hash32(sq + g));
    float sv = (v + nmax) * inv_delta;
    sv = sv < 0.0f ? 0.0f : sv;
    sv = sv > float(kGrid) - 0.5f ? float(kGrid) - 0.5f : sv;
    const int iv = static_cast<int>(sv);
    const float w = sv - float(iv);
    const float uf = f[iv] + w * (f[iv + 1] - f[iv]);
    const float us = uf * 4294967296.0f;
    u[t] = us >= 4294967040.0f ? 4294967040u : us <= 0.0f ? 0u : static_cast<std::uint32_t>(us);
    float s = tg - c[t] * inv_delta + 0.5f;
    s = s < 0.0f ? 0.0f : s;
    s = s > float(kGrid) ? float(kGrid) : s;
    grid[t] = static_cast<std::int32_t>(s);
  }
}

// The field's grid bins, b[t] = floor(c[t] * inv_delta + 0.5), and their least and greatest
// (SampleTopKCounts' histogram; vectorised here, computed once where it was computed twice).
__attribute__((optimize("O3"))) void FieldBins(const float* c, std::int64_t n, double inv_delta,
                                               std::int64_t* bins, std::int64_t* bmin,
                                               std::int64_t* bmax) {
  std::int64_t lo = std::numeric_limits<std::int64_t>::max();
  std::int64_t hi = std::numeric_limits<std::int64_t>::min();
  for (std::int64_t t = 0; t < n; ++t) {
    const auto b = static_cast<std::int64_t>(std::floor(double(c[t]) * inv_delta + 0.5));
    bins[t] = b;
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  *bmin = lo;
  *bmax = hi;
}

// sum over i < m of double(h[i]) * p[-i] (p walks down as h walks up), in 8 partial sums: the
// terms of SampleTopKCounts' E(j), in another order than its exact, ordered sum (one add at a
// time, each waiting on the last: ~a quarter of SampleTopKCounts' time, perf of a sampled
// as_h2o_lru run, session 11).
__attribute__((optimize("O3"))) double ProductSum8(const std::int64_t* h, const double* p,
                                                   std::int64_t m) {
  double acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += double(h[i + l]) * p[-(i + l)];
  }
  for (; i < m; ++i) acc[0] += double(h[i]) * p[-i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void ProceduralParams::Validate(const std::string& where) const {
  auto bad = [&](const std::string& what) { throw InputError(where + ": " + what); };
  if (head_corr.empty()) bad("head_corr: empty profile");
  for (double w : head_corr) {
    if (!(w >= 0 && w <= 1)) bad("head_corr: values must be in [0, 1]");
  }
  if (!(layer_corr >= 0 && layer_corr <= 1)) bad("layer_corr: must be in [0, 1]");
  if (!(query_dependence >= 0 && query_dependence <= 1)) bad("query_dependence: must be in [0, 1]");
  if (sink_tokens < 0 || sink_tokens > 1 << 20) bad("sink_tokens: must be in [0, 2^20]");
  if (!(sink_boost >= 0 && sink_boost <= 60)) bad("sink_boost: must be in [0, 60]");
  if (!(tail > 0 && tail <= 20)) bad("tail: must be in (0, 20]");
  if (model < 1 || model > 4) bad("model: must be v1, v2, v3 or v4");
  if (!(persistent >= 0 && persistent <= 1)) bad("persistent: must be in [0, 1]");
  if (!(persistent_query >= 0 && persistent_query <= 1)) bad("persistent_query: must be in [0, 1]");
  if (!(head_spread >= 0 && head_spread <= 10)) bad("head_spread: must be in [0, 10]");
  if (!(smooth >= 0 && smooth <= 1)) bad("smooth: must be in [0, 1]");
  if (!(slow >= 0 && slow <= 1)) bad("slow: must be in [0, 1]");
  if (!(persistent_corr >= 0 && persistent_corr <= 1)) bad("persistent_corr: must be in [0, 1]");
  if (!(slow_corr >= 0 && slow_corr <= 1)) bad("slow_corr: must be in [0, 1]");
  if (smooth_tokens < 1 || smooth_tokens > 1 << 16) bad("smooth_tokens: must be in [1, 65536]");
  if (recency.size() > 16) bad("recency: at most 16 values");
  for (double b : recency) {
    if (!(b >= -20 && b <= 20)) bad("recency: values must be in [-20, 20]");
  }
  if (factors < 0 || factors > 64) bad("factors: must be in [0, 64]");
  if (factors == 0 && !loadings.empty()) bad("loadings: given without factors");
  if (factors > 0) {
    const std::size_t k = std::size_t(factors);
    if (loadings.empty() || loadings.size() % k != 0 || loadings.size() / k > 4096) {
      bad("loadings: expected 1 to 4096 rows of factors = " + std::to_string(factors) +
          " values (" + std::to_string(loadings.size()) + " given)");
    }
    for (std::size_t i = 0; i < loadings.size(); i += k) {
      double norm = 0;
      for (std::size_t j = 0; j < k; ++j) {
        if (!(std::abs(loadings[i + j]) <= 1)) bad("loadings: values must be in [-1, 1]");
        norm += loadings[i + j] * loadings[i + j];
      }
      if (norm > 1 + 1e-6) {
        bad("loadings: row " + std::to_string(i / k) + " has squared norm " +
            std::to_string(norm) + " > 1");
      }
    }
  }
  if (!(focus >= 0 && focus < 1)) bad("focus: must be in [0, 1)");
  if (focus_tokens < 1 || focus_tokens > 1 << 16) bad("focus_tokens: must be in [1, 65536]");
  if (!(skew >= -1.5 && skew <= 1.5)) bad("skew: must be in [-1.5, 1.5]");
}

namespace {
// The uniforms of a head's noise: Unit() = A + B, A and B uniform on [-h, h],
// h = 32767.5 * kUnitScale; es * Unit() + eq * Unit() is four of them. A width below 1e-4 of
// the larger one is left out (its share of the CDF is below 1e-4; the closed form below
// cancels badly with widths that far apart).
int NoiseWidths(double es, double eq, double* widths) {
  const double h = 32767.5 * double(kUnitScale);
  const double big = std::max(std::abs(es), std::abs(eq));
  int m = 0;
  for (double e : {std::abs(es), std::abs(eq)}) {
    if (e > 0 && e >= 1e-4 * big) {
      widths[m++] = 2 * h * e;
      widths[m++] = 2 * h * e;
    }
  }
  return m;
}
}  // namespace

double HeadNoiseSupport(double es, double eq) {
  double a[4];
  const int m = NoiseWidths(es, eq, a);
  double s = 0;
  for (int i = 0; i < m; ++i) s += a[i] / 2;
  return s;
}

// P(sum of m uniforms on [0, a_i] <= y) = 1 / (m! prod a_i) sum over subsets J of (-1)^|J|
// (y - sum_J a_j)_+^m; the sum of uniforms on [-a_i/2, a_i/2] is that shifted by sum a_i / 2.
double HeadNoiseCdf(double es, double eq, double x) {
  double a[4];
  const int m = NoiseWidths(es, eq, a);
  if (m == 0) return x >= 0 ? 1.0 : 0.0;
  double half = 0, prod = 1, fact = 1;
  for (int i = 0; i < m; ++i) {
    half += a[i] / 2;
    prod *= a[i];
    fact *= double(i + 1);
  }
  if (x <= -half) return 0;
  if (x >= half) return 1;
  const double y = x + half;
  double sum = 0;
  for (int mask = 0; mask < (1 << m); ++mask) {
    double shift = 0;
    int bits = 0;
    for (int i = 0; i < m; ++i) {
      if (mask & (1 << i)) {
        shift += a[i];
        ++bits;
      }
    }
    const double d = y - shift;
    if (d <= 0) continue;
    sum += (bits % 2 ? -1.0 : 1.0) * std::pow(d, m);
  }
  return std::clamp(sum / (fact * prod), 0.0, 1.0);
}

double ChainCorrelation(double layer_corr, int l, int l2) {
  if (l == l2) return 1;
  const double phi = std::acos(std::clamp(layer_corr, 0.0, 1.0));
  if (phi <= 0) return 1;
  const double quarter = std::numbers::pi / 2;
  auto at = [&](int layer, std::uint64_t* anchor) {
    const double angle = double(layer) * phi;
    *anchor = static_cast<std::uint64_t>(std::floor(angle / quarter));
    double a = angle - double(*anchor) * quarter;
    if (a >= quarter) a = quarter - 1e-12;  // as Scores
    return a;
  };
  std::uint64_t i = 0, i2 = 0;
  double a = at(std::min(l, l2), &i), a2 = at(std::max(l, l2), &i2);
  if (i == i2) return std::cos(a - a2);
  if (i2 == i + 1) return std::sin(a) * std::cos(a2);
  return 0;
}

std::string ProceduralParams::ToString() const {
  std::ostringstream s;
  s.precision(6);
  s << "seed=" << seed << " head_corr=";
  for (std::size_t i = 0; i < head_corr.size(); ++i) s << (i ? "," : "") << head_corr[i];
  s << " layer_corr=" << layer_corr << " query_dependence=" << query_dependence
    << " sink_tokens=" << sink_tokens << " sink_boost=" << sink_boost << " tail=" << tail;
  auto recency_list = [&] {
    s << " recency=";
    for (std::size_t i = 0; i < recency.size(); ++i) s << (i ? "," : "") << recency[i];
    if (recency.empty()) s << "none";
  };
  if (model == 2) {
    s << " model=v2 persistent=" << persistent << " persistent_corr=" << persistent_corr
      << " persistent_query=" << persistent_query
      << " slow=" << slow << " slow_corr=" << slow_corr << " smooth=" << smooth
      << " smooth_tokens=" << smooth_tokens
      << " head_spread=" << head_spread;
    recency_list();
  } else if (model == 3 || model == 4) {
    s << " model=v" << model << " persistent_query=" << persistent_query << " smooth=" << smooth
      << " smooth_tokens=" << smooth_tokens << " head_spread=" << head_spread;
    recency_list();
    s << " focus=" << focus << " focus_tokens=" << focus_tokens << " factors=" << factors
      << " loadings=";
    for (std::size_t i = 0; i < loadings.size(); ++i) s << (i ? "," : "") << loadings[i];
    if (loadings.empty()) s << "none";
    if (model == 4) s << " skew=" << skew;
  }
  return s.str();
}

void PrefixTokenKeys(const Request& request, std::vector<std::uint32_t>* keys,
                     std::int64_t max_tokens) {
  std::int64_t total = request.prefix_tokens();
  if (max_tokens >= 0) total = std::min(total, max_tokens);
  keys->resize(static_cast<std::size_t>(total));
  std::uint64_t h = hash::ChainStart(request.tokens_per_symbol);
  const int tps = request.tokens_per_symbol;
  std::int64_t t = 0;
  for (std::size_t i = 0; i < request.prefix.size() && t < total; ++i) {
    h = hash::ChainNext(h, request.prefix[i]);
    if (tps == 1) {
      (*keys)[t++] = static_cast<std::uint32_t>(h ^ (h >> 32));
    } else {
      const auto base = static_cast<std::uint32_t>(h ^ (h >> 32));
      for (int o = 0; o < tps && t < total; ++o) {
        (*keys)[t++] = hash::Hash32(base + static_cast<std::uint32_t>(o) * 0x9E3779B9u);
      }
    }
  }
}

std::uint64_t DefaultQueryKey(std::uint64_t seed, RequestId id) {
  return hash::Combine(seed ^ 0x7175657279ull, id);
}

ImportanceModel::ImportanceModel(const ProceduralParams& params, int layers, int kv_heads)
    : params_(params), layers_(layers), kv_heads_(kv_heads) {
  KVTIER_CHECK(layers >= 1 && kv_heads >= 1, "ImportanceModel needs a model shape");
  const auto& p = params_.head_corr;
  w_.resize(layers);
  for (int l = 0; l < layers; ++l) {
    if (p.size() == 1 || layers == 1) {
      w_[l] = p.size() == 1 ? p[0] : p[0];
      continue;
    }
    const double x = double(l) / double(layers - 1) * double(p.size() - 1);
    const std::size_t i = std::min<std::size_t>(static_cast<std::size_t>(x), p.size() - 2);
    const double f = x - double(i);
    w_[l] = p[i] * (1 - f) + p[i + 1] * f;
  }
  if ((params_.model == 3 || params_.model == 4) && params_.factors > 0) {
    // Loadings by relative depth, rows interpolated linearly (a convex combination of rows of
    // norm <= 1 keeps norm <= 1).
    const std::size_t k = std::size_t(params_.factors);
    const std::size_t rows = params_.loadings.size() / k;
    b_.assign(std::size_t(layers) * k, 0.0);
    for (int l = 0; l < layers; ++l) {
      std::size_t i = 0;
      double f = 0;
      if (rows > 1 && layers > 1) {
        const double x = double(l) / double(layers - 1) * double(rows - 1);
        i = std::min<std::size_t>(static_cast<std::size_t>(x), rows - 2);
        f = x - double(i);
      }
      for (std::size_t j = 0; j < k; ++j) {
        const double a = params_.loadings[i * k + j];
        const double b = rows > 1 ? params_.loadings[(i + 1) * k + j] : a;
        b_[std::size_t(l) * k + j] = a * (1 - f) + b * f;
      }
    }
  }
  phi_ = std::acos(std::clamp(params_.layer_corr, 0.0, 1.0));
  phi_slow_ = std::acos(std::clamp(params_.slow_corr, 0.0, 1.0));
  phi_persist_ = std::acos(std::clamp(params_.persistent_corr, 0.0, 1.0));
}

std::size_t ImportanceModel::AnchorCache::bytes() const {
  std::size_t b = 0;
  for (const Row& r : rows_) b += r.unit.capacity() * sizeof(float);
  return b;
}

const float* ImportanceModel::AnchorCache::Get(const ImportanceModel& m,
                                               std::span<const std::uint32_t> keys,
                                               std::uint64_t query_key, std::uint64_t anchor,
                                               bool query, std::int64_t n) {
  Row* row = nullptr;
  for (Row& r : rows_) {
    if (r.anchor == anchor && r.query == query) row = &r;
  }
  if (row == nullptr) {
    // Layers come in ascending order, so anchors below anchor - 1 are done with (a layer
    // asked for again later recomputes its row, the same values): memory for ~3 anchors, not
    // ~14. Scores() holds a row of `anchor - 1` at most while it asks for `anchor`.
    std::erase_if(rows_, [&](const Row& r) { return r.anchor + 1 < anchor; });
    row = &rows_.emplace_back();
    row->anchor = anchor;
    row->query = query;
  }
  if (std::int64_t(row->unit.size()) < n) {
    row->unit.resize(static_cast<std::size_t>(n));
    const std::uint64_t seed = m.params_.seed;
    float* u = row->unit.data();
    if (query) {
      UnitRowQuery(n, Salt(seed, kTagQueryAnchor, anchor, query_key), u);
    } else {
      UnitRowStatic(keys.data(), n, Salt(seed, kTagStaticAnchor, anchor, 0), u);
    }
  }
  return row->unit.data();
}

void ImportanceModel::Scores(std::span<const std::uint32_t> token_keys, std::uint64_t query_key,
                             int layer, std::span<const int> heads, std::int64_t n, float* out,
                             std::int64_t prefix_tokens, AnchorCache* anchors) const {
  KVTIER_DCHECK(static_cast<std::int64_t>(token_keys.size()) >= n, "token keys too short");
  KVTIER_DCHECK(layer >= 0 && layer < layers_, "layer out of range");
  if (n <= 0) return;
  thread_local std::vector<float> field;
  double es = 0, eq = 0;
  Field(token_keys, query_key, layer, n, prefix_tokens, anchors, &field, &es, &eq);
  HeadRows(token_keys.data(), field.data(), n, query_key, layer, heads, es, eq, out);
}

void ImportanceModel::Field(std::span<const std::uint32_t> token_keys, std::uint64_t query_key,
                            int layer, std::int64_t n, std::int64_t prefix_tokens,
                            AnchorCache* anchors, std::vector<float>* field, double* es_out,
                            double* eq_out) const {
  if (params_.model == 2) {
    FieldV2(token_keys, query_key, layer, n,
            prefix_tokens >= 0 ? prefix_tokens : std::int64_t(token_keys.size()), field, es_out,
            eq_out);
    return;
  }
  if (params_.model == 3 || params_.model == 4) {
    FieldV3(token_keys, query_key, layer, n,
            prefix_tokens >= 0 ? prefix_tokens : std::int64_t(token_keys.size()), field, es_out,
            eq_out);
    return;
  }
  std::vector<float>& common = *field;
  common.resize(static_cast<std::size_t>(n));
  // Anchor chain: layer l sits at angle l*phi; anchors every pi/2.
  const double angle = double(layer) * phi_;
  const double quarter = std::numbers::pi / 2;
  std::uint64_t anchor = phi_ > 0 ? static_cast<std::uint64_t>(std::floor(angle / quarter)) : 0;
  double a = angle - double(anchor) * quarter;
  if (a >= quarter) a = quarter - 1e-12;  // floating guard
  const double w = w_[layer];
  const double g = params_.query_dependence;
  const double tail = params_.tail;
  const double cs = tail * std::sqrt(w * (1 - g)), cq = tail * std::sqrt(w * g);
  const double es = tail * std::sqrt((1 - w) * (1 - g)), eq = tail * std::sqrt((1 - w) * g);
  const std::uint64_t seed = params_.seed;

  if (anchors != nullptr) {
    // A row's buffer stays where it is when a later Get adds a row (moving a vector keeps its
    // buffer), and Get only grows the row it returns.
    const float* sa = anchors->Get(*this, token_keys, query_key, anchor, false, n);
    const float* sb = anchors->Get(*this, token_keys, query_key, anchor + 1, false, n);
    AnchorMixRows(sa, sb, n, float(cs * std::cos(a)), float(cs * std::sin(a)), common.data());
    const float* qa = anchors->Get(*this, token_keys, query_key, anchor, true, n);
    const float* qb = anchors->Get(*this, token_keys, query_key, anchor + 1, true, n);
    AnchorMixRowsAdd(qa, qb, n, float(cq * std::cos(a)), float(cq * std::sin(a)),
                     common.data());
  } else {
    AnchorMixStatic(token_keys.data(), n, Salt(seed, kTagStaticAnchor, anchor, 0),
                    Salt(seed, kTagStaticAnchor, anchor + 1, 0), float(cs * std::cos(a)),
                    float(cs * std::sin(a)), common.data());
    AnchorMixQuery(n, Salt(seed, kTagQueryAnchor, anchor, query_key),
                   Salt(seed, kTagQueryAnchor, anchor + 1, query_key), float(cq * std::cos(a)),
                   float(cq * std::sin(a)), common.data());
  }
  *es_out = es;
  *eq_out = eq;
}

void ImportanceModel::HeadRows(const std::uint32_t* keys, const float* common, std::int64_t n,
                               std::uint64_t query_key, int layer, std::span<const int> heads,
                               double es, double eq, float* out) const {
  const std::uint64_t seed = params_.seed;
  const float boost = std::exp2(static_cast<float>(params_.sink_boost));
  const std::int64_t sinks = std::min<std::int64_t>(params_.sink_tokens, n);
  for (std::size_t j = 0; j < heads.size(); ++j) {
    KVTIER_DCHECK(heads[j] >= 0 && heads[j] < kv_heads_, "head out of range");
    const auto h = static_cast<std::uint64_t>(heads[j]);
    float* row = out + j * n;
    HeadRow(keys, common, n, Salt(seed, kTagStaticHead, layer, h),
            Salt(seed ^ query_key, kTagQueryHead, layer, h), float(es), float(eq), row);
    for (std::int64_t t = 0; t < sinks; ++t) row[t] *= boost;
  }
}

void ImportanceModel::FieldV2(std::span<const std::uint32_t> token_keys,
                              std::uint64_t query_key, int layer, std::int64_t n,
                              std::int64_t prefix_tokens, std::vector<float>* field,
                              double* es_out, double* eq_out) const {
  const ProceduralParams& p = params_;
  std::vector<float>& shared = *field;
  // With smoothing, the field is needed up to the knot after the last token (or the prefix end).
  const std::int64_t m = p.smooth_tokens;
  const std::int64_t field_n =
      p.smooth > 0 ? std::max<std::int64_t>(
                         n, std::min<std::int64_t>(std::int64_t(token_keys.size()), ((n - 1) / m + 1) * m + 1))
                   : n;
  shared.resize(static_cast<std::size_t>(field_n));
  const std::uint64_t seed = p.seed;
  // Head agreement of this (request, layer).
  double w = w_[layer];
  if (p.head_spread > 0) {
    const double u = Unit(Salt(seed, kTagHeadSpread, std::uint64_t(layer), query_key));
    const double wc = std::clamp(w, 1e-4, 1 - 1e-4);
    w = 1.0 / (1.0 + std::exp(-(std::log(wc / (1 - wc)) + p.head_spread * u)));
  }
  // The layer-varying chains, as version 1's (anchors every pi/2 of rotation): the fast one
  // (layer_corr) and the slow one (slow_corr).
  const double g = p.query_dependence, pi = p.persistent;
  auto chain = [&](double phi, double share, double g, std::uint64_t tag_s, std::uint64_t tag_q,
                   bool first) {
    const double angle = double(layer) * phi;
    const double quarter = std::numbers::pi / 2;
    const std::uint64_t anchor =
        phi > 0 ? static_cast<std::uint64_t>(std::floor(angle / quarter)) : 0;
    double a = angle - double(anchor) * quarter;
    if (a >= quarter) a = quarter - 1e-12;
    const double cs = std::sqrt(share * (1 - g)), cq = std::sqrt(share * g);
    if (first) {
      AnchorMixStatic(token_keys.data(), field_n, Salt(seed, tag_s, anchor, 0),
                      Salt(seed, tag_s, anchor + 1, 0), float(cs * std::cos(a)),
                      float(cs * std::sin(a)), shared.data());
    } else {
      PersistentAdd(token_keys.data(), field_n, Salt(seed, tag_s, anchor, 0), 0, float(cs * std::cos(a)),
                    0.0f, shared.data());
      PersistentAdd(token_keys.data(), field_n, Salt(seed, tag_s, anchor + 1, 0), 0,
                    float(cs * std::sin(a)), 0.0f, shared.data());
    }
    if (cq > 0 || first) {
      AnchorMixQuery(field_n, Salt(seed, tag_q, anchor, query_key),
                     Salt(seed, tag_q, anchor + 1, query_key), float(cq * std::cos(a)),
                     float(cq * std::sin(a)), shared.data());
    }
  };
  chain(phi_, (1 - pi) * (1 - p.slow), g, kTagStaticAnchor, kTagQueryAnchor, true);
  if (p.slow > 0) chain(phi_slow_, (1 - pi) * p.slow, g, kTagSlowStatic, kTagSlowQuery, false);
  // The persistent field: the same P in every layer (persistent_corr 1), or a very slow chain.
  if (pi > 0) {
    chain(phi_persist_, pi, p.persistent_query, kTagPersistStatic, kTagPersistQuery, false);
  }
  if (p.smooth > 0) SmoothField(&shared, n, p.smooth_tokens, p.smooth);
  AddRecency(p.recency, prefix_tokens, n, shared.data());
  const double tail = p.tail;
  const float scale = float(tail * std::sqrt(w));
  for (std::int64_t t = 0; t < n; ++t) shared[t] *= scale;
  *es_out = tail * std::sqrt((1 - w) * (1 - g));
  *eq_out = tail * std::sqrt((1 - w) * g);
}

void ImportanceModel::FieldV3(std::span<const std::uint32_t> token_keys,
                              std::uint64_t query_key, int layer, std::int64_t n,
                              std::int64_t prefix_tokens, std::vector<float>* field,
                              double* es_out, double* eq_out) const {
  const ProceduralParams& p = params_;
  std::vector<float>& shared = *field;
  // With smoothing, the field is needed up to the knot after the last token (or the prefix end).
  const std::int64_t m = p.smooth_tokens;
  const std::int64_t field_n =
      p.smooth > 0
          ? std::max<std::int64_t>(n, std::min<std::int64_t>(std::int64_t(token_keys.size()),
                                                             ((n - 1) / m + 1) * m + 1))
          : n;
  shared.resize(static_cast<std::size_t>(field_n));
  const std::uint64_t seed = p.seed;
  double w = w_[layer];
  if (p.head_spread > 0) {
    const double u = Unit(Salt(seed, kTagHeadSpread, std::uint64_t(layer), query_key));
    const double wc = std::clamp(w, 1e-4, 1 - 1e-4);
    w = 1.0 / (1.0 + std::exp(-(std::log(wc / (1 - wc)) + p.head_spread * u)));
  }
  // The residual chain, as version 1's (anchors every pi/2 of rotation), with the share of the
  // field the K shared fields leave to this layer.
  const std::span<const double> b = loadings(layer);
  double common = 0;
  for (double v : b) common += v * v;
  const double g = p.query_dependence, r = std::max(0.0, 1 - common);
  {
    const double angle = double(layer) * phi_;
    const double quarter = std::numbers::pi / 2;
    const std::uint64_t anchor =
        phi_ > 0 ? static_cast<std::uint64_t>(std::floor(angle / quarter)) : 0;
    double a = angle - double(anchor) * quarter;
    if (a >= quarter) a = quarter - 1e-12;
    const double cs = std::sqrt(r * (1 - g)), cq = std::sqrt(r * g);
    AnchorMixStatic(token_keys.data(), field_n, Salt(seed, kTagStaticAnchor, anchor, 0),
                    Salt(seed, kTagStaticAnchor, anchor + 1, 0), float(cs * std::cos(a)),
                    float(cs * std::sin(a)), shared.data());
    if (cq > 0) {
      AnchorMixQuery(field_n, Salt(seed, kTagQueryAnchor, anchor, query_key),
                     Salt(seed, kTagQueryAnchor, anchor + 1, query_key), float(cq * std::cos(a)),
                     float(cq * std::sin(a)), shared.data());
    }
  }
  // The K fields shared across layers, with this layer's loadings; version 4 skews their sum.
  const double gs = std::sqrt(1 - p.persistent_query), gq = std::sqrt(p.persistent_query);
  const bool skewed = p.skew != 0 && common > 0;
  thread_local std::vector<float> fields;
  if (skewed) fields.assign(static_cast<std::size_t>(field_n), 0.0f);
  for (std::size_t k = 0; k < b.size(); ++k) {
    if (b[k] == 0) continue;
    FactorAdd(token_keys.data(), field_n, Salt(seed, kTagFactorStatic, k, 0),
              Salt(seed, kTagFactorQuery, k, query_key), float(b[k] * gs), float(b[k] * gq),
              skewed ? fields.data() : shared.data());
  }
  if (skewed) SkewAdd(fields.data(), field_n, std::sqrt(common), p.skew, shared.data());
  if (p.smooth > 0) SmoothField(&shared, n, p.smooth_tokens, p.smooth);
  if (p.focus > 0) {
    AddFocus(shared.data(), n, p.focus_tokens, p.focus, Salt(seed, kTagFocus, 0, query_key));
  }
  AddRecency(p.recency, prefix_tokens, n, shared.data());
  const double tail = p.tail;
  const float scale = float(tail * std::sqrt(w));
  for (std::int64_t t = 0; t < n; ++t) shared[t] *= scale;
  *es_out = tail * std::sqrt((1 - w) * (1 - g));
  *eq_out = tail * std::sqrt((1 - w) * g);
}

void ImportanceModel::SampleTopKCounts(std::span<const std::uint32_t> token_keys,
                                       std::uint64_t query_key, int layer, int heads,
                                       std::int64_t n, std::int64_t k,
                                       std::vector<std::uint16_t>* counts,
                                       std::int64_t prefix_tokens, AnchorCache* anchors) const {
  KVTIER_CHECK(heads >= 1 && heads <= 65535 && n >= 0 && k >= 0 && k <= n,
               "SampleTopKCounts needs 1 <= heads <= 65535 and 0 <= k <= n");
  KVTIER_CHECK(static_cast<std::int64_t>(token_keys.size()) >= n, "token keys too short");
  KVTIER_CHECK(layer >= 0 && layer < layers_, "layer out of range");
  counts->assign(static_cast<std::size_t>(n), 0);
  if (k == 0) return;
  if (k == n) {
    std::fill(counts->begin(), counts->end(), static_cast<std::uint16_t>(heads));
    return;
  }
  thread_local std::vector<float> field;
  double es = 0, eq = 0;
  Field(token_keys, query_key, layer, n, prefix_tokens, anchors, &field, &es, &eq);
  const HeadNoiseTable& table = NoiseTableFor(es, eq, heads);
  std::uint16_t* of = counts->data();
  if (table.nmax() <= 0) {
    // No noise of their own: every head's row is the field's (HeadRows with es = eq = 0), so
    // every head keeps the same k tokens -- the exact path's answer.
    thread_local std::vector<float> row;
    row.resize(static_cast<std::size_t>(n));
    const int head0 = 0;
    HeadRows(token_keys.data(), field.data(), n, query_key, layer, std::span<const int>(&head0, 1),
             0.0, 0.0, row.data());
    for (std::int32_t t : TopK(row, k)) of[t] = static_cast<std::uint16_t>(heads);
    return;
  }
  // The sinks' boost in log2 units (HeadRows multiplies their scores by 2^sink_boost).
  float* c = field.data();
  const std::int64_t sinks = std::min<std::int64_t>(params_.sink_tokens, n);
  for (std::int64_t t = 0; t < sinks; ++t) c[t] += static_cast<float>(params_.sink_boost);

  // T: the field level a head's k-th token sits at, sum_t P(c[t] + N > T) = k. With c binned
  // to the grid (b = round(c / delta)) and T = j delta, token t is at grid point
  // j + G/2 - b; E(j) (expected tokens kept per head) falls with j: the last j with
  // E(j) >= k, then linear between j and j + 1.
  constexpr int kGrid = HeadNoiseTable::kGrid;
  const double inv_delta = table.inv_delta();
  thread_local std::vector<std::int64_t> hist, bins;
  bins.resize(static_cast<std::size_t>(n));
  std::int64_t bmin = 0, bmax = 0;
  FieldBins(c, n, inv_delta, bins.data(), &bmin, &bmax);
  hist.assign(static_cast<std::size_t>(bmax - bmin + 1), 0);
  for (std::int64_t t = 0; t < n; ++t) ++hist[static_cast<std::size_t>(bins[t] - bmin)];
  // above[i] = tokens with b >= bmin + i (an integer: the same as adding their counts one by
  // one in double, every partial sum exact below 2^53; the adds were a scalar walk per E(j)).
  thread_local std::vector<std::int64_t> above;
  above.assign(hist.size() + 1, 0);
  for (std::size_t i = hist.size(); i-- > 0;) above[i] = above[i + 1] + hist[i];
  auto all_heads = [&](std::int64_t j) {  // tokens with b >= j + G/2
    const std::int64_t from = std::max(bmin, j + kGrid / 2);
    return from > bmax ? std::int64_t{0} : above[static_cast<std::size_t>(from - bmin)];
  };
  auto expected = [&](std::int64_t j) {
    // Tokens with b >= j + G/2 are kept by every head (grid point <= 0), b <= j - G/2 by none.
    double e = double(all_heads(j));
    const std::int64_t lo = std::max(bmin, j - kGrid / 2 + 1);
    const std::int64_t hi = std::min(bmax, j + kGrid / 2 - 1);
    for (std::int64_t b = lo; b <= hi; ++b) {
      e += double(hist[static_cast<std::size_t>(b - bmin)]) * table.p(int(j + kGrid / 2 - b));
    }
    return e;
  };
  // The binary search below asks only whether E(mid) >= k. The same terms summed in another
  // order (ProductSum8) answer that unless they land within the two orders' rounding of k:
  // either sum of m nonnegative terms is within (m - 1) u / (1 - (m - 1) u) of their exact sum
  // (u = 2^-53), so within 4 (m + 2) u of the fast sum of each other (the counts' part is an
  // integer, exact in both). Only then is the ordered sum computed: the same comparisons, so
  // the same T.
  auto at_least_k = [&](std::int64_t j) {
    const std::int64_t whole = all_heads(j);
    const std::int64_t lo = std::max(bmin, j - kGrid / 2 + 1);
    const std::int64_t hi = std::min(bmax, j + kGrid / 2 - 1);
    const std::int64_t m = std::max<std::int64_t>(0, hi - lo + 1);
    // Between lo and hi the grid point j + G/2 - b lies in [1, G - 1]: p() needs no clamp.
    const double e =
        double(whole) + (m > 0 ? ProductSum8(hist.data() + (lo - bmin),
                                             table.p_data() + (j + kGrid / 2 - lo), m)
                               : 0.0);
    const double slack = 4.0 * double(m + 2) * 0x1p-53 * e;
    if (e - slack >= double(k)) return true;
    if (e + slack < double(k)) return false;
    return expected(j) >= double(k);
  };
  std::int64_t jlo = bmin - kGrid / 2, jhi = bmax + kGrid / 2;  // E(jlo) = n >= k > 0 = E(jhi)
  while (jhi - jlo > 1) {
    const std::int64_t mid = jlo + (jhi - jlo) / 2;
    (at_least_k(mid) ? jlo : jhi) = mid;
  }
  const double e0 = expected(jlo), e1 = expected(jhi);
  const double frac = e0 > e1 ? std::clamp((e0 - double(k)) / (e0 - e1), 0.0, 1.0) : 0.0;
  const double tg = double(jlo) + frac + kGrid / 2;  // T / delta + G/2

  thread_local std::vector<std::int32_t> grid;
  thread_local std::vector<std::uint32_t> u;
  grid.resize(static_cast<std::size_t>(n));
  u.resize(static_cast<std::size_t>(n));
  const std::uint64_t seed = params_.seed;
  SampleInputs(token_keys.data(), c, n, Salt(seed, kTagSampleStatic, std::uint64_t(layer), 0),
               Salt(seed ^ query_key, kTagSampleQuery, std::uint64_t(layer), 0), float(es),
               float(eq), float(table.nmax()), float(inv_delta), float(tg), table.f(),
               grid.data(), u.data());
  for (std::int64_t t = 0; t < n; ++t) {
    of[t] = static_cast<std::uint16_t>(table.Count(grid[t], u[t]));
  }
}

}  // namespace kvtier
