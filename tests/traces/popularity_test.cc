// Workloads that hit a target (traces/popularity.h): the GPU hit ratio estimate on cases with a
// known answer, its direction in the popularity spread, and the solver. (Against `kvtier sim`:
// fig21's setup, estimate 0.236 vs simulated 23.7% for fewshot-opt-13b.ini, 0.677 vs 67.2% with
// the solved spread; traces/FORMAT.md.)
#include <gtest/gtest.h>

#include "core/errors.h"
#include "traces/popularity.h"

namespace kvtier {
namespace {

ExperimentOptions Fig21Like() {
  ExperimentOptions o;
  ModelSpec& m = o.model;  // OPT-13B (configs/models/opt-13b.ini)
  m.name = "opt-13b";
  m.family = ModelFamily::kOpt;
  m.layers = 40;
  m.hidden = 5120;
  m.heads = 40;
  m.kv_heads = 40;
  m.head_dim = 128;
  m.dtype_bytes = 2;
  SystemOptions& s = o.system;
  s.schedule = "layerwise";
  s.select = "itf";  // stores probe-key chunks too
  s.itf_options.probe_heads = 3;
  s.cache_policy = "lfu";
  s.cache.gpu_capacity = Bytes(10) << 30;
  s.cache.cpu_capacity = Bytes(32) << 30;
  s.chunk_tokens = 64;
  o.run.prewarm = true;
  o.run.warmup_requests = 20;
  return o;
}

WorkloadParams FewShot13b() {  // configs/workloads/fewshot-opt-13b.ini
  WorkloadParams w;
  w.requests = 200;
  w.seed = 7;
  w.rate = 4;
  w.tasks = 9;
  w.prompts = 48;
  return w;
}

TEST(HitRatio, OnePromptFitsTheGpuAndEveryAccessHits) {
  WorkloadParams w = FewShot13b();
  w.tasks = 1;
  w.prompts = 1;
  const HitRatios h = EstimateHitRatios(w, Fig21Like());  // one ~5K-token prefix: ~4 GiB
  EXPECT_GT(h.accesses, 0);
  EXPECT_DOUBLE_EQ(h.gpu, 1.0);
}

TEST(HitRatio, AGpuSmallerThanAChunkLeavesEveryHitToTheCpu) {
  WorkloadParams w = FewShot13b();
  w.tasks = 1;
  w.prompts = 1;
  ExperimentOptions o = Fig21Like();
  o.system.cache.gpu_capacity = 1 << 20;  // 1 MiB < one chunk of all layers (~52 MB)
  const HitRatios h = EstimateHitRatios(w, o);
  EXPECT_DOUBLE_EQ(h.gpu, 0.0);
  EXPECT_DOUBLE_EQ(h.cpu, 1.0);
}

TEST(HitRatio, FallsAsThePopularitySpreadGrows) {
  WorkloadParams w = FewShot13b();
  double last = 2;
  for (double sd : {0.01, 0.03, 0.1, 0.2, 1.0}) {
    w.popularity_sd = sd;
    const HitRatios h = EstimateHitRatios(w, Fig21Like());
    EXPECT_NEAR(h.gpu + h.cpu + h.ssd, 1.0, 1e-12);
    EXPECT_LE(h.gpu, last + 0.02) << sd;  // steps: a few prompts take most requests
    last = h.gpu;
  }
  EXPECT_LT(last, 0.3);
}

TEST(HitRatio, SolverMeetsTheTargetOrSaysWhyNot) {
  const PopularitySolution s = SolvePopularitySd(FewShot13b(), Fig21Like(), 0.68);
  EXPECT_NEAR(s.achieved.gpu, 0.68, 0.02);
  EXPECT_GT(s.popularity_sd, 0.01);
  EXPECT_LT(s.popularity_sd, 0.1);
  EXPECT_THROW(SolvePopularitySd(FewShot13b(), Fig21Like(), 0.05), InputError);  // sd 2 still gives ~18%
  WorkloadParams rag;
  rag.kind = "rag";
  EXPECT_THROW(SolvePopularitySd(rag, Fig21Like(), 0.5), InputError);
}

}  // namespace
}  // namespace kvtier
