#pragma once
// `kvtier trace fit`: fits every parameter of a procedural importance model
// (traces/importance_model.h) to a trace with importance (a recording of a real model), so
// that the model, replayed on the same requests, measures what the recording measures
// (traces/importance_stats.h, all at one retention). Every step measures the model on the
// trace's own sampled requests (same prefixes, lengths and prefix groups); deterministic.
//
// Version 4 (FitImportanceV4, `trace fit`'s default): version 3's steps below, plus
//   skew              <- the share of tokens kept by no layer (bisection)
// and the layer step keeps its iterate by the worst deviation of the Jaccard-by-distance curve
// and the adjacent-layer Jaccard (the statistics checked at every distance) instead of
// version 3's sum of squares.
// Version 3 (FitImportanceV3, `--model v3`; kept so version-3 fits reproduce):
//   head_corr[l]      <- head Jaccard of layer l          (simultaneous bisection per layer)
//   head_spread       <- ITF fallback rate (alpha, probe heads)
//   recency           <- mean f by distance from the prefix end
//   persistent_query  <- cross-query Pearson correlation of f
//   query_dependence  <- SPI recall
//   focus, focus_tokens <- cross-query focus (autocorrelation of f minus the other queries'
//                        mean along positions; least squares over lags >= 4)
//   loadings, layer_corr <- the layer-pair Jaccard matrix: a latent correlation matrix C is
//                        moved towards the recording's Jaccard (C += gain (J_rec - J_model))
//                        and factored as B B^T + sqrt(r r^T) chain(rho) (K factors, weighted
//                        least squares with weight 1/(L - |l - l'|), so every layer distance
//                        counts as much as the distance curve counts it)
//   smooth            <- chunks touched in stored order at the smallest chunk size
//   sink_tokens, sink_boost, tail <- the log2 scores (as `trace fit --model v1`)
// in a few rounds, each parameter in turn.
// Version 2 (FitImportanceV2, `--model v2`): as above without focus, with the persistent
// field, slow chain and layer_corr fitted to the Jaccard-by-distance curve (least squares,
// coordinate-wise golden-section search). Kept so version-2 fits reproduce.
// Also GenerateLikeTrace: a procedural copy of a trace's request stream, which is how a fit is
// checked (`trace gen --like T --config fit.ini`).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "traces/importance_model.h"
#include "traces/importance_stats.h"
#include "traces/trace_format.h"

namespace kvtier {

struct ModelFitOptions {
  double retention = 0.25;
  std::int64_t requests = 64;  // sampled requests (the first with importance)
  StructureStatsOptions structure;  // ITF alpha and probe heads, chunk sizes (retention: above)
  int rounds = 3;
  std::uint64_t seed = 1;
  int factors = 4;  // versions 3, 4: K, the fields shared across layers
  // Called after each evaluation of a candidate model (the fit's unit of work; a fit of a
  // 40-layer, 40-head trace makes hundreds, minutes in all) with the step it belongs to
  // ("round 1 of 3: head agreement") and the evaluations so far. Optional.
  std::function<void(const std::string& step, std::int64_t evaluations)> progress;
};

struct ModelFit {
  ProceduralParams params;
  ModelDescriptor model;     // the trace's model (the fit's shape)
  ImportanceStats recorded;  // the trace's statistics at the fit retention
  ImportanceStats fitted;    // the fitted model's, on the same requests
};

// Throws TraceError when the trace has no importance or no request with >= min_tokens tokens.
ModelFit FitImportanceV2(const std::string& path, const ModelFitOptions& options);
ModelFit FitImportanceV3(const std::string& path, const ModelFitOptions& options);
ModelFit FitImportanceV4(const std::string& path, const ModelFitOptions& options);

// Factors a layer correlation matrix (the fit's layer step, exposed for tests): finds B
// (layers x factors, rows of norm <= 0.99) and rho in [0, 0.95] minimising
//   sum over l != l' of (C[l,l'] - B_l . B_l' - sqrt(r_l r_l') ChainCorrelation(rho, l, l'))^2
//     / (L - |l-l'|),
// r_l = 1 - |B_l|^2, skipping NaN entries. `c` is row-major layers x layers. Deterministic.
struct LayerFactors {
  std::vector<double> loadings;  // layers x factors, row-major
  double rho = 0;
  double error = 0;  // the weighted sum of squares above
};
LayerFactors FactorLayerCorrelation(const std::vector<double>& c, int layers, int factors);

// "[importance]\nparams = model=vN ..." with the recorded-vs-fitted comparison as comments.
std::string FormatModelFitIni(const ModelFit& fit, const std::string& source);

// Writes a copy of `source`'s records (arrivals, prefixes, lengths, query ids) with procedural
// importance from `params` (query keys DefaultQueryKey(params.seed, id)); header model and
// metadata as the source's. Returns the number of records.
std::int64_t GenerateLikeTrace(const std::string& source, const std::string& path,
                               const ProceduralParams& params);

}  // namespace kvtier
