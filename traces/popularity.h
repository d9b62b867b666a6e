#pragma once
// Workloads that hit a target: the GPU hit ratio a cache policy reaches on a generated request
// stream, and the few-shot popularity spread (`popularity_sd`) that gives a target ratio.
//
// EstimateHitRatios replays the stream through core's RadixTree and TieredCache with the
// experiment's policy, capacities, chunk size, pre-warming and warm-up, as the Pipeline does
// for its demand accesses (core/pipeline.cc), with one simplification that makes it fast: the
// chunks of one (segment, chunk index) in every layer and KV kind are accessed together by every
// request that reuses them, so they are one cache entry of their summed bytes here (their
// access counts, and so their LFU/LRU priorities, are equal). Every chunk of the reused prefix
// is accessed once per request (at chunk 64 and retention 0.25 a layer's selection touches
// every chunk). The estimate is checked against `kvtier sim` in tests/traces/popularity_test.cc
// and docs/paper-comparison.md reports both.
//
// SolvePopularitySd bisects popularity_sd (the hit ratio falls as the spread grows).

#include <cstdint>

#include "core/model_spec.h"
#include "core/options.h"
#include "traces/generator.h"

namespace kvtier {

struct HitRatios {
  std::int64_t accesses = 0;  // chunk accesses counted (requests after the warm-up), all layers
  double gpu = 0, cpu = 0, ssd = 0;
};

// REQUIRES: options.system's schedule reuses KV (not recompute); the workload is valid.
HitRatios EstimateHitRatios(const WorkloadParams& workload, const ExperimentOptions& options);

struct PopularitySolution {
  double popularity_sd = 0;
  HitRatios achieved;
  int iterations = 0;
};

// Throws InputError when the target is outside what [lo, hi] reaches (naming both ends' ratios).
PopularitySolution SolvePopularitySd(WorkloadParams workload, const ExperimentOptions& options,
                                     double target_gpu_hit_ratio, double lo = 0.002,
                                     double hi = 2.0, int iterations = 24);

}  // namespace kvtier
