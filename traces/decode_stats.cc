#include "traces/decode_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <utility>

#include "core/errors.h"

namespace kvtier {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string Num(double v, int digits = 3) {
  if (std::isnan(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string Cell(double v) { return std::isnan(v) ? std::string("  -  ") : Num(v, 3); }

std::string DistributionJson(const OverlapDistribution& d) {
  std::ostringstream o;
  o << "{\"samples\": " << d.samples << ", \"mean\": " << Num(d.Mean(), 4)
    << ", \"random_mean\": " << Num(d.RandomMean(), 4) << ", \"p10\": " << Num(d.Quantile(0.1), 4)
    << ", \"p25\": " << Num(d.Quantile(0.25), 4) << ", \"p50\": " << Num(d.Quantile(0.5), 4)
    << ", \"p75\": " << Num(d.Quantile(0.75), 4) << ", \"p90\": " << Num(d.Quantile(0.9), 4)
    << ", \"histogram\": [";
  const std::vector<std::int64_t> h = d.Histogram();
  for (std::size_t i = 0; i < h.size(); ++i) o << (i ? ", " : "") << h[i];
  o << "], \"by_layer\": [";
  for (std::size_t l = 0; l < d.layer_n.size(); ++l) {
    o << (l ? ", " : "") << Num(d.LayerMean(static_cast<int>(l)), 4);
  }
  o << "]}";
  return o.str();
}

}  // namespace

void OverlapDistribution::Add(double value, double random, int layer) {
  ++samples;
  sum += value;
  random_sum += random;
  if (keep_values) ++values[value];
  if (layer >= static_cast<int>(layer_n.size())) {
    layer_n.resize(layer + 1, 0);
    layer_sum.resize(layer + 1, 0.0);
  }
  layer_sum[layer] += value;
  ++layer_n[layer];
}

double OverlapDistribution::Mean() const { return samples ? sum / double(samples) : kNaN; }
double OverlapDistribution::RandomMean() const {
  return samples ? random_sum / double(samples) : kNaN;
}

double OverlapDistribution::Quantile(double q) const {
  if (samples == 0 || values.empty()) return kNaN;
  const std::int64_t rank =
      std::clamp<std::int64_t>(std::int64_t(std::ceil(q * double(samples))), 1, samples);
  std::int64_t seen = 0;
  for (const auto& [v, c] : values) {
    seen += c;
    if (seen >= rank) return v;
  }
  return values.rbegin()->first;
}

double OverlapDistribution::LayerMean(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(layer_n.size()) || layer_n[layer] == 0) return kNaN;
  return layer_sum[layer] / double(layer_n[layer]);
}

std::vector<std::int64_t> OverlapDistribution::Histogram() const {
  std::vector<std::int64_t> h(10, 0);
  for (const auto& [v, c] : values) h[std::clamp(static_cast<int>(v * 10), 0, 9)] += c;
  return h;
}

std::vector<int> DefaultDecodeKs(int k) {
  std::vector<int> ks;
  for (int v = 8; v < k; v *= 2) ks.push_back(v);
  if (k >= 1) ks.push_back(k);
  return ks;
}

std::int64_t PrefixIntersection(const std::vector<std::int64_t>& x, std::size_t a,
                                const std::vector<std::int64_t>& y, std::size_t b) {
  std::vector<std::int64_t> xs(x.begin(), x.begin() + std::min(a, x.size()));
  std::vector<std::int64_t> ys(y.begin(), y.begin() + std::min(b, y.size()));
  std::sort(xs.begin(), xs.end());
  std::sort(ys.begin(), ys.end());
  std::vector<std::int64_t> both;
  std::set_intersection(xs.begin(), xs.end(), ys.begin(), ys.end(), std::back_inserter(both));
  return static_cast<std::int64_t>(both.size());
}

DecodeStatsAccumulator::DecodeStatsAccumulator(DecodeStatsOptions options)
    : opt_(std::move(options)) {}

void DecodeStatsAccumulator::Init(const DecodeTopKSets& sets) {
  DecodeStats& st = stats_;
  st.layers = sets.layers;
  st.kv_heads = sets.kv_heads;
  st.k = sets.k;
  st.ks.clear();
  for (int k : opt_.ks.empty() ? DefaultDecodeKs(sets.k) : opt_.ks) {
    if (k >= 1 && k <= sets.k) st.ks.push_back(k);  // larger k than recorded: not measurable
  }
  std::sort(st.ks.begin(), st.ks.end());
  st.ks.erase(std::unique(st.ks.begin(), st.ks.end()), st.ks.end());
  st.lags.clear();
  for (int d : opt_.lags) {
    if (d >= 1) st.lags.push_back(d);
  }
  std::sort(st.lags.begin(), st.lags.end());
  st.lags.erase(std::unique(st.lags.begin(), st.lags.end()), st.lags.end());
  OverlapDistribution empty;
  empty.keep_values = opt_.distributions;
  st.step_jaccard.assign(st.ks.size(), std::vector<OverlapDistribution>(st.lags.size(), empty));
  st.step_hit.assign(st.ks.size(), empty);
  st.spec_hit.assign(st.ks.size(), empty);
  leading_hits_.assign(sets.layers, std::vector<std::int64_t>(DecodeStats::kLeadingPositions, 0));
  leading_sets_.assign(sets.layers, 0);
  st.leading_share.assign(sets.layers, std::vector<double>(DecodeStats::kLeadingPositions, 0.0));
}

void DecodeStatsAccumulator::Add(const DecodeTopKSets& sets) {
  if (full()) return;
  if (stats_.records == 0) {
    Init(sets);
  } else if (sets.layers != stats_.layers || sets.kv_heads != stats_.kv_heads) {
    throw TraceError("decode sets of " + std::to_string(sets.layers) + " layers x " +
                     std::to_string(sets.kv_heads) + " KV heads after records of " +
                     std::to_string(stats_.layers) + " x " + std::to_string(stats_.kv_heads));
  }
  DecodeStats& st = stats_;
  ++st.records;
  st.steps += sets.steps;
  for (int s = 0; s < sets.steps; ++s) candidates_sum_ += double(sets.candidates[s]);
  st.candidates_mean = st.steps ? candidates_sum_ / double(st.steps) : 0;
  const bool spec = !sets.prefetched.empty();
  st.has_prefetched = st.has_prefetched || spec;
  if (sets.output.empty() || st.ks.empty()) return;
  const std::size_t nk = st.ks.size();
  std::vector<std::int64_t> counts(nk);
  auto size_at = [](std::size_t stored, int k) { return std::min<std::size_t>(stored, k); };
  // |A[:k] ∩ B[:k]| for every k at once: A's ranks are marked in rank_ (dense by position); an
  // element of B at rank j whose A rank is i is in both prefixes of size k iff max(i, j) < k.
  auto common = [&](const std::vector<std::int64_t>& b) {
    std::fill(counts.begin(), counts.end(), 0);
    for (std::size_t j = 0; j < b.size(); ++j) {
      const std::size_t pos = static_cast<std::size_t>(b[j]);
      if (pos >= rank_.size() || rank_[pos] < 0) continue;
      const std::int32_t m = std::max<std::int32_t>(rank_[pos], static_cast<std::int32_t>(j));
      for (std::size_t q = 0; q < nk; ++q) counts[q] += m < st.ks[q];
    }
  };
  for (int l = 0; l < sets.layers; ++l) {
    for (int h = 0; h < sets.kv_heads; ++h) {
      for (int s = 0; s < sets.steps; ++s) {
        const std::vector<std::int64_t>& o = sets.output[sets.Index(s, l, h)];
        if (o.empty()) {
          ++st.empty_sets;
          continue;
        }
        const double n = double(sets.candidates[s]);
        ++leading_sets_[l];
        for (std::size_t i = 0; i < std::min<std::size_t>(o.size(), st.ks[0]); ++i) {
          if (o[i] < DecodeStats::kLeadingPositions) ++leading_hits_[l][o[i]];
        }
        for (std::size_t i = 0; i < o.size(); ++i) {
          const std::size_t pos = static_cast<std::size_t>(o[i]);
          if (pos >= rank_.size()) rank_.resize(pos + 1, -1);
          rank_[pos] = static_cast<std::int32_t>(i);
        }
        if (spec) {
          const std::vector<std::int64_t>& p = sets.prefetched[sets.Index(s, l, h)];
          common(p);
          for (std::size_t q = 0; q < nk; ++q) {
            const double a = double(size_at(p.size(), st.ks[q]));
            const double b = double(size_at(o.size(), st.ks[q]));
            st.spec_hit[q].Add(double(counts[q]) / b, a / n, l);
          }
        }
        for (std::size_t li = 0; li < st.lags.size(); ++li) {
          const int t = s + st.lags[li];
          if (t >= sets.steps) break;
          const std::vector<std::int64_t>& o2 = sets.output[sets.Index(t, l, h)];
          if (o2.empty()) continue;
          common(o2);
          // The later step's candidates include the earlier's: a uniformly random later set
          // meets the earlier one in |A||B|/n_t positions on average.
          const double nt = double(sets.candidates[t]);
          for (std::size_t q = 0; q < nk; ++q) {
            const double a = double(size_at(o.size(), st.ks[q]));
            const double b = double(size_at(o2.size(), st.ks[q]));
            const double x = double(counts[q]);
            const double e = a * b / nt;
            st.step_jaccard[q][li].Add(x / (a + b - x), e / (a + b - e), l);
            if (st.lags[li] == 1) st.step_hit[q].Add(x / b, a / nt, l);
          }
        }
        for (std::int64_t pos : o) rank_[static_cast<std::size_t>(pos)] = -1;
      }
    }
    for (int t = 0; t < DecodeStats::kLeadingPositions; ++t) {
      st.leading_share[l][t] =
          leading_sets_[l] ? double(leading_hits_[l][t]) / double(leading_sets_[l]) : 0.0;
    }
  }
}

std::string FormatDecodeTable(const DecodeStats& st) {
  std::ostringstream o;
  o << "\ndecode top-k sets (" << st.records << " records, " << st.steps << " steps, "
    << st.layers << " layers x " << st.kv_heads << " KV heads, recorded k " << st.k
    << ", mean candidates " << Num(st.candidates_mean, 1) << ")\n";
  if (st.empty_sets) o << "  " << st.empty_sets << " output sets without candidates skipped\n";
  o << "  step-to-step: J(O_s, O_s+1) of the output token's exact top-k; hit = |O_s ∩ O_s+1| / "
       "|O_s+1|\n";
  o << "  spec: |P_s ∩ O_s| / |O_s|, P_s prefetched by the previous step's speculative token\n";
  o << "       k   step-J  (p10   p50   p90)  random   step-hit   spec-hit  (p10   p50   p90)  "
       "random\n";
  char line[256];
  for (std::size_t q = 0; q < st.ks.size(); ++q) {
    const OverlapDistribution& j = st.step_jaccard[q][0];
    const OverlapDistribution& sp = st.spec_hit[q];
    std::snprintf(line, sizeof line,
                  "  %6d   %s  (%s %s %s)  %s   %s      %s  (%s %s %s)  %s\n", st.ks[q],
                  Cell(j.Mean()).c_str(), Cell(j.Quantile(0.1)).c_str(),
                  Cell(j.Quantile(0.5)).c_str(), Cell(j.Quantile(0.9)).c_str(),
                  Cell(j.RandomMean()).c_str(), Cell(st.step_hit[q].Mean()).c_str(),
                  Cell(sp.Mean()).c_str(), Cell(sp.Quantile(0.1)).c_str(),
                  Cell(sp.Quantile(0.5)).c_str(), Cell(sp.Quantile(0.9)).c_str(),
                  Cell(sp.RandomMean()).c_str());
    o << line;
  }
  if (st.lags.size() > 1) {
    o << "  step Jaccard by lag d:\n       k";
    for (int d : st.lags) {
      std::snprintf(line, sizeof line, "   d=%-3d", d);
      o << line;
    }
    o << "\n";
    for (std::size_t q = 0; q < st.ks.size(); ++q) {
      std::snprintf(line, sizeof line, "  %6d", st.ks[q]);
      o << line;
      for (std::size_t li = 0; li < st.lags.size(); ++li) {
        o << "   " << Cell(st.step_jaccard[q][li].Mean());
      }
      o << "\n";
    }
  }
  if (!st.ks.empty() && st.layers > 0) {
    // k = 64 (SpeCache's setting) when measured, else the largest k.
    std::size_t q = st.ks.size() - 1;
    for (std::size_t i = 0; i < st.ks.size(); ++i) {
      if (st.ks[i] == 64) q = i;
    }
    o << "  per layer at k = " << st.ks[q] << " (step-J | spec-hit):";
    for (int l = 0; l < st.layers; ++l) {
      if (l % 6 == 0) o << "\n   ";
      std::snprintf(line, sizeof line, " %2d %s|%s", l,
                    Cell(st.step_jaccard[q][0].LayerMean(l)).c_str(),
                    Cell(st.spec_hit[q].LayerMean(l)).c_str());
      o << line;
    }
    o << "\n";
  }
  return o.str();
}

std::string FormatDecodeJson(const DecodeStats& st, const std::string& indent) {
  std::ostringstream o;
  const std::string in = indent + "  ";
  o << "{\n" << in << "\"records\": " << st.records << ",\n" << in << "\"steps\": " << st.steps
    << ",\n" << in << "\"layers\": " << st.layers << ",\n" << in << "\"kv_heads\": " << st.kv_heads
    << ",\n" << in << "\"recorded_k\": " << st.k << ",\n" << in << "\"prefetched\": "
    << (st.has_prefetched ? "true" : "false") << ",\n" << in << "\"empty_sets\": " << st.empty_sets
    << ",\n" << in << "\"candidates_mean\": " << Num(st.candidates_mean, 2) << ",\n" << in
    << "\"lags\": [";
  for (std::size_t i = 0; i < st.lags.size(); ++i) o << (i ? ", " : "") << st.lags[i];
  o << "],\n" << in << "\"by_k\": [";
  for (std::size_t q = 0; q < st.ks.size(); ++q) {
    o << (q ? "," : "") << "\n" << in << "  {\"k\": " << st.ks[q] << ",\n" << in
      << "   \"step_jaccard\": " << DistributionJson(st.step_jaccard[q][0]) << ",\n" << in
      << "   \"step_jaccard_by_lag\": [";
    for (std::size_t li = 0; li < st.lags.size(); ++li) {
      o << (li ? ", " : "") << Num(st.step_jaccard[q][li].Mean(), 4);
    }
    o << "],\n" << in << "   \"step_hit\": " << DistributionJson(st.step_hit[q]) << ",\n" << in
      << "   \"spec_hit\": "
      << (st.has_prefetched ? DistributionJson(st.spec_hit[q]) : std::string("null")) << "}";
  }
  o << "\n" << in << "],\n" << in << "\"leading_share\": [";
  for (std::size_t l = 0; l < st.leading_share.size(); ++l) {
    o << (l ? ",\n" + in + "  " : "") << "[";
    for (std::size_t t = 0; t < st.leading_share[l].size(); ++t) {
      o << (t ? ", " : "") << Num(st.leading_share[l][t], 3);
    }
    o << "]";
  }
  o << "]\n" << indent << "}";
  return o.str();
}

}  // namespace kvtier
