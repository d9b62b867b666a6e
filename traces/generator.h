#pragma once
// Synthetic trace generator (`kvtier trace gen`): workloads like SPEC's evaluation (shared
// few-shot system prompts of 2-10 examples, normally distributed reuse frequency, prefixes up to
// 4K-10K tokens) and like RAG (documents from a pool with Zipf popularity), Poisson or
// closed-loop arrivals, and a procedural importance model calibrated so that `trace stats`
// measures the target similarities (head Jaccard profile, adjacent-layer Jaccard, SPI recall).
// Keys of the INI sections [workload] / [importance] are documented in traces/FORMAT.md.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "traces/importance_model.h"
#include "traces/trace_format.h"

namespace kvtier {

struct WorkloadParams {
  std::string kind = "fewshot";  // fewshot | rag
  std::int64_t requests = 1000;
  std::uint64_t seed = 1;
  std::string arrival = "poisson";  // poisson | closed
  double rate = 10;                 // poisson: requests per second
  int clients = 8;                  // closed: concurrent clients
  double think_s = 0;               // closed: think time between a client's requests
  int vocab = 50272;                // OPT vocabulary
  // fewshot: `prompts` system prompts over `tasks` tasks; a prompt holds a task header and the
  // first m examples of its task (m uniform in [examples_min, examples_max]), so prompts of one
  // task share a prefix. Prompt popularity ~ Normal(prompts/2, prompts * popularity_sd).
  int tasks = 4;
  int prompts = 32;
  int examples_min = 2, examples_max = 10;
  double example_tokens = 830, example_tokens_sd = 200;
  int header_tokens = 64;
  double popularity_sd = 0.2;
  std::int64_t max_prefix_tokens = 10240;
  // rag: prefix = docs_per_request documents drawn by Zipf(zipf) popularity from `docs`,
  // most popular first.
  int docs = 1000;
  int docs_per_request = 3;
  double doc_tokens = 1500, doc_tokens_sd = 400;
  double zipf = 0.9;
  // Query and output lengths: lognormal-like (mean, sd), at least 1 token.
  double query_tokens = 64, query_tokens_sd = 32;
  double output_tokens = 128, output_tokens_sd = 64;
  bool query_ids = false;  // also store query token ids
};

// What `trace stats` should measure on the generated trace (at `retention`).
struct ImportanceTargets {
  std::string importance = "procedural";  // procedural | none
  double retention = 0.4;
  std::vector<double> head_jaccard = {0.78, 0.58};  // depth profile (mean 0.68, OPT-30B, §IV-B)
  double layer_jaccard = 0.6;  // adjacent-layer Jaccard of layer sets
  double spi_recall = 0.8;     // §III-A: ~80%
  int sink_tokens = 4;
  double sink_boost = 6.0;
  double tail = 1.5;
  int calibration_tokens = 0;  // 0: the workload's mean prefix length, clamped to [512, 4096]
  // A complete importance model ("model=v2 seed=1 head_corr=..."; `trace fit` writes one):
  // when set, it is used as is and the targets above are not calibrated.
  std::string params;
};

// Finds ProceduralParams whose measured statistics (traces/importance_stats.h) match `targets`
// for a model of `layers` x `kv_heads` at `tokens` reusable tokens. Deterministic.
// `achieved` (optional) receives the statistics measured on the calibration sample.
// `progress` (optional) is called after each of the statistics measured, with (done, total).
struct CalibrationReport {
  std::vector<double> head_jaccard;  // per layer, at targets.retention
  double layer_jaccard = 0;
  double spi_recall = 0;
};
ProceduralParams Calibrate(const ImportanceTargets& targets, int layers, int kv_heads,
                           std::int64_t tokens, std::uint64_t seed,
                           CalibrationReport* achieved = nullptr,
                           const std::function<void(int, int)>& progress = {});

// Mean prefix length the workload produces (for calibration).
double ExpectedPrefixTokens(const WorkloadParams& w);

// Writes a trace to `path`. `params` is the calibrated importance model (ignored when
// targets.importance == "none"). `progress` (optional) is called after each record with
// (records written, records in total). Throws InputError for bad parameters.
struct GenerateSummary {
  std::int64_t records = 0;
  std::uint64_t bytes = 0;
};
GenerateSummary GenerateTrace(const std::string& path, const WorkloadParams& workload,
                              const ModelDescriptor& model, const ImportanceTargets& targets,
                              const ProceduralParams& params,
                              const std::function<void(std::int64_t, std::int64_t)>& progress = {});

// The records GenerateTrace writes, in order, to `sink` (procedural importance from *params,
// none when params is nullptr). Throws InputError for bad parameters.
void GenerateRecords(const WorkloadParams& workload, const ProceduralParams* params,
                     const std::function<void(const TraceRecord&)>& sink);

// Validates workload parameters; throws InputError naming the key.
void ValidateWorkload(const WorkloadParams& w);

}  // namespace kvtier
