#include "traces/generator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numbers>

#include "core/errors.h"
#include "traces/hash.h"
#include "traces/importance_stats.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

// Deterministic RNG (splitmix64 stream): same numbers on every platform and standard library.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(hash::Mix64(seed)) {}
  std::uint64_t Next() { return hash::Mix64(state_ += 0x9E3779B97F4A7C15ull); }
  double Uniform() { return double(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Normal() {
    const double u1 = 1.0 - Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
  }
  std::int64_t Int(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(Uniform() * double(hi - lo + 1));
  }
  double Exponential(double rate) { return -std::log(1.0 - Uniform()) / rate; }

 private:
  std::uint64_t state_;
};

std::int64_t LogNormalCount(Rng* rng, double mean, double sd) {
  if (sd <= 0) return std::max<std::int64_t>(1, std::llround(mean));
  const double s2 = std::log(1 + sd * sd / (mean * mean));
  const double mu = std::log(mean) - s2 / 2;
  return std::max<std::int64_t>(1, std::llround(std::exp(mu + std::sqrt(s2) * rng->Normal())));
}

std::int64_t NormalCount(Rng* rng, double mean, double sd, std::int64_t lo) {
  return std::max<std::int64_t>(lo, std::llround(mean + sd * rng->Normal()));
}

void AppendTokens(std::uint64_t seed, std::uint64_t kind, std::uint64_t a, std::uint64_t b,
                  std::int64_t count, int vocab, std::vector<std::uint64_t>* out) {
  const std::uint64_t base = hash::Combine(hash::Combine(hash::Combine(seed, kind), a), b);
  for (std::int64_t i = 0; i < count; ++i) {
    out->push_back(hash::Combine(base, std::uint64_t(i)) % std::uint64_t(vocab));
  }
}

// Sampler over a discrete distribution given by weights.
class Discrete {
 public:
  explicit Discrete(const std::vector<double>& w) : cdf_(w.size()) {
    double s = 0;
    for (std::size_t i = 0; i < w.size(); ++i) cdf_[i] = (s += w[i]);
    for (double& c : cdf_) c /= s;
  }
  std::size_t Sample(Rng* rng) const {
    const double u = rng->Uniform();
    return std::min<std::size_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(),
                                 cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

double Interpolate(const std::vector<double>& profile, int layer, int layers) {
  if (profile.size() == 1 || layers == 1) return profile[0];
  const double x = double(layer) / double(layers - 1) * double(profile.size() - 1);
  const std::size_t i = std::min<std::size_t>(static_cast<std::size_t>(x), profile.size() - 2);
  const double f = x - double(i);
  return profile[i] * (1 - f) + profile[i + 1] * f;
}

// Measured statistics of `params` on synthetic requests of `tokens` tokens.
ImportanceStats Measure(const ProceduralParams& params, int layers, int kv_heads,
                        std::int64_t tokens, double retention, int requests_same_prefix,
                        std::uint64_t seed) {
  ImportanceModel model(params, layers, kv_heads);
  ImportanceStatsOptions opt;
  opt.retentions = {retention};
  ImportanceAccumulator acc(layers, kv_heads, opt);
  std::vector<std::uint32_t> keys(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    keys[t] = static_cast<std::uint32_t>(hash::Combine(seed ^ 0xCA11B, std::uint64_t(t)));
  }
  for (int q = 0; q < requests_same_prefix; ++q) {
    const std::uint64_t qk = hash::Combine(seed ^ 0x9E77, std::uint64_t(q));
    acc.AddRequest(1, tokens, [&](int l, std::span<const int> heads, float* out) {
      model.Scores(keys, qk, l, heads, tokens, out);
    });
  }
  return acc.Result();
}

// Bisection for a monotone f on [lo, hi]: f increasing if `increasing`.
template <typename F>
double Bisect(F f, double target, double lo, double hi, bool increasing, int iterations = 16) {
  for (int i = 0; i < iterations; ++i) {
    const double mid = (lo + hi) / 2;
    const double v = f(mid);
    if ((v < target) == increasing) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return (lo + hi) / 2;
}

}  // namespace

void ValidateWorkload(const WorkloadParams& w) {
  auto bad = [](const std::string& what) { throw InputError("workload: " + what); };
  if (w.kind != "fewshot" && w.kind != "rag") bad("kind: expected fewshot or rag, got '" + w.kind + "'");
  if (w.requests < 1) bad("requests: must be >= 1 (an empty trace would replay nothing)");
  if (w.arrival != "poisson" && w.arrival != "closed") bad("arrival: expected poisson or closed");
  if (!(w.rate > 0)) bad("rate: must be > 0");
  if (w.clients < 1) bad("clients: must be >= 1");
  if (!(w.think_s >= 0)) bad("think_s: must be >= 0");
  if (w.vocab < 2) bad("vocab: must be >= 2");
  if (w.tasks < 1 || w.prompts < 1) bad("tasks, prompts: must be >= 1");
  if (w.examples_min < 0 || w.examples_max < w.examples_min) bad("examples_min/max: need 0 <= min <= max");
  if (!(w.example_tokens > 0)) bad("example_tokens: must be > 0");
  if (!(w.example_tokens_sd >= 0)) bad("example_tokens_sd: must be >= 0");
  if (w.header_tokens < 0) bad("header_tokens: must be >= 0");
  if (!(w.popularity_sd > 0)) bad("popularity_sd: must be > 0");
  if (w.max_prefix_tokens < 1) bad("max_prefix_tokens: must be >= 1");
  if (w.docs < 1 || w.docs_per_request < 1 || w.docs_per_request > w.docs) bad("docs, docs_per_request: need 1 <= docs_per_request <= docs");
  if (!(w.doc_tokens > 0)) bad("doc_tokens: must be > 0");
  if (!(w.doc_tokens_sd >= 0)) bad("doc_tokens_sd: must be >= 0");
  if (!(w.zipf >= 0)) bad("zipf: must be >= 0");
  if (!(w.query_tokens > 0)) bad("query_tokens: must be > 0");
  if (!(w.query_tokens_sd >= 0)) bad("query_tokens_sd: must be >= 0");
  if (!(w.output_tokens > 0)) bad("output_tokens: must be > 0");
  if (!(w.output_tokens_sd >= 0)) bad("output_tokens_sd: must be >= 0");
  // Upper bounds: what a trace can hold and this generator can keep in memory. Beyond them a
  // typo ran for ever or was silently wrong: example_tokens = 1e15 allocated 8.7 GB before the
  // prefix cap applied, 1e300 rounded to 16-token examples, docs = 2e9 took 16 GB and zipf = 1e300
  // never found a second document.
  const auto g = [](double v) {  // %g: 1e+300, 0.0001
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const std::pair<const char*, double> means[] = {
      {"example_tokens", w.example_tokens}, {"example_tokens_sd", w.example_tokens_sd},
      {"doc_tokens", w.doc_tokens},         {"doc_tokens_sd", w.doc_tokens_sd},
      {"query_tokens", w.query_tokens},     {"query_tokens_sd", w.query_tokens_sd},
      {"output_tokens", w.output_tokens},   {"output_tokens_sd", w.output_tokens_sd}};
  for (const auto& [name, v] : means) {
    if (v > 1e9) bad(std::string(name) + ": at most 1e9 tokens, got " + g(v));
  }
  constexpr std::int64_t kMaxPrefix = std::int64_t{1} << 24;
  if (w.max_prefix_tokens > kMaxPrefix) {
    bad("max_prefix_tokens: at most 2^24 (16,777,216), got " +
        std::to_string(w.max_prefix_tokens));
  }
  if (w.header_tokens > kMaxPrefix) bad("header_tokens: at most 2^24 (16,777,216)");
  if (w.examples_max > 100'000) bad("examples_max: at most 100,000");
  if (w.kind == "fewshot") {
    // Every prompt's prefix is kept whole while the trace is written.
    const double per_prompt = std::min(
        double(w.max_prefix_tokens), w.header_tokens + 4.0 * w.example_tokens * w.examples_max);
    if (double(w.prompts) * per_prompt > double(std::int64_t{1} << 28)) {
      bad("prompts: " + std::to_string(w.prompts) + " prompts of up to " +
          std::to_string(std::llround(per_prompt)) +
          " tokens are more than 2^28 tokens to keep in memory (fewer prompts, or a lower "
          "max_prefix_tokens)");
    }
  }
  if (w.kind == "rag") {
    if (w.docs > 10'000'000) bad("docs: at most 10,000,000, got " + std::to_string(w.docs));
    // A request draws docs_per_request distinct documents from the Zipf weights: the least
    // popular one it needs must not be too rare to be drawn.
    double total = 0;
    for (int d = 0; d < w.docs; ++d) total += 1.0 / std::pow(double(d + 1), w.zipf);
    const double p = 1.0 / std::pow(double(w.docs_per_request), w.zipf) / total;
    if (!(p >= 1e-4)) {
      bad("zipf: " + g(w.zipf) + " is too steep for docs_per_request = " +
          std::to_string(w.docs_per_request) + ": document " +
          std::to_string(w.docs_per_request) + " is drawn with probability " +
          g(p) + " (< 1e-4), so drawing distinct documents would not finish");
    }
  }
}

double ExpectedPrefixTokens(const WorkloadParams& w) {
  const double v = w.kind == "rag" ? w.docs_per_request * w.doc_tokens
                                   : w.header_tokens + (w.examples_min + w.examples_max) / 2.0 *
                                                           w.example_tokens;
  return std::min(v, double(w.max_prefix_tokens));
}

ProceduralParams Calibrate(const ImportanceTargets& targets, int layers, int kv_heads,
                           std::int64_t tokens, std::uint64_t seed, CalibrationReport* achieved,
                           const std::function<void(int, int)>& progress) {
  // Every statistic below is one Measure call; count them for `progress`.
  constexpr int kGrid = 48;         // head-correlation grid points - 1 (step 1)
  constexpr int kBisectSteps = 16;  // Bisect's default iterations
  const int total_measures = (kGrid + 1) + (layers >= 2 ? 2 * kBisectSteps : 0) + 2 + kBisectSteps +
                             (achieved != nullptr ? 1 : 0);
  int measured = 0;
  auto measure = [&](const ProceduralParams& q, int l, int h, std::int64_t n, double r,
                     int queries, std::uint64_t s) {
    ImportanceStats stats = Measure(q, l, h, n, r, queries, s);
    if (progress) progress(++measured, total_measures);
    return stats;
  };
  ProceduralParams p;
  p.seed = seed;
  p.sink_tokens = targets.sink_tokens;
  p.sink_boost = targets.sink_boost;
  p.tail = targets.tail;
  p.layer_corr = 1;
  p.query_dependence = 0;
  const double r = targets.retention;
  // 1. Head correlation: J(w) on a one-layer model (head similarity depends on w alone), on a
  //    grid, made monotone, inverted per layer.
  std::vector<double> grid_w(kGrid + 1), grid_j(kGrid + 1);
  for (int i = 0; i <= kGrid; ++i) {
    // Denser near 1, where Jaccard changes fastest.
    const double x = double(i) / kGrid;
    grid_w[i] = 1 - (1 - x) * (1 - x);
    ProceduralParams q = p;
    q.head_corr = {grid_w[i]};
    grid_j[i] = measure(q, 1, kv_heads, tokens, r, 1, seed + 17 * i).MeanHeadJaccard(0);
    if (i > 0) grid_j[i] = std::max(grid_j[i], grid_j[i - 1]);
  }
  p.head_corr.resize(layers);
  for (int l = 0; l < layers; ++l) {
    const double target = Interpolate(targets.head_jaccard, l, layers);
    std::size_t i = std::lower_bound(grid_j.begin(), grid_j.end(), target) - grid_j.begin();
    if (i == 0) {
      p.head_corr[l] = grid_w[0];
    } else if (i > std::size_t(kGrid)) {
      p.head_corr[l] = 1;
    } else {
      const double span = grid_j[i] - grid_j[i - 1];
      const double f = span > 0 ? (target - grid_j[i - 1]) / span : 0;
      p.head_corr[l] = grid_w[i - 1] + f * (grid_w[i] - grid_w[i - 1]);
    }
  }
  // 2. Adjacent-layer correlation: layer Jaccard increases with rho. Then correct each layer's
  //    w on the full model (a rotated mix of anchors is shaped slightly differently from one
  //    anchor), using the grid's slope, and refit rho.
  auto fit_rho = [&] {
    if (layers < 2) return;
    p.layer_corr = Bisect(
        [&](double rho) {
          ProceduralParams q = p;
          q.layer_corr = rho;
          return measure(q, layers, kv_heads, tokens, r, 1, seed + 1001).MeanLayerJaccard(0);
        },
        targets.layer_jaccard, 0, 1, true);
  };
  fit_rho();
  for (int pass = 0; pass < 2; ++pass) {
    const ImportanceStats s = measure(p, layers, kv_heads, tokens, r, 2, seed + 4004 + pass);
    for (int l = 0; l < layers; ++l) {
      const double target = Interpolate(targets.head_jaccard, l, layers);
      const double w = p.head_corr[l];
      std::size_t i = std::upper_bound(grid_w.begin(), grid_w.end(), w) - grid_w.begin();
      i = std::clamp<std::size_t>(i, 1, kGrid);
      const double slope = std::max(1e-3, (grid_j[i] - grid_j[i - 1]) / (grid_w[i] - grid_w[i - 1]));
      p.head_corr[l] = std::clamp(w + (target - s.head_jaccard[0][l]) / slope, 0.0, 1.0);
    }
  }
  fit_rho();
  // 3. Query dependence: SPI recall decreases with g.
  p.query_dependence = Bisect(
      [&](double g) {
        ProceduralParams q = p;
        q.query_dependence = g;
        return measure(q, std::min(layers, 8), kv_heads, tokens, r, 2, seed + 2002).MeanRecall(0);
      },
      targets.spi_recall, 0, 1, false);
  if (achieved) {
    const ImportanceStats s = measure(p, layers, kv_heads, tokens, r, 2, seed + 3003);
    achieved->head_jaccard = s.head_jaccard[0];
    achieved->layer_jaccard = s.MeanLayerJaccard(0);
    achieved->spi_recall = s.MeanRecall(0);
  }
  return p;
}

GenerateSummary GenerateTrace(const std::string& path, const WorkloadParams& w,
                              const ModelDescriptor& model, const ImportanceTargets& targets,
                              const ProceduralParams& params,
                              const std::function<void(std::int64_t, std::int64_t)>& progress) {
  ValidateWorkload(w);
  const bool procedural = targets.importance == "procedural";
  if (!procedural && targets.importance != "none") {
    throw InputError("importance: expected procedural or none, got '" + targets.importance + "'");
  }
  TraceHeader header;
  header.producer = "kvtier trace gen";
  header.model = model;
  if (procedural) header.procedural = params;
  header.metadata = {{"workload", w.kind},
                     {"seed", std::to_string(w.seed)},
                     {"arrival", w.arrival == "closed" ? "closed:" + std::to_string(w.clients)
                                                       : "poisson"}};
  TraceWriter writer(path, header);
  GenerateRecords(w, procedural ? &params : nullptr, [&](const TraceRecord& rec) {
    writer.Write(rec);
    if (progress) progress(writer.records_written(), w.requests);
  });
  writer.Close();
  return {writer.records_written(), writer.bytes_written()};
}

void GenerateRecords(const WorkloadParams& w, const ProceduralParams* params,
                     const std::function<void(const TraceRecord&)>& sink) {
  ValidateWorkload(w);
  const bool procedural = params != nullptr;

  // Static content: task headers/examples (fewshot) or documents (rag), generated on the fly
  // from the seed; only lengths and prompt layouts are kept in memory.
  Rng layout(hash::Combine(w.seed, 0x1A7));
  std::vector<std::vector<std::uint64_t>> prompts;  // fewshot: full prefix per prompt
  std::vector<std::int64_t> doc_len;
  std::unique_ptr<Discrete> pick;
  if (w.kind == "fewshot") {
    std::vector<std::vector<std::int64_t>> example_len(w.tasks);
    for (int t = 0; t < w.tasks; ++t) {
      for (int e = 0; e < w.examples_max; ++e) {
        example_len[t].push_back(
            std::min<std::int64_t>(NormalCount(&layout, w.example_tokens, w.example_tokens_sd, 16),
                                   std::int64_t(4 * w.example_tokens)));
      }
    }
    std::vector<double> weight(w.prompts);
    for (int i = 0; i < w.prompts; ++i) {
      const int task = i % w.tasks;
      const int m = static_cast<int>(layout.Int(w.examples_min, w.examples_max));
      std::vector<std::uint64_t> prefix;
      AppendTokens(w.seed, 1, task, 0, std::min<std::int64_t>(w.header_tokens, w.max_prefix_tokens),
                   w.vocab, &prefix);
      for (int e = 0; e < m; ++e) {
        // Only what the cap keeps (the same tokens: an example's tokens depend on their index).
        const std::int64_t room = w.max_prefix_tokens - std::int64_t(prefix.size());
        if (room <= 0) break;
        AppendTokens(w.seed, 2, task, e, std::min(example_len[task][e], room), w.vocab, &prefix);
      }
      if (std::int64_t(prefix.size()) > w.max_prefix_tokens) prefix.resize(w.max_prefix_tokens);
      prompts.push_back(std::move(prefix));
      const double z = (i - (w.prompts - 1) / 2.0) / (w.prompts * w.popularity_sd);
      weight[i] = std::exp(-0.5 * z * z);  // reuse frequency ~ normal over prompts (§VI-A)
    }
    pick = std::make_unique<Discrete>(weight);
  } else {
    std::vector<double> weight(w.docs);
    for (int d = 0; d < w.docs; ++d) {
      doc_len.push_back(NormalCount(&layout, w.doc_tokens, w.doc_tokens_sd, 16));
      weight[d] = 1.0 / std::pow(double(d + 1), w.zipf);
    }
    pick = std::make_unique<Discrete>(weight);
  }

  Rng rng(hash::Combine(w.seed, 0xA221));
  TraceRecord rec;
  double now = 0;
  for (std::int64_t i = 0; i < w.requests; ++i) {
    rec.Clear();
    Request& q = rec.request;
    q.id = RequestId(i);
    if (w.arrival == "poisson") {
      now += rng.Exponential(w.rate);
      q.arrival_s = now;
    } else {
      q.arrival_s = w.think_s;
    }
    if (w.kind == "fewshot") {
      q.prefix = prompts[pick->Sample(&rng)];
    } else {
      std::vector<int> chosen;
      while (int(chosen.size()) < w.docs_per_request) {
        const int d = static_cast<int>(pick->Sample(&rng));
        if (std::find(chosen.begin(), chosen.end(), d) == chosen.end()) chosen.push_back(d);
      }
      std::sort(chosen.begin(), chosen.end());  // most popular first
      for (int d : chosen) {
        const std::int64_t room = w.max_prefix_tokens - std::int64_t(q.prefix.size());
        if (room <= 0) break;
        AppendTokens(w.seed, 3, d, 0, std::min(doc_len[d], room), w.vocab, &q.prefix);
      }
      if (std::int64_t(q.prefix.size()) > w.max_prefix_tokens) q.prefix.resize(w.max_prefix_tokens);
    }
    q.query_tokens = LogNormalCount(&rng, w.query_tokens, w.query_tokens_sd);
    q.output_tokens = LogNormalCount(&rng, w.output_tokens, w.output_tokens_sd);
    if (w.query_ids) AppendTokens(w.seed, 4, std::uint64_t(i), 0, q.query_tokens, w.vocab, &rec.query_ids);
    if (procedural) {
      rec.importance = ImportanceKind::kProcedural;
      rec.query_key = DefaultQueryKey(params->seed, q.id);
    }
    sink(rec);
  }
}

}  // namespace kvtier
