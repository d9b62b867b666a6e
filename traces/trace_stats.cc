#include "traces/trace_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <unordered_set>

#include "core/errors.h"
#include "traces/hash.h"
#include "traces/score_source.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

std::uint64_t PrefixGroup(const Request& q) {
  std::uint64_t h = hash::ChainStart(q.tokens_per_symbol);
  for (std::uint64_t s : q.prefix) h = hash::ChainNext(h, s);
  return h;
}

ModelSpec SpecOf(const ModelDescriptor& m) {
  ModelSpec spec;
  spec.name = m.name;
  spec.layers = m.layers;
  spec.heads = m.heads;
  spec.kv_heads = m.kv_heads;
  return spec;
}

bool HasImportance(const TraceRecord& rec, const TraceStatsOptions& opt) {
  return rec.importance != ImportanceKind::kNone || opt.none_model.has_value();
}

// Calls fn(record, source) for the first `options.importance_requests` records with importance.
template <typename Fn>
void ForEachImportanceSample(TraceReader* reader, const TraceStatsOptions& opt, Fn fn) {
  TraceScoreSource source(reader->header(), SpecOf(reader->header().model), opt.none_model);
  TraceRecord rec;
  std::int64_t taken = 0;
  while (taken < opt.importance_requests && reader->Next(&rec)) {
    if (!HasImportance(rec, opt) || rec.request.prefix_tokens() < 2) continue;
    source.Add(rec);
    fn(rec, source);
    source.Release(rec.request.id);
    ++taken;
  }
}

std::string Num(double v, int digits = 4) {
  if (std::isnan(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string JsonString(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

std::string DistJson(const Distribution& d) {
  std::ostringstream s;
  s << "{\"count\": " << d.n << ", \"min\": " << d.Min() << ", \"mean\": " << Num(d.Mean(), 2)
    << ", \"p50\": " << d.Quantile(0.5) << ", \"p90\": " << d.Quantile(0.9)
    << ", \"p99\": " << d.Quantile(0.99) << ", \"max\": " << d.Max() << "}";
  return s.str();
}

std::string JsonArray(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Num(v[i]);
  return s + "]";
}

std::string Pct(double v) { return std::isnan(v) ? std::string("n/a") : Num(100 * v, 1) + "%"; }

}  // namespace

std::string FormatStructureTable(const StructureStats& s) {
  std::ostringstream o;
  char line[256];
  o << "\n  structure at " << Num(100 * s.retention, 0) << "% retention (" << s.requests
    << " requests with >= " << s.min_tokens << " tokens)\n";
  o << "  layer-set Jaccard by layer distance d (random " << Num(s.random_jaccard, 3) << ")\n";
  for (std::size_t d = 0; d < s.jaccard_by_distance.size(); ++d) {
    if (d % 8 == 0) o << (d ? "\n" : "") << "   ";
    std::snprintf(line, sizeof line, " d=%-2zu %s", d + 1, Num(s.jaccard_by_distance[d], 3).c_str());
    o << line;
  }
  o << "\n  layer-share dispersion   " << Num(s.dispersion, 2) << "x binomial (var f "
    << Num(s.f_mean_var, 4) << "), kept by no layer " << Num(100 * s.kept_by_none, 1)
    << "% of tokens\n";
  o << "  recency: mean f by distance from the prefix end ";
  for (std::size_t b = 0; b < s.f_by_distance.size(); ++b) {
    const long lo = (1L << (2 * b)) - 1, hi = (1L << (2 * b + 2)) - 2;
    o << (b ? ", " : "") << lo << "-" << hi << " " << Num(s.f_by_distance[b], 3);
  }
  o << "\n";
  o << "  cross-query (" << s.pairs << " pairs on a shared prefix): Pearson of f "
    << Num(s.f_pearson, 3) << ", Jaccard of top-k by f " << Num(s.f_topk_jaccard, 3) << "\n";
  o << "  cross-query focus: autocorrelation of f minus the other queries' mean at lag";
  for (std::size_t i = 0; i < s.focus_lags.size(); ++i) {
    o << (i ? ", " : " ") << s.focus_lags[i] << " " << Num(s.focus_autocorr[i], 3);
  }
  o << "\n";
  o << "  chunks touched per layer (" << s.history_requests
    << " requests with history)\n     chunk   stored  history    own-f  saving(history)  "
       "saving(own)\n";
  for (std::size_t c = 0; c < s.chunk_sizes.size(); ++c) {
    std::snprintf(line, sizeof line, "    %6d %8s %8s %8s  %15s  %11s\n", s.chunk_sizes[c],
                  Num(s.chunks_stored[c], 2).c_str(), Num(s.chunks_history[c], 2).c_str(),
                  Num(s.chunks_own[c], 2).c_str(), Pct(s.HistorySaving(c)).c_str(),
                  Pct(s.OwnSaving(c)).c_str());
    o << line;
  }
  if (!s.chunks_itf_stored.empty() && !std::isnan(s.chunks_itf_stored[0])) {
    o << "  chunks ITF loads per layer, K and V / 2 (voted sets; on a fallback every key and the"
         " heads' union)\n     chunk   stored  history  saving(history)\n";
    for (std::size_t c = 0; c < s.chunk_sizes.size(); ++c) {
      std::snprintf(line, sizeof line, "    %6d %8s %8s  %15s\n", s.chunk_sizes[c],
                    Num(s.chunks_itf_stored[c], 2).c_str(),
                    Num(s.chunks_itf_history[c], 2).c_str(), Pct(s.ItfHistorySaving(c)).c_str());
      o << line;
    }
  }
  o << "  ITF fallback (alpha " << Num(s.itf_alpha, 2) << ", " << s.itf_probe_heads
    << " probe heads) " << Pct(s.FallbackRate()) << " of " << s.itf_layers
    << " layers; probe similarity mean " << Num(s.itf_similarity_mean, 3) << ", sd within a layer "
    << Num(std::sqrt(s.itf_similarity_within_var), 3) << "\n";
  return o.str();
}

std::string FormatStructureJson(const StructureStats& s, const std::string& indent) {
  std::ostringstream o;
  const std::string in = indent + "  ";
  o << "{\n" << in << "\"retention\": " << Num(s.retention, 3) << ",\n"
    << in << "\"min_tokens\": " << s.min_tokens << ",\n"
    << in << "\"requests\": " << s.requests << ",\n"
    << in << "\"jaccard_by_distance\": " << JsonArray(s.jaccard_by_distance) << ",\n"
    << in << "\"random_jaccard\": " << Num(s.random_jaccard) << ",\n"
    << in << "\"dispersion\": " << Num(s.dispersion) << ",\n"
    << in << "\"f_variance\": " << Num(s.f_mean_var, 6) << ",\n"
    << in << "\"kept_by_none\": " << Num(s.kept_by_none) << ",\n"
    << in << "\"f_by_distance\": " << JsonArray(s.f_by_distance) << ",\n"
    << in << "\"cross_query\": {\"pairs\": " << s.pairs << ", \"f_pearson\": " << Num(s.f_pearson)
    << ", \"f_topk_jaccard\": " << Num(s.f_topk_jaccard) << ", \"focus_lags\": [";
  for (std::size_t i = 0; i < s.focus_lags.size(); ++i) o << (i ? ", " : "") << s.focus_lags[i];
  o << "], \"focus_autocorr\": " << JsonArray(s.focus_autocorr) << "},\n"
    << in << "\"layer_pair_jaccard\": [";
  for (int l = 0; l < s.layers; ++l) {
    o << (l ? ",\n" + in + "  " : "") << JsonArray(std::vector<double>(
        s.jaccard_by_pair.begin() + std::ptrdiff_t(l) * s.layers,
        s.jaccard_by_pair.begin() + std::ptrdiff_t(l + 1) * s.layers));
  }
  o << "],\n"
    << in << "\"packing\": {\"history_requests\": " << s.history_requests << ", \"chunk_tokens\": [";
  for (std::size_t c = 0; c < s.chunk_sizes.size(); ++c) o << (c ? ", " : "") << s.chunk_sizes[c];
  std::vector<double> hs, os, is;
  for (std::size_t c = 0; c < s.chunk_sizes.size(); ++c) {
    hs.push_back(s.HistorySaving(c));
    os.push_back(s.OwnSaving(c));
    is.push_back(s.ItfHistorySaving(c));
  }
  o << "],\n" << in << "  \"chunks_stored\": " << JsonArray(s.chunks_stored)
    << ",\n" << in << "  \"chunks_history\": " << JsonArray(s.chunks_history)
    << ",\n" << in << "  \"chunks_own\": " << JsonArray(s.chunks_own)
    << ",\n" << in << "  \"history_saving\": " << JsonArray(hs)
    << ",\n" << in << "  \"own_saving\": " << JsonArray(os)
    << ",\n" << in << "  \"itf_chunks_stored\": " << JsonArray(s.chunks_itf_stored)
    << ",\n" << in << "  \"itf_chunks_history\": " << JsonArray(s.chunks_itf_history)
    << ",\n" << in << "  \"itf_history_saving\": " << JsonArray(is) << "},\n"
    << in << "\"itf\": {\"alpha\": " << Num(s.itf_alpha, 3) << ", \"probe_heads\": "
    << s.itf_probe_heads << ", \"layers\": " << s.itf_layers << ", \"fallbacks\": "
    << s.itf_fallbacks << ", \"fallback_rate\": " << Num(s.FallbackRate())
    << ", \"similarity_mean\": " << Num(s.itf_similarity_mean)
    << ", \"similarity_within_layer_var\": " << Num(s.itf_similarity_within_var, 6) << "}\n"
    << indent << "}";
  return o.str();
}

std::int64_t Distribution::Quantile(double q) const {
  if (n == 0) return 0;
  const std::int64_t rank = std::clamp<std::int64_t>(std::int64_t(std::ceil(q * double(n))), 1, n);
  std::int64_t seen = 0;
  for (const auto& [v, c] : counts) {
    seen += c;
    if (seen >= rank) return v;
  }
  return Max();
}

TraceStats ComputeTraceStats(const std::string& path, const TraceStatsOptions& opt) {
  TraceStats st;
  st.path = path;
  TraceReader reader(path);
  st.header = reader.header();
  const TraceHeader& h = reader.header();
  std::unordered_set<std::uint64_t> seen;
  std::optional<TraceScoreSource> source;
  std::optional<ImportanceAccumulator> acc;
  std::int64_t sampled = 0;
  TraceRecord rec;
  std::vector<float> tmp;
  DecodeStatsAccumulator decode(opt.decode);
  while (reader.Next(&rec)) {
    if (rec.decode_sets) decode.Add(*rec.decode_sets);
    const Request& q = rec.request;
    if (st.requests == 0) st.first_arrival_s = q.arrival_s;
    st.last_arrival_s = std::max(st.last_arrival_s, q.arrival_s);
    ++st.requests;
    ++st.by_kind[static_cast<int>(rec.importance)];
    const std::int64_t pt = q.prefix_tokens();
    st.prefix_tokens.Add(pt);
    st.query_tokens.Add(q.query_tokens);
    st.output_tokens.Add(q.output_tokens);
    st.input_tokens.Add(pt + q.query_tokens);
    st.total_prefix_tokens += pt;
    st.total_input_tokens += pt + q.query_tokens;
    st.prefix_symbols += std::int64_t(q.prefix.size());
    std::uint64_t chain = hash::ChainStart(q.tokens_per_symbol);
    bool contiguous = true;
    for (std::uint64_t s : q.prefix) {
      chain = hash::ChainNext(chain, s);
      const bool inserted = seen.insert(chain).second;
      if (inserted) contiguous = false;
      if (contiguous) {
        ++st.reusable_symbols;
        st.reusable_tokens += q.tokens_per_symbol;
      }
    }
    if (sampled < opt.importance_requests && HasImportance(rec, opt) && pt >= 2) {
      if (!source) {
        source.emplace(h, SpecOf(h.model), opt.none_model);
        acc.emplace(h.model.layers, h.model.kv_heads, opt.importance);
      }
      source->Add(rec);
      acc->AddRequest(PrefixGroup(q), pt, [&](int l, std::span<const int> heads, float* out) {
        source->Scores(q, l, pt, heads, &tmp);
        std::copy(tmp.begin(), tmp.end(), out);
      });
      source->Release(q.id);
      ++sampled;
    }
  }
  st.distinct_symbols = std::int64_t(seen.size());
  if (acc) st.importance = acc->Result();
  if (!decode.empty()) st.decode = decode.Result();
  return st;
}

std::string FormatStatsTable(const TraceStats& st) {
  std::ostringstream o;
  const TraceHeader& h = st.header;
  char line[256];
  o << "trace            " << st.path << "\n";
  o << "format           v" << h.version << ", producer '" << h.producer << "'\n";
  o << "model            " << h.model.name << " (" << h.model.layers << " layers, " << h.model.heads
    << " heads, " << h.model.kv_heads << " kv heads)";
  if (h.chunk_tokens) o << ", chunk " << h.chunk_tokens << " tokens";
  o << "\n";
  o << "requests         " << st.requests << " (none " << st.by_kind[0] << ", explicit "
    << st.by_kind[1] << ", procedural " << st.by_kind[2] << ")\n";
  o << "arrivals         " << Num(st.first_arrival_s, 3) << " s .. " << Num(st.last_arrival_s, 3)
    << " s\n\n";
  o << "lengths (tokens)      min      p50     mean      p90      p99      max\n";
  auto row = [&](const char* name, const Distribution& d) {
    std::snprintf(line, sizeof line, "  %-14s %8lld %8lld %8.1f %8lld %8lld %8lld\n", name,
                  (long long)d.Min(), (long long)d.Quantile(0.5), d.Mean(),
                  (long long)d.Quantile(0.9), (long long)d.Quantile(0.99), (long long)d.Max());
    o << line;
  };
  row("prefix", st.prefix_tokens);
  row("query", st.query_tokens);
  row("output", st.output_tokens);
  row("input", st.input_tokens);
  o << "\nideal reuse (unbounded cache, prefix-contiguous)\n";
  std::snprintf(line, sizeof line,
                "  reusable prefix symbols %lld of %lld; tokens %lld of %lld prefix tokens\n",
                (long long)st.reusable_symbols, (long long)st.prefix_symbols,
                (long long)st.reusable_tokens, (long long)st.total_prefix_tokens);
  o << line;
  std::snprintf(line, sizeof line,
                "  ideal reuse ratio %.4f of prefix tokens, %.4f of input tokens; %lld distinct "
                "prefix symbols\n",
                st.IdealReuseRatio(), st.IdealReuseOfInput(), (long long)st.distinct_symbols);
  o << line;
  if (!st.importance) {
    o << "\nimportance       none in this trace (name an importance model to measure one)\n";
    if (st.decode) o << FormatDecodeTable(*st.decode);
    return o.str();
  }
  const ImportanceStats& im = *st.importance;
  o << "\nimportance (" << im.requests << " sampled requests, " << im.recall_samples
    << " SPI recall samples)\n";
  o << "  retention  head-J   random   layer-J   SPI-recall\n";
  for (std::size_t r = 0; r < im.retentions.size(); ++r) {
    std::snprintf(line, sizeof line, "  %8.0f%%  %6.3f   %6.3f   %7.3f   %s\n",
                  im.retentions[r] * 100, im.MeanHeadJaccard(r), im.MeanRandomJaccard(r),
                  im.MeanLayerJaccard(r), im.recall_samples ? Num(im.MeanRecall(r), 3).c_str() : "n/a");
    o << line;
  }
  if (im.structure) o << FormatStructureTable(*im.structure);
  o << "\n  per layer (head-J at each retention | layer-J l,l+1 at each retention)\n  layer";
  for (double r : im.retentions) {
    std::snprintf(line, sizeof line, "  hJ@%2.0f%%", r * 100);
    o << line;
  }
  for (double r : im.retentions) {
    std::snprintf(line, sizeof line, "  lJ@%2.0f%%", r * 100);
    o << line;
  }
  o << "\n";
  for (int l = 0; l < im.layers; ++l) {
    std::snprintf(line, sizeof line, "  %5d", l);
    o << line;
    for (std::size_t r = 0; r < im.retentions.size(); ++r) {
      std::snprintf(line, sizeof line, "  %6.3f", im.head_jaccard[r][l]);
      o << line;
    }
    for (std::size_t r = 0; r < im.retentions.size(); ++r) {
      if (l + 1 < im.layers) {
        std::snprintf(line, sizeof line, "  %6.3f", im.layer_jaccard[r][l]);
      } else {
        std::snprintf(line, sizeof line, "  %6s", "-");
      }
      o << line;
    }
    o << "\n";
  }
  if (st.decode) o << FormatDecodeTable(*st.decode);
  return o.str();
}

std::string FormatStatsJson(const TraceStats& st) {
  std::ostringstream o;
  const TraceHeader& h = st.header;
  o << "{\n  \"trace\": " << JsonString(st.path) << ",\n  \"format_version\": " << h.version
    << ",\n  \"producer\": " << JsonString(h.producer) << ",\n  \"model\": {\"name\": "
    << JsonString(h.model.name) << ", \"layers\": " << h.model.layers << ", \"heads\": "
    << h.model.heads << ", \"kv_heads\": " << h.model.kv_heads << "},\n  \"chunk_tokens\": "
    << h.chunk_tokens << ",\n  \"requests\": " << st.requests
    << ",\n  \"importance_kinds\": {\"none\": " << st.by_kind[0] << ", \"explicit\": "
    << st.by_kind[1] << ", \"procedural\": " << st.by_kind[2] << "},\n  \"arrival_s\": {\"first\": "
    << Num(st.first_arrival_s, 6) << ", \"last\": " << Num(st.last_arrival_s, 6) << "},\n"
    << "  \"prefix_tokens\": " << DistJson(st.prefix_tokens) << ",\n  \"query_tokens\": "
    << DistJson(st.query_tokens) << ",\n  \"output_tokens\": " << DistJson(st.output_tokens)
    << ",\n  \"input_tokens\": " << DistJson(st.input_tokens) << ",\n  \"ideal_reuse\": {"
    << "\"prefix_symbols\": " << st.prefix_symbols << ", \"reusable_symbols\": "
    << st.reusable_symbols << ", \"prefix_tokens\": " << st.total_prefix_tokens
    << ", \"reusable_tokens\": " << st.reusable_tokens << ", \"input_tokens\": "
    << st.total_input_tokens << ", \"distinct_symbols\": " << st.distinct_symbols
    << ", \"ratio\": " << Num(st.IdealReuseRatio(), 6) << ", \"ratio_of_input\": "
    << Num(st.IdealReuseOfInput(), 6) << "}";
  if (st.importance) {
    const ImportanceStats& im = *st.importance;
    o << ",\n  \"importance\": {\n    \"sampled_requests\": " << im.requests
      << ",\n    \"recall_samples\": " << im.recall_samples << ",\n    \"by_retention\": [";
    for (std::size_t r = 0; r < im.retentions.size(); ++r) {
      o << (r ? ",\n" : "\n") << "      {\"retention\": " << Num(im.retentions[r], 3)
        << ", \"head_jaccard_mean\": " << Num(im.MeanHeadJaccard(r))
        << ", \"random_jaccard_mean\": " << Num(im.MeanRandomJaccard(r))
        << ", \"layer_jaccard_mean\": " << Num(im.MeanLayerJaccard(r))
        << ", \"spi_recall_mean\": " << (im.recall_samples ? Num(im.MeanRecall(r)) : "null")
        << ",\n       \"head_jaccard\": " << JsonArray(im.head_jaccard[r])
        << ",\n       \"random_jaccard\": " << JsonArray(im.random_jaccard[r])
        << ",\n       \"layer_jaccard\": "
        << JsonArray(std::vector<double>(im.layer_jaccard[r].begin(),
                                         im.layer_jaccard[r].end() - (im.layers > 0 ? 1 : 0)))
        << "}";
    }
    o << "\n    ]";
    if (im.structure) o << ",\n    \"structure\": " << FormatStructureJson(*im.structure, "    ");
    o << "\n  }";
  }
  if (st.decode) o << ",\n  \"decode\": " << FormatDecodeJson(*st.decode, "  ");
  o << "\n}\n";
  return o.str();
}

FitResult FitImportance(const std::string& path, double retention, const TraceStatsOptions& opt_in) {
  TraceStatsOptions opt = opt_in;
  opt.importance.retentions = {retention};
  FitResult fit;
  {
    const TraceStats st = ComputeTraceStats(path, opt);
    if (!st.importance) throw TraceError(path + ": no importance to fit (payload none)");
    fit.stats = *st.importance;
  }
  ImportanceTargets& t = fit.targets;
  t.retention = retention;
  t.head_jaccard = fit.stats.head_jaccard[0];
  for (double& v : t.head_jaccard) {
    if (std::isnan(v)) v = fit.stats.MeanHeadJaccard(0);
  }
  t.layer_jaccard = fit.stats.layers > 1 ? fit.stats.MeanLayerJaccard(0) : 1.0;
  fit.recall_measured = fit.stats.recall_samples > 0;
  if (fit.recall_measured) t.spi_recall = fit.stats.MeanRecall(0);

  // Sinks and tail from the log2 scores: a leading position is a sink if it sits in the top 1%
  // of at least half of the rows; boost = mean log2 gap of sinks over the row's other tokens;
  // tail = mean over rows of the sd of the non-sink log2 scores.
  constexpr int kMaxSinkScan = 16;
  TraceReader reader(path);
  std::vector<std::int64_t> top_hits(kMaxSinkScan, 0);
  std::int64_t rows = 0;
  double sd_sum = 0, gap_sum = 0;
  std::int64_t gap_n = 0;
  std::vector<int> all_heads(reader.header().model.kv_heads);
  for (int i = 0; i < int(all_heads.size()); ++i) all_heads[i] = i;
  struct Row {
    std::vector<float> log2;
  };
  std::vector<float> scores, sorted;
  std::vector<std::vector<float>> kept;  // first rows' log2 scores for the boost pass
  ForEachImportanceSample(&reader, opt, [&](const TraceRecord& rec, TraceScoreSource& src) {
    const std::int64_t n = rec.request.prefix_tokens();
    for (int l = 0; l < reader.header().model.layers; ++l) {
      src.Scores(rec.request, l, n, all_heads, &scores);
      for (std::size_t hh = 0; hh < all_heads.size(); ++hh) {
        const float* row = scores.data() + hh * n;
        sorted.assign(row, row + n);
        const std::int64_t k = std::max<std::int64_t>(1, n / 100);
        std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
        const float cut = sorted[k - 1];
        for (int t = 0; t < std::min<std::int64_t>(kMaxSinkScan, n); ++t) top_hits[t] += row[t] >= cut;
        ++rows;
        if (kept.size() < 4096) {
          std::vector<float> lg(static_cast<std::size_t>(n));
          for (std::int64_t i = 0; i < n; ++i) lg[i] = row[i] > 0 ? std::log2(row[i]) : -120.0f;
          kept.push_back(std::move(lg));
        }
      }
    }
  });
  int sinks = 0;
  while (sinks < kMaxSinkScan && rows > 0 && top_hits[sinks] * 2 >= rows) ++sinks;
  t.sink_tokens = sinks;
  for (const auto& lg : kept) {
    if (std::int64_t(lg.size()) <= sinks + 1) continue;
    double m = 0, m2 = 0;
    const std::int64_t cnt = std::int64_t(lg.size()) - sinks;
    for (std::size_t i = sinks; i < lg.size(); ++i) m += lg[i];
    m /= double(cnt);
    for (std::size_t i = sinks; i < lg.size(); ++i) m2 += (lg[i] - m) * (lg[i] - m);
    sd_sum += std::sqrt(m2 / double(cnt));
    for (int i = 0; i < sinks; ++i) {
      gap_sum += lg[i] - m;
      ++gap_n;
    }
  }
  t.tail = kept.empty() ? t.tail : std::clamp(sd_sum / double(kept.size()), 0.05, 20.0);
  t.sink_boost = gap_n ? std::clamp(gap_sum / double(gap_n), 0.0, 60.0) : 0.0;
  return fit;
}

std::string FormatFitIni(const FitResult& fit) {
  const ImportanceTargets& t = fit.targets;
  std::ostringstream o;
  o << "# Fitted by kvtier trace fit from " << fit.stats.requests << " sampled requests.\n";
  if (!fit.recall_measured) {
    o << "# spi_recall: no two sampled requests shared a prefix; kept the default.\n";
  }
  o << "[importance]\nretention = " << Num(t.retention, 3) << "\nhead_jaccard = ";
  for (std::size_t i = 0; i < t.head_jaccard.size(); ++i) o << (i ? "," : "") << Num(t.head_jaccard[i]);
  o << "\nlayer_jaccard = " << Num(t.layer_jaccard) << "\nspi_recall = " << Num(t.spi_recall)
    << "\nsink_tokens = " << t.sink_tokens << "\nsink_boost = " << Num(t.sink_boost, 3)
    << "\ntail = " << Num(t.tail, 3) << "\n";
  return o.str();
}

}  // namespace kvtier
