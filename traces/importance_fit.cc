#include "traces/importance_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numbers>
#include <sstream>

#include "core/errors.h"
#include "traces/hash.h"
#include "traces/trace_io.h"
#include "traces/trace_stats.h"

namespace kvtier {
namespace {

struct Sample {
  Request request;
  std::uint64_t group = 0;
  std::vector<std::uint32_t> keys;
};

std::uint64_t GroupOf(const Request& q) {
  std::uint64_t h = hash::ChainStart(q.tokens_per_symbol);
  for (std::uint64_t s : q.prefix) h = hash::ChainNext(h, s);
  return h;
}

// The requests ComputeTraceStats samples: the first `limit` with importance and >= 2 tokens.
std::vector<Sample> LoadSamples(const std::string& path, std::int64_t limit) {
  TraceReader reader(path);
  std::vector<Sample> out;
  TraceRecord rec;
  while (std::int64_t(out.size()) < limit && reader.Next(&rec)) {
    if (rec.importance == ImportanceKind::kNone || rec.request.prefix_tokens() < 2) continue;
    Sample s;
    s.request = rec.request;
    s.group = GroupOf(rec.request);
    PrefixTokenKeys(s.request, &s.keys);
    out.push_back(std::move(s));
  }
  return out;
}

ImportanceStatsOptions StatsOptions(const FitV2Options& o) {
  ImportanceStatsOptions s;
  s.retentions = {o.retention};
  s.max_groups = 1 << 20;  // every sampled group (samples are few)
  s.structure = o.structure;
  s.structure.retention = o.retention;
  return s;
}

ImportanceStats Measure(const ProceduralParams& p, const ModelDescriptor& m,
                        const std::vector<Sample>& samples, const ImportanceStatsOptions& opt) {
  const ImportanceModel model(p, m.layers, m.kv_heads);
  ImportanceAccumulator acc(m.layers, m.kv_heads, opt);
  for (const Sample& s : samples) {
    const std::int64_t n = s.request.prefix_tokens();
    const std::uint64_t qk = DefaultQueryKey(p.seed, s.request.id);
    acc.AddRequest(s.group, n, [&](int l, std::span<const int> heads, float* out) {
      model.Scores(s.keys, qk, l, heads, n, out, n);
    });
  }
  return acc.Result();
}

// Bisection of a scalar parameter: `measure(x)` is increasing in x if `increasing`.
double Bisect(const std::function<double(double)>& measure, double target, double lo, double hi,
              bool increasing, int iterations) {
  if (std::isnan(target)) return (lo + hi) / 2;
  for (int i = 0; i < iterations; ++i) {
    const double mid = (lo + hi) / 2;
    const double v = measure(mid);
    if (std::isnan(v)) break;
    if ((v < target) == increasing) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return (lo + hi) / 2;
}

// Golden-section search for the minimum of f on [lo, hi] (f unimodal), `iterations` evaluations.
double GoldenMin(const std::function<double(double)>& f, double lo, double hi, int iterations) {
  const double r = (std::sqrt(5.0) - 1) / 2;
  double a = lo, b = hi;
  double x1 = b - r * (b - a), x2 = a + r * (b - a);
  double f1 = f(x1), f2 = f(x2);
  for (int i = 2; i < iterations; ++i) {
    if (f1 <= f2) {
      b = x2;
      x2 = x1;
      f2 = f1;
      x1 = b - r * (b - a);
      f1 = f(x1);
    } else {
      a = x1;
      x1 = x2;
      f1 = f2;
      x2 = a + r * (b - a);
      f2 = f(x2);
    }
  }
  return f1 <= f2 ? x1 : x2;
}

}  // namespace

FitV2Result FitImportanceV2(const std::string& path, const FitV2Options& o) {
  FitV2Result fit;
  const ImportanceStatsOptions sopt = StatsOptions(o);
  TraceStatsOptions topt;
  topt.importance = sopt;
  topt.importance_requests = o.requests;
  // Sinks and tail as version 1's fit; the recorded statistics at the fit retention.
  const FitResult v1 = FitImportance(path, o.retention, topt);
  fit.recorded = v1.stats;
  fit.model = TraceReader(path).header().model;
  const std::vector<Sample> samples = LoadSamples(path, o.requests);
  if (!fit.recorded.structure || fit.recorded.structure->requests == 0) {
    throw TraceError(path + ": no request with at least " +
                     std::to_string(o.structure.min_tokens) + " reusable tokens to fit");
  }
  const StructureStats& rec = *fit.recorded.structure;
  const int L = fit.model.layers;

  ProceduralParams p;
  p.model = 2;
  p.seed = o.seed;
  p.sink_tokens = v1.targets.sink_tokens;
  p.sink_boost = v1.targets.sink_boost;
  p.tail = v1.targets.tail;
  p.head_corr.assign(L, 0.5);
  p.layer_corr = 0.9;
  p.query_dependence = 0.1;
  p.persistent = 0.4;
  p.persistent_query = 0.1;
  p.head_spread = 0.5;
  p.recency.assign(rec.f_by_distance.size() + 1, 0.0);

  auto measure = [&](const ProceduralParams& q) { return Measure(q, fit.model, samples, sopt); };
  auto with = [&](double ProceduralParams::*field, double v) {
    ProceduralParams q = p;
    q.*field = v;
    return q;
  };
  const bool has_pairs = rec.pairs > 0 && !std::isnan(rec.f_pearson);
  const bool has_recall = fit.recorded.recall_samples > 0;
  for (int round = 0; round < o.rounds; ++round) {
    // Head agreement per layer: every layer's bisection at once (a layer's head Jaccard
    // depends on its own head_corr).
    {
      std::vector<double> lo(L, 0.0), hi(L, 1.0);
      for (int it = 0; it < 10; ++it) {
        for (int l = 0; l < L; ++l) p.head_corr[l] = (lo[l] + hi[l]) / 2;
        const ImportanceStats s = measure(p);
        for (int l = 0; l < L; ++l) {
          const double target = fit.recorded.head_jaccard[0][l];
          if (std::isnan(target)) continue;
          (s.head_jaccard[0][l] < target ? lo[l] : hi[l]) = p.head_corr[l];
        }
      }
      for (int l = 0; l < L; ++l) p.head_corr[l] = (lo[l] + hi[l]) / 2;
    }
    if (rec.itf_layers > 0 && rec.itf_probe_heads >= 2) {
      p.head_spread = Bisect(
          [&](double x) {
            return measure(with(&ProceduralParams::head_spread, x)).structure->FallbackRate();
          },
          rec.FallbackRate(), 0.0, 4.0, true, 8);
    }
    // Recency: a damped fixed-point step per distance bin.
    for (int it = 0; it < 4; ++it) {
      const StructureStats s = *measure(p).structure;
      for (std::size_t b = 0; b < rec.f_by_distance.size() && b < s.f_by_distance.size(); ++b) {
        if (std::isnan(rec.f_by_distance[b]) || std::isnan(s.f_by_distance[b])) continue;
        p.recency[b] = std::clamp(p.recency[b] + 3.0 * (rec.f_by_distance[b] - s.f_by_distance[b]),
                                  -20.0, 20.0);
      }
      p.recency.back() = p.recency[p.recency.size() >= 2 ? p.recency.size() - 2 : 0];
    }
    if (has_pairs) {
      p.persistent_query = Bisect(
          [&](double x) {
            return measure(with(&ProceduralParams::persistent_query, x)).structure->f_pearson;
          },
          rec.f_pearson, 0.0, 1.0, false, 8);
    }
    if (has_recall) {
      p.query_dependence = Bisect(
          [&](double x) {
            return measure(with(&ProceduralParams::query_dependence, x)).MeanRecall(0);
          },
          fit.recorded.MeanRecall(0), 0.0, 1.0, false, 8);
    }
    // Layer structure: least squares over the Jaccard-by-distance curve, coordinate-wise
    // golden-section search over persistence and the two chains; between two passes, the
    // positional smoothing by bisection on the chunks the stored order touches at the smallest
    // chunk size (clustered importance touches fewer).
    if (L > 1) {
      auto curve_error = [&](const ProceduralParams& q) {
        const StructureStats s = *measure(q).structure;
        double e = 0;
        for (std::size_t d = 0; d < rec.jaccard_by_distance.size(); ++d) {
          const double a = rec.jaccard_by_distance[d], b = s.jaccard_by_distance[d];
          if (!std::isnan(a) && !std::isnan(b)) e += (a - b) * (a - b);
        }
        return e;
      };
      // Each dimension maps a search coordinate x to its parameter; the slow chain is searched
      // by the layers of a quarter turn, log-spaced (2 .. 4L), where its correlation lives.
      struct Dim {
        std::function<void(ProceduralParams*, double)> set;
        double lo, hi;
        std::function<double(const ProceduralParams&)> get;
      };
      auto slow_corr_of = [](double log_q) {
        return std::cos(std::numbers::pi / 2 / std::exp(log_q));
      };
      const Dim dims[] = {
          {[](ProceduralParams* q, double x) { q->persistent = x; }, 0.0, 0.95, nullptr},
          {[&](ProceduralParams* q, double x) {
             q->persistent_corr = x >= std::log(64.0 * L) ? 1.0 : slow_corr_of(x);
           },
           std::log(double(L)), std::log(64.0 * L), nullptr},
          {[](ProceduralParams* q, double x) { q->slow = x; }, 0.0, 1.0, nullptr},
          {[&](ProceduralParams* q, double x) { q->slow_corr = slow_corr_of(x); }, std::log(2.0),
           std::log(4.0 * L), nullptr},
          {[](ProceduralParams* q, double x) { q->layer_corr = x; }, 0.0, 1.0, nullptr}};
      for (int pass = 0; pass < 3; ++pass) {
        for (const Dim& d : dims) {
          const double x = GoldenMin(
              [&](double v) {
                ProceduralParams q = p;
                d.set(&q, v);
                return curve_error(q);
              },
              d.lo, d.hi, 9);
          d.set(&p, x);
        }
        if (pass == 0 && !rec.chunks_stored.empty() && !std::isnan(rec.chunks_stored[0])) {
          p.smooth = Bisect(
              [&](double x) {
                return measure(with(&ProceduralParams::smooth, x)).structure->chunks_stored[0];
              },
              rec.chunks_stored[0], 0.0, 0.95, false, 7);
        }
      }
    }
  }
  p.Validate("trace fit");
  fit.params = p;
  fit.fitted = measure(p);
  return fit;
}

namespace {
std::string F(double v, int digits = 3) {
  if (std::isnan(v)) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}
}  // namespace

std::string FormatFitV2Ini(const FitV2Result& fit, const std::string& source) {
  std::ostringstream o;
  const StructureStats& r = *fit.recorded.structure;
  const StructureStats& f = *fit.fitted.structure;
  o << "# Fitted by kvtier trace fit --model v2 from " << source << " (" << fit.recorded.requests
    << " sampled requests, model " << fit.model.name << ", retention " << F(r.retention, 2)
    << ").\n# statistic                    recorded   fitted model (same requests)\n";
  auto row = [&](const std::string& name, double a, double b) {
    char line[160];
    std::snprintf(line, sizeof line, "# %-28s %8s   %8s\n", name.c_str(), F(a).c_str(),
                  F(b).c_str());
    o << line;
  };
  row("head Jaccard (mean)", fit.recorded.MeanHeadJaccard(0), fit.fitted.MeanHeadJaccard(0));
  row("adjacent-layer Jaccard", fit.recorded.MeanLayerJaccard(0), fit.fitted.MeanLayerJaccard(0));
  row("SPI recall", fit.recorded.MeanRecall(0), fit.fitted.MeanRecall(0));
  for (std::size_t d = 0; d < r.jaccard_by_distance.size(); ++d) {
    row("layer Jaccard d=" + std::to_string(d + 1), r.jaccard_by_distance[d],
        d < f.jaccard_by_distance.size() ? f.jaccard_by_distance[d] : NAN);
  }
  row("dispersion (x binomial)", r.dispersion, f.dispersion);
  row("cross-query Pearson of f", r.f_pearson, f.f_pearson);
  row("cross-query top-k Jaccard", r.f_topk_jaccard, f.f_topk_jaccard);
  for (std::size_t c = 0; c < r.chunk_sizes.size(); ++c) {
    row("history saving, chunk " + std::to_string(r.chunk_sizes[c]), r.HistorySaving(c),
        f.HistorySaving(c));
  }
  row("ITF fallback rate", r.FallbackRate(), f.FallbackRate());
  o << "[importance]\nparams = " << fit.params.ToString() << "\n";
  return o.str();
}

std::int64_t GenerateLikeTrace(const std::string& source, const std::string& path,
                               const ProceduralParams& params) {
  params.Validate("importance");
  TraceReader reader(source);
  TraceHeader header = reader.header();
  header.producer = "kvtier trace gen --like";
  header.procedural = params;
  header.metadata.emplace_back("like", source);
  TraceWriter writer(path, header);
  TraceRecord rec;
  while (reader.Next(&rec)) {
    rec.importance = ImportanceKind::kProcedural;
    rec.explicit_scores = ExplicitScores{};
    rec.query_key = DefaultQueryKey(params.seed, rec.request.id);
    writer.Write(rec);
  }
  writer.Close();
  return writer.records_written();
}

}  // namespace kvtier
