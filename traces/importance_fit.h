#pragma once
// `kvtier trace fit --model v2`: fits every parameter of the version-2 procedural importance
// model (traces/importance_model.h) to a trace with importance (a recording of a real model),
// so that the model, replayed on the same requests, measures what the recording measures
// (traces/importance_stats.h, all at one retention):
//   head_corr[l]      <- head Jaccard of layer l          (simultaneous bisection per layer)
//   head_spread       <- ITF fallback rate (alpha, probe heads)
//   persistent, persistent_corr, slow, slow_corr, layer_corr <- the layer-set
//                        Jaccard-by-distance curve
//                        (least squares, coordinate-wise golden-section search)
//   smooth            <- chunks touched in stored order at the smallest chunk size
//   recency           <- mean f by distance from the prefix end
//   persistent_query  <- cross-query Pearson correlation of f
//   query_dependence  <- SPI recall
//   sink_tokens, sink_boost, tail <- the log2 scores (as `trace fit` for version 1)
// in a few rounds of coordinate-wise bisection, each step measuring the model on the trace's
// own sampled requests (same prefixes, lengths and prefix groups). Deterministic.
// Also GenerateLikeTrace: a procedural copy of a trace's request stream, which is how a fit is
// checked (`trace gen --like T --config fit.ini`).

#include <cstdint>
#include <string>
#include <vector>

#include "traces/importance_model.h"
#include "traces/importance_stats.h"
#include "traces/trace_format.h"

namespace kvtier {

struct FitV2Options {
  double retention = 0.25;
  std::int64_t requests = 64;  // sampled requests (the first with importance)
  StructureStatsOptions structure;  // ITF alpha and probe heads, chunk sizes (retention: above)
  int rounds = 3;
  std::uint64_t seed = 1;
};

struct FitV2Result {
  ProceduralParams params;
  ModelDescriptor model;     // the trace's model (the fit's shape)
  ImportanceStats recorded;  // the trace's statistics at the fit retention
  ImportanceStats fitted;    // the fitted model's, on the same requests
};

// Throws TraceError when the trace has no importance or no request with >= min_tokens tokens.
FitV2Result FitImportanceV2(const std::string& path, const FitV2Options& options);

// "[importance]\nparams = model=v2 ..." with the recorded-vs-fitted comparison as comments.
std::string FormatFitV2Ini(const FitV2Result& fit, const std::string& source);

// Writes a copy of `source`'s records (arrivals, prefixes, lengths, query ids) with procedural
// importance from `params` (query keys DefaultQueryKey(params.seed, id)); header model and
// metadata as the source's. Returns the number of records.
std::int64_t GenerateLikeTrace(const std::string& source, const std::string& path,
                               const ProceduralParams& params);

}  // namespace kvtier
