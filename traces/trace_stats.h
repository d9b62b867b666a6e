#pragma once
// Trace statistics (`kvtier trace stats`) and importance fitting (`kvtier trace fit`).
// One streaming pass: memory is bounded by the distinct length values, the set of distinct
// prefix blocks (the ideal-reuse cache is unbounded by definition) and the importance sample.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "traces/decode_stats.h"
#include "traces/generator.h"
#include "traces/importance_stats.h"
#include "traces/trace_format.h"

namespace kvtier {

// Exact distribution of an integer quantity (value -> count).
struct Distribution {
  std::map<std::int64_t, std::int64_t> counts;
  std::int64_t n = 0;
  double sum = 0;

  void Add(std::int64_t v) {
    ++counts[v];
    ++n;
    sum += double(v);
  }
  double Mean() const { return n ? sum / double(n) : 0; }
  std::int64_t Min() const { return n ? counts.begin()->first : 0; }
  std::int64_t Max() const { return n ? counts.rbegin()->first : 0; }
  std::int64_t Quantile(double q) const;
};

struct TraceStatsOptions {
  ImportanceStatsOptions importance;
  std::int64_t importance_requests = 64;  // requests sampled for importance statistics (first)
  std::optional<ProceduralParams> none_model;  // importance model for payload-none traces
  DecodeStatsOptions decode;  // decode top-k sets (extension 2), when the trace has them
};

struct TraceStats {
  std::string path;
  TraceHeader header;
  std::int64_t requests = 0;
  std::int64_t by_kind[3] = {0, 0, 0};  // none, explicit, procedural
  double first_arrival_s = 0, last_arrival_s = 0;
  Distribution prefix_tokens, query_tokens, output_tokens, input_tokens;
  // Ideal reuse with an unbounded cache, prefix-contiguous rule: a prefix symbol is reusable iff
  // it and all earlier symbols of the request were seen (as a chain) in an earlier request.
  std::int64_t prefix_symbols = 0, reusable_symbols = 0;
  std::int64_t total_prefix_tokens = 0, reusable_tokens = 0, total_input_tokens = 0;
  std::int64_t distinct_symbols = 0;  // distinct prefix chains (cache size of the ideal cache)
  double IdealReuseRatio() const {  // of prefix tokens
    return total_prefix_tokens ? double(reusable_tokens) / double(total_prefix_tokens) : 0;
  }
  double IdealReuseOfInput() const {  // of all input (prefix + query) tokens
    return total_input_tokens ? double(reusable_tokens) / double(total_input_tokens) : 0;
  }
  std::optional<ImportanceStats> importance;
  std::optional<DecodeStats> decode;  // records with decode top-k sets (traces/decode_stats.h)
};

// Reads the whole trace. Throws TraceError for a malformed trace.
TraceStats ComputeTraceStats(const std::string& path, const TraceStatsOptions& options = {});
std::string FormatStatsTable(const TraceStats& stats);
std::string FormatStatsJson(const TraceStats& stats);
// The structure block of both (also printed by `trace fit` for the fitted model).
std::string FormatStructureTable(const StructureStats& stats);
std::string FormatStructureJson(const StructureStats& stats, const std::string& indent);

// Estimates importance-model targets from a trace with importance (a recording of a real
// model), so `trace gen` can follow it: the per-layer head Jaccard profile, the adjacent-layer
// Jaccard and the SPI recall at `retention`, the attention-sink count and boost, and the tail.
struct FitResult {
  ImportanceTargets targets;
  ImportanceStats stats;
  bool recall_measured = false;  // false: no two sampled requests shared a prefix
};
FitResult FitImportance(const std::string& path, double retention,
                        const TraceStatsOptions& options = {});
// The [importance] INI section `trace gen --config` reads.
std::string FormatFitIni(const FitResult& fit);

}  // namespace kvtier
