#include "traces/decode_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include "core/check.h"
#include "core/errors.h"
#include "traces/hash.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Correlations at which the inversion curves are measured (denser near 1, where overlap
// changes fastest).
const std::vector<double>& CurveGrid() {
  static const std::vector<double> grid = {0,    0.1,  0.2,  0.3,  0.4,  0.5,   0.6, 0.7, 0.8,
                                           0.85, 0.9,  0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 1};
  return grid;
}

// The shape of a record's decode sets without the sets.
DecodeTopKSets ShapeOf(const DecodeTopKSets& s) {
  DecodeTopKSets shape;
  shape.steps = s.steps;
  shape.k = s.k;
  shape.layers = s.layers;
  shape.kv_heads = s.kv_heads;
  shape.context = s.context;
  shape.candidates = s.candidates;
  if (!s.prefetched.empty()) shape.prefetched.resize(1);  // marks "has prefetched sets"
  return shape;
}

// Inverts a curve y(r) sampled at CurveGrid(), made non-decreasing, at value y: linear in
// between, clamped to the grid's ends. NaN when y is NaN.
double Invert(const std::vector<double>& curve, double y) {
  if (std::isnan(y)) return kNaN;
  const std::vector<double>& g = CurveGrid();
  std::vector<double> c(curve);
  for (std::size_t i = 1; i < c.size(); ++i) c[i] = std::max(c[i], c[i - 1]);
  if (y <= c.front()) return g.front();
  if (y >= c.back()) return g.back();
  for (std::size_t i = 1; i < c.size(); ++i) {
    if (y <= c[i]) {
      const double span = c[i] - c[i - 1];
      const double f = span > 0 ? (y - c[i - 1]) / span : 0;
      return g[i - 1] + f * (g[i] - g[i - 1]);
    }
  }
  return g.back();
}

double MeanOf(const std::vector<double>& v) {
  double s = 0;
  int n = 0;
  for (double x : v) {
    if (!std::isnan(x)) {
      s += x;
      ++n;
    }
  }
  return n ? s / n : kNaN;
}

// Least squares of r(d) = a + b rho(d), a, b >= 0, a + b <= 1, over the lags with a value.
// Returns the squared error; sets *a, *b.
double FitLayer(const std::vector<double>& r, const std::vector<double>& rho, double* a,
                double* b) {
  std::vector<double> rs, ps;
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (!std::isnan(r[i])) {
      rs.push_back(r[i]);
      ps.push_back(rho[i]);
    }
  }
  *a = 0;
  *b = 0;
  if (rs.empty()) return 0;
  auto err = [&](double x, double y) {
    double e = 0;
    for (std::size_t i = 0; i < rs.size(); ++i) e += (rs[i] - x - y * ps[i]) * (rs[i] - x - y * ps[i]);
    return e;
  };
  auto feasible = [](double x, double y) {
    return x >= -1e-12 && y >= -1e-12 && x + y <= 1 + 1e-12;
  };
  const double n = double(rs.size());
  double sr = 0, sp = 0, spp = 0, srp = 0;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    sr += rs[i];
    sp += ps[i];
    spp += ps[i] * ps[i];
    srp += rs[i] * ps[i];
  }
  // Candidates: b = 0 first (a stable share explains a flat curve), then the other edges, the
  // corners and the unconstrained optimum; the best feasible one wins (ties keep the first).
  std::vector<std::pair<double, double>> cand;
  cand.push_back({std::clamp(sr / n, 0.0, 1.0), 0.0});
  if (spp > 0) cand.push_back({0.0, std::clamp(srp / spp, 0.0, 1.0)});
  {  // a + b = 1: r - rho = a (1 - rho)
    double num = 0, den = 0;
    for (std::size_t i = 0; i < rs.size(); ++i) {
      num += (rs[i] - ps[i]) * (1 - ps[i]);
      den += (1 - ps[i]) * (1 - ps[i]);
    }
    const double x = den > 0 ? std::clamp(num / den, 0.0, 1.0) : 1.0;
    cand.push_back({x, 1 - x});
  }
  cand.push_back({0.0, 0.0});
  cand.push_back({1.0, 0.0});
  cand.push_back({0.0, 1.0});
  const double det = n * spp - sp * sp;
  if (std::fabs(det) > 1e-9 * std::max(1.0, n * spp)) {
    const double y = (n * srp - sp * sr) / det, x = (sr - y * sp) / n;
    if (feasible(x, y)) cand.push_back({x, y});
  }
  double best = std::numeric_limits<double>::infinity();
  for (const auto& [x, y] : cand) {
    if (!feasible(x, y)) continue;
    const double e = err(x, y);
    if (e < best - 1e-12) {
      best = e;
      *a = std::max(0.0, x);
      *b = std::max(0.0, y);
    }
  }
  return best;
}

// The minimum of f over the box [lo, hi] by Nelder-Mead (reflection 1, expansion 2,
// contraction 1/2, shrink 1/2; points clamped into the box), from x0 with initial steps `step`
// (towards the box's interior), within `max_evals` evaluations. Deterministic.
template <typename F>
std::vector<double> NelderMead(F f, std::vector<double> x0, const std::vector<double>& lo,
                               const std::vector<double>& hi, const std::vector<double>& step,
                               int max_evals) {
  const std::size_t d = x0.size();
  auto clamp = [&](std::vector<double> x) {
    for (std::size_t i = 0; i < d; ++i) x[i] = std::clamp(x[i], lo[i], hi[i]);
    return x;
  };
  int evals = 0;
  auto eval = [&](const std::vector<double>& x) {
    ++evals;
    return f(x);
  };
  std::vector<std::vector<double>> pts = {clamp(x0)};
  for (std::size_t i = 0; i < d; ++i) {
    std::vector<double> x = pts[0];
    x[i] += x[i] + step[i] <= hi[i] ? step[i] : -step[i];
    pts.push_back(clamp(x));
  }
  std::vector<double> val(pts.size());
  for (std::size_t i = 0; i < pts.size(); ++i) val[i] = eval(pts[i]);
  std::vector<std::size_t> order(pts.size());
  while (evals < max_evals) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return val[a] < val[b]; });
    const std::size_t best = order.front(), worst = order.back(), second = order[d - 1];
    std::vector<double> c(d, 0.0);
    for (std::size_t i : order) {
      if (i == worst) continue;
      for (std::size_t j = 0; j < d; ++j) c[j] += pts[i][j] / double(d);
    }
    auto along = [&](double t) {
      std::vector<double> x(d);
      for (std::size_t j = 0; j < d; ++j) x[j] = c[j] + t * (pts[worst][j] - c[j]);
      return clamp(x);
    };
    const std::vector<double> xr = along(-1);
    const double fr = eval(xr);
    if (fr < val[best]) {
      const std::vector<double> xe = along(-2);
      const double fe = eval(xe);
      pts[worst] = fe < fr ? xe : xr;
      val[worst] = std::min(fe, fr);
    } else if (fr < val[second]) {
      pts[worst] = xr;
      val[worst] = fr;
    } else {
      const std::vector<double> xc = along(fr < val[worst] ? -0.5 : 0.5);
      const double fc = eval(xc);
      if (fc < std::min(fr, val[worst])) {
        pts[worst] = xc;
        val[worst] = fc;
      } else {  // shrink towards the best
        for (std::size_t i = 0; i < pts.size(); ++i) {
          if (i == best) continue;
          for (std::size_t j = 0; j < d; ++j) pts[i][j] = pts[best][j] + 0.5 * (pts[i][j] - pts[best][j]);
          val[i] = eval(pts[i]);
        }
      }
    }
  }
  std::size_t b = 0;
  for (std::size_t i = 1; i < pts.size(); ++i) {
    if (val[i] < val[b]) b = i;
  }
  return pts[b];
}

// NelderMead from each start (a tail near 0 and a heavy one: the error has a valley in each),
// `evals` evaluations each; the best end point.
template <typename F>
std::vector<double> BestOf(F f, const std::vector<std::vector<double>>& starts,
                           const std::vector<double>& lo, const std::vector<double>& hi,
                           const std::vector<double>& step, int evals) {
  std::vector<double> best;
  double fb = std::numeric_limits<double>::infinity();
  for (const auto& x0 : starts) {
    std::vector<double> x = NelderMead(f, x0, lo, hi, step, evals);
    const double fx = f(x);
    if (fx < fb) {
      fb = fx;
      best = std::move(x);
    }
  }
  return best;
}

// The fields of one layer on a sample of shapes (every KV head as a head), drawn once, and
// the statistics of their combination under a layer's parameters.
class LayerSample {
 public:
  LayerSample(const DecodeSetModel& model, const std::vector<DecodeTopKSets>& shapes,
              std::size_t n_shapes, int layer, bool spec, bool drift) {
    for (std::size_t i = 0; i < n_shapes; ++i) {
      const DecodeTopKSets& s = shapes[i];
      DecodeTopKSets shape = s;
      shape.layers = 1;
      shape.output.clear();
      shape.prefetched.clear();
      shapes_.push_back(shape);
      std::vector<DecodeFields> f(static_cast<std::size_t>(s.steps) * s.kv_heads);
      std::vector<std::vector<float>> g(s.kv_heads);  // the stable field at the most candidates
      for (int step = 0; step < s.steps; ++step) {
        for (int h = 0; h < s.kv_heads; ++h) {
          DecodeFields& x = f[std::size_t(step) * s.kv_heads + h];
          model.Fields(DecodeRequestKey(model.params().seed, i), step, layer, h,
                       s.candidates[step], spec, &x, drift);
          if (x.stable.size() > g[h].size()) g[h] = x.stable;
          x.stable = {};  // the same positions at every step: kept once, in g
        }
      }
      fields_.push_back(std::move(f));
      stable_.push_back(std::move(g));
    }
  }

  // With `output` false the output sets of the previous call are kept (parameters that only
  // move the prefetched sets).
  DecodeStats Measure(const DecodeLayerParams& lp, const DecodeStatsOptions& so, bool spec,
                      bool output = true) {
    DecodeStatsAccumulator acc(so);
    for (std::size_t i = 0; i < shapes_.size(); ++i) {
      DecodeTopKSets& s = shapes_[i];
      const std::size_t total = static_cast<std::size_t>(s.steps) * s.kv_heads;
      s.output.resize(total);
      s.prefetched.resize(spec ? total : 0);
      tails_.resize(s.kv_heads);
      for (int h = 0; h < s.kv_heads; ++h) DecodeSetModel::HeavyTail(lp.tail, stable_[i][h], &tails_[h]);
      for (std::size_t j = 0; j < total; ++j) {
        DecodeSetModel::Combine(lp, tails_[j % s.kv_heads], fields_[i][j], s.k,
                                output ? &s.output[j] : nullptr,
                                spec ? &s.prefetched[j] : nullptr, scratch_);
      }
      acc.Add(s);
    }
    return acc.Result();
  }

 private:
  std::vector<DecodeTopKSets> shapes_;
  std::vector<std::vector<DecodeFields>> fields_;  // [shape][step * kv_heads + head]
  std::vector<std::vector<std::vector<float>>> stable_;  // [shape][head]
  std::vector<std::vector<float>> tails_;
  std::vector<float> scratch_[3];
};

std::string Num(double v, int digits = 3) {
  if (std::isnan(v)) return "n/a";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

}  // namespace

DecodeTopKSets GenerateDecodeSets(const DecodeSetModel& model, std::uint64_t key,
                                  const DecodeTopKSets& shape) {
  DecodeTopKSets s;
  s.steps = shape.steps;
  s.k = shape.k;
  s.layers = shape.layers;
  s.kv_heads = shape.kv_heads;
  s.context = shape.context;
  s.candidates = shape.candidates;
  const bool spec = !shape.prefetched.empty();
  const std::size_t total = static_cast<std::size_t>(s.steps) * s.layers * s.kv_heads;
  s.output.resize(total);
  if (spec) s.prefetched.resize(total);
  for (int step = 0; step < s.steps; ++step) {
    for (int l = 0; l < s.layers; ++l) {
      for (int h = 0; h < s.kv_heads; ++h) {
        const std::size_t i = s.Index(step, l, h);
        model.Sets(key, step, l, h, s.candidates[step], s.k, &s.output[i],
                   spec ? &s.prefetched[i] : nullptr);
      }
    }
  }
  return s;
}

DecodeFit FitDecodeModel(const std::string& path, const DecodeFitOptions& opt) {
  DecodeFit fit;
  DecodeStatsOptions so;
  so.ks = opt.ks;
  so.lags = opt.lags;
  std::vector<DecodeTopKSets> shapes;   // every record's (the fitted statistics)
  std::vector<RequestId> ids;           // their request ids (the fitted model's keys)
  {
    TraceReader reader(path);
    fit.model = reader.header().model;
    DecodeStatsAccumulator acc(so);
    TraceRecord rec;
    while (reader.Next(&rec)) {
      if (!rec.decode_sets) continue;
      acc.Add(*rec.decode_sets);
      shapes.push_back(ShapeOf(*rec.decode_sets));
      ids.push_back(rec.request.id);
    }
    if (acc.empty()) throw TraceError(path + ": no decode top-k sets to fit (extension 2)");
    fit.recorded = acc.Result();
  }
  const DecodeStats& rec = fit.recorded;
  const int layers = rec.layers;
  const std::size_t nk = rec.ks.size(), nl = rec.lags.size();
  so.ks = rec.ks;  // the curves and the fitted statistics measure the same ks and lags
  so.lags = rec.lags;
  DecodeStatsOptions so_full = so;  // the fitted statistics: distributions as recorded
  so.distributions = false;         // the fit's loops need means only

  // Sinks per layer.
  std::vector<int> sinks(layers, 0);
  for (int l = 0; l < layers; ++l) {
    while (sinks[l] < DecodeStats::kLeadingPositions && rec.leading_share[l][sinks[l]] >= 0.5) {
      ++sinks[l];
    }
  }

  // Inversion curves per distinct sink count: a one-layer model whose scores correlate by r at
  // every lag and with the speculative token's, on the first `records` shapes, with every
  // layer's heads as extra heads (more samples; they are independent draws).
  const std::size_t n_shapes =
      std::min<std::size_t>(shapes.size(), std::max<std::int64_t>(1, opt.records));
  const std::vector<double>& grid = CurveGrid();
  struct Curves {
    std::vector<std::vector<std::vector<double>>> jaccard;  // [k][lag][grid]
    std::vector<std::vector<double>> spec;                  // [k][grid]
  };
  std::map<int, Curves> curves;
  for (int l = 0; l < layers; ++l) {
    if (curves.count(sinks[l])) continue;
    Curves& c = curves[sinks[l]];
    c.jaccard.assign(nk, std::vector<std::vector<double>>(nl, std::vector<double>(grid.size())));
    c.spec.assign(nk, std::vector<double>(grid.size()));
    DecodeModelParams p;
    p.seed = hash::Combine(opt.seed, 0xC0FFEEull + static_cast<std::uint64_t>(sinks[l]));
    const DecodeSetModel m(p, 1);
    std::vector<DecodeTopKSets> wide(shapes.begin(), shapes.begin() + n_shapes);
    for (DecodeTopKSets& s : wide) s.kv_heads *= std::min(layers, 4);  // more samples
    LayerSample sample(m, wide, n_shapes, 0, rec.has_prefetched, /*drift=*/false);
    for (std::size_t g = 0; g < grid.size(); ++g) {
      DecodeLayerParams lp;
      lp.stable = grid[g];
      lp.spec_corr = grid[g];
      lp.sinks = sinks[l];
      const DecodeStats st = sample.Measure(lp, so, rec.has_prefetched);
      for (std::size_t q = 0; q < nk; ++q) {
        for (std::size_t li = 0; li < nl; ++li) c.jaccard[q][li][g] = st.step_jaccard[q][li].Mean();
        c.spec[q][g] = rec.has_prefetched ? st.spec_hit[q].Mean() : kNaN;
      }
    }
  }

  // Invert the recording layer by layer.
  fit.lag_corr.assign(layers, std::vector<double>(nl, kNaN));
  fit.spec_corr.assign(layers, kNaN);
  for (int l = 0; l < layers; ++l) {
    const Curves& c = curves.at(sinks[l]);
    for (std::size_t li = 0; li < nl; ++li) {
      std::vector<double> r(nk, kNaN);
      for (std::size_t q = 0; q < nk; ++q) {
        r[q] = Invert(c.jaccard[q][li], rec.step_jaccard[q][li].LayerMean(l));
      }
      fit.lag_corr[l][li] = MeanOf(r);
    }
    if (rec.has_prefetched) {
      std::vector<double> r(nk, kNaN);
      for (std::size_t q = 0; q < nk; ++q) r[q] = Invert(c.spec[q], rec.spec_hit[q].LayerMean(l));
      fit.spec_corr[l] = MeanOf(r);
    }
  }

  // T, then a_l and b_l.
  std::vector<double> a(layers, 0), b(layers, 0);
  auto total_error = [&](double log_t) {
    std::vector<double> rho(nl);
    for (std::size_t li = 0; li < nl; ++li) rho[li] = DriftCorrelation(std::exp(log_t), rec.lags[li]);
    double e = 0;
    for (int l = 0; l < layers; ++l) e += FitLayer(fit.lag_corr[l], rho, &a[l], &b[l]);
    return e;
  };
  const double lo = std::log(0.25), hi = std::log(64.0);  // DecodeModelParams' range
  constexpr int kGrid = 48;
  double best_x = lo, best_e = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= kGrid; ++i) {
    const double x = lo + (hi - lo) * i / kGrid;
    const double e = total_error(x);
    if (e < best_e - 1e-12) {
      best_e = e;
      best_x = x;
    }
  }
  double x0 = std::max(lo, best_x - (hi - lo) / kGrid), x1 = std::min(hi, best_x + (hi - lo) / kGrid);
  const double phi = (std::sqrt(5.0) - 1) / 2;
  for (int it = 0; it < 40; ++it) {
    const double m1 = x1 - phi * (x1 - x0), m2 = x0 + phi * (x1 - x0);
    if (total_error(m1) <= total_error(m2)) {
      x1 = m2;
    } else {
      x0 = m1;
    }
  }
  const double x_golden = (x0 + x1) / 2;
  const double log_t = total_error(x_golden) <= best_e ? x_golden : best_x;
  total_error(log_t);  // leaves a and b at the chosen T

  DecodeModelParams& p = fit.params;
  p.seed = opt.seed;
  p.drift_steps = std::round(std::exp(log_t) * 1e3) / 1e3;

  // Refinement per layer, by the model itself: the fields of the first `records` shapes are
  // drawn once; (tail, a, b / (1 - a)) are set by Nelder-Mead on the step Jaccard (every k and
  // lag), then (spec_tail, c) on the spec hit (every k).
  std::vector<double> tail(layers, 0.0), spec(layers, 0.0), spec_tail(layers, 0.0);
  {
    DecodeModelParams fp;
    fp.seed = hash::Combine(opt.seed, 0xF17ull);
    fp.drift_steps = p.drift_steps;
    const DecodeSetModel fields_model(fp, layers);
    for (int l = 0; l < layers; ++l) {
      LayerSample sample(fields_model, shapes, n_shapes, l, rec.has_prefetched, /*drift=*/true);
      DecodeLayerParams lp;
      lp.stable = a[l];
      lp.drift = b[l];
      lp.sinks = sinks[l];
      lp.spec_corr = std::isnan(fit.spec_corr[l]) ? 0.0 : fit.spec_corr[l];
      auto step_error = [&](const DecodeLayerParams& x) {
        const DecodeStats st = sample.Measure(x, so, /*spec=*/false);
        double e = 0;
        for (std::size_t q = 0; q < nk; ++q) {
          for (std::size_t li = 0; li < nl; ++li) {
            const double want = rec.step_jaccard[q][li].LayerMean(l);
            const double got = st.step_jaccard[q][li].Mean();
            if (!std::isnan(want) && !std::isnan(got)) e += (got - want) * (got - want);
          }
        }
        return e;
      };
      // (tail, a, b / (1 - a)) in [0, 3] x [0, 1] x [0, 1].
      const double share = lp.stable < 1 ? lp.drift / (1 - lp.stable) : 0;
      auto with_j = [&](const std::vector<double>& x) {
        DecodeLayerParams y = lp;
        y.tail = x[0];
        y.stable = x[1];
        y.drift = x[2] * (1 - x[1]);
        return y;
      };
      const std::vector<double> xj = BestOf(
          [&](const std::vector<double>& x) { return step_error(with_j(x)); },
          {{0.3, lp.stable, share}, {1.2, lp.stable, share}}, {0, 0, 0}, {3, 1, 1},
          {0.6, 0.1, 0.2}, opt.evals);
      lp = with_j(xj);
      if (rec.has_prefetched) {
        sample.Measure(lp, so, /*spec=*/false);  // the output sets the spec search keeps
        auto spec_error = [&](const DecodeLayerParams& x) {
          const DecodeStats st = sample.Measure(x, so, /*spec=*/true, /*output=*/false);
          double e = 0;
          for (std::size_t q = 0; q < nk; ++q) {
            const double want = rec.spec_hit[q].LayerMean(l);
            const double got = st.spec_hit[q].Mean();
            if (!std::isnan(want) && !std::isnan(got)) e += (got - want) * (got - want);
          }
          return e;
        };
        // (spec_tail, c) in [0, 3] x [0, 1].
        auto with_s = [&](const std::vector<double>& x) {
          DecodeLayerParams y = lp;
          y.spec_tail = x[0];
          y.spec_corr = x[1];
          return y;
        };
        const std::vector<double> xs = BestOf(
            [&](const std::vector<double>& x) { return spec_error(with_s(x)); },
            {{0.3, lp.spec_corr}, {1.2, lp.spec_corr}}, {0, 0}, {3, 1}, {0.6, 0.05}, opt.evals);
        lp = with_s(xs);
      }
      a[l] = lp.stable;
      b[l] = lp.drift;
      tail[l] = lp.tail;
      spec[l] = rec.has_prefetched ? lp.spec_corr : 0.0;
      spec_tail[l] = rec.has_prefetched ? lp.spec_tail : 0.0;
    }
  }
  auto round4 = [](double v) { return std::round(v * 1e4) / 1e4; };
  p.stable.resize(layers);
  p.drift.resize(layers);
  p.spec_corr.resize(layers);
  p.tail.resize(layers);
  p.spec_tail.resize(layers);
  p.sinks.resize(layers);
  for (int l = 0; l < layers; ++l) {
    p.stable[l] = std::clamp(round4(a[l]), 0.0, 1.0);
    p.drift[l] = std::clamp(round4(b[l]), 0.0, 1 - p.stable[l]);
    p.spec_corr[l] = std::clamp(round4(spec[l]), 0.0, 1.0);
    p.tail[l] = std::clamp(round4(tail[l]), 0.0, 3.0);
    p.spec_tail[l] = std::clamp(round4(spec_tail[l]), 0.0, 3.0);
    p.sinks[l] = sinks[l];
  }
  p.Validate("trace fit --decode");

  // The fitted model on every record's shape, keyed as `trace gen --like` keys it.
  const DecodeSetModel model(p, layers);
  DecodeStatsAccumulator acc(so_full);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    acc.Add(GenerateDecodeSets(model, DecodeRequestKey(p.seed, ids[i]), shapes[i]));
  }
  fit.fitted = acc.Result();
  return fit;
}

std::string FormatDecodeFitIni(const DecodeFit& fit, const std::string& source) {
  const DecodeStats& r = fit.recorded;
  const DecodeStats& f = fit.fitted;
  std::ostringstream o;
  o << "# Fitted by kvtier trace fit --decode from " << source << ": " << r.records
    << " records, " << r.steps << " decode steps, " << fit.model.name << " (" << r.layers
    << " layers x " << r.kv_heads << " KV heads), recorded k " << r.k << ".\n";
  o << "# Recorded vs fitted (the fitted model on the same records' steps and candidates):\n";
  o << "#      k   step-J rec  fit   spec-hit rec  fit   step-J by lag rec / fit\n";
  for (std::size_t q = 0; q < r.ks.size(); ++q) {
    char line[160];
    std::snprintf(line, sizeof line, "# %6d       %s  %s         %s  %s  ", r.ks[q],
                  Num(r.step_jaccard[q][0].Mean()).c_str(), Num(f.step_jaccard[q][0].Mean()).c_str(),
                  Num(r.spec_hit[q].Mean()).c_str(), Num(f.spec_hit[q].Mean()).c_str());
    o << line;
    for (std::size_t li = 0; li < r.lags.size(); ++li) {
      o << " d" << r.lags[li] << " " << Num(r.step_jaccard[q][li].Mean()) << "/"
        << Num(f.step_jaccard[q][li].Mean());
    }
    o << "\n";
  }
  o << "[decode]\nparams = " << fit.params.ToString() << "\n";
  return o.str();
}

std::int64_t GenerateDecodeLikeTrace(const std::string& source, const std::string& path,
                                     const DecodeModelParams& params,
                                     const std::optional<ProceduralParams>& importance) {
  params.Validate("decode");
  if (importance) importance->Validate("importance");
  TraceReader reader(source);
  TraceHeader header = reader.header();
  header.producer = "kvtier trace gen --like";
  if (importance) header.procedural = *importance;
  header.metadata.emplace_back("like", source);
  header.metadata.emplace_back("decode_model", params.ToString());
  const DecodeSetModel model(params, header.model.layers);
  TraceWriter writer(path, header);
  TraceRecord rec;
  while (reader.Next(&rec)) {
    if (importance) {
      rec.importance = ImportanceKind::kProcedural;
      rec.explicit_scores = ExplicitScores{};
      rec.query_key = DefaultQueryKey(importance->seed, rec.request.id);
    }
    if (rec.decode_sets) {
      rec.decode_sets =
          GenerateDecodeSets(model, DecodeRequestKey(params.seed, rec.request.id), *rec.decode_sets);
      rec.decode_topk.reset();
    }
    writer.Write(rec);
  }
  writer.Close();
  return writer.records_written();
}

}  // namespace kvtier
