// HwExecutor on the cuda backend (label gpu; skips without a device). Helpers as in
// hw_executor_test.cc. HwExecutor on the host backend with the real disk (a scratch directory, O_DIRECT): the
// Pipeline end to end with every chunk read checked byte for byte, dependency order in the
// logged transfers, errors that name the chunk, and parity of decisions with FakeExecutor.

#include "hw/hw_executor.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/pipeline.h"
#include "hw/arena.h"
#include "hw/chunk_store.h"
#include "tests/hw/hw_test_util.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier::hw {
namespace {

using kvtier::testing::FakeExecutor;
using kvtier::testing::ScriptedScores;
using testing::ScratchDir;

ModelSpec TinyModel() {
  ModelSpec m;
  m.name = "tiny";
  m.family = ModelFamily::kLlama;
  m.layers = 3;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 4;
  m.ffn = 32;
  m.vocab = 100;
  m.dtype_bytes = 2;
  m.max_context = 4096;
  return m;  // K (or V) of one token in one layer: 32 B; a 4-token chunk 128 B
}

SystemOptions System(const std::string& name, Bytes gpu, Bytes cpu) {
  SystemOptions s;
  s.name = name;
  s.chunk_tokens = 4;
  s.retention = 0.25;
  s.itf_options.retention = 0.25;
  s.itf_options.probe_heads = 3;
  s.cache.gpu_capacity = gpu;
  s.cache.cpu_capacity = cpu;
  if (name == "recomp") s.reuse = false;
  if (name == "as") s.prefetch = PrefetchMode::kLayer;
  if (name == "as_h2o_lfu") {
    s.select = SelectPolicy::kH2o;
    s.prefetch = PrefetchMode::kLayer;
    s.cache_policy = "lfu";
  }
  if (name == "spec") {
    s.select = SelectPolicy::kH2o;
    s.itf = true;
    s.reorder = true;
    s.cache_policy = "score";
    s.prefetch = PrefetchMode::kLayer;
  }
  if (name == "cake") {
    s.prefetch = PrefetchMode::kCake;
    s.cake_chunk_tokens = 8;
  }
  return s;
}

// A few requests sharing prefixes: the first stores, the later ones reuse (and extend) it.
std::vector<Request> Requests() {
  std::vector<Request> out;
  const std::int64_t lengths[] = {40, 60, 60, 48, 60};
  for (int i = 0; i < 5; ++i) {
    Request r;
    r.id = RequestId(i + 1);
    r.prefix.resize(std::size_t(lengths[i]));
    std::iota(r.prefix.begin(), r.prefix.end(), 1000);
    r.query_tokens = 6;
    out.push_back(r);
  }
  return out;
}

float Agreeing(const Request&, int layer, int, std::int64_t t) { return float((t * 7 + layer) % 13); }

HwExecutorOptions Options(const std::string& dir, const SystemOptions& s) {
  HwExecutorOptions o;
  o.backend = DeviceBackend::kHost;
  o.store_dir = dir;
  o.store_capacity = 64ull << 20;
  o.max_memory = 64ull << 20;
  o.verify = true;
  o.chunk_tokens = s.chunk_tokens;
  o.probe_heads = s.itf_options.probe_heads;
  o.cpu_capacity = s.cache.cpu_capacity;
  o.gpu_capacity = s.cache.gpu_capacity;
  return o;
}

struct HwRun {
  MemoryRunLog log;
  HwExecutorStats stats;
  std::vector<Status> statuses;
};

HwRun RunOnHw(const SystemOptions& system, const std::string& dir) {
  HwRun run;
  std::unique_ptr<HwExecutor> ex;
  Status s = HwExecutor::Create(TinyModel(), HardwareOptions{}, Options(dir, system), &ex);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return run;
  ScriptedScores scores(Agreeing);
  PipelineOptions po;
  po.system = system;
  Pipeline pipeline(TinyModel(), po, ex.get(), &scores, &run.log);
  for (const Request& r : Requests()) run.statuses.push_back(pipeline.Run(r));
  pipeline.Finish();
  ex->Drain();
  run.stats = ex->stats();
  return run;
}

TEST(HwExecutorGpu, CudaBackendRunsThePipeline) {
  if (!CudaDevicePresent()) GTEST_SKIP() << "no CUDA device";
  ScratchDir dir;
  SystemOptions sys = System("as", 1024, 4096);
  HwExecutorOptions o = Options(dir.path(), sys);
  o.backend = DeviceBackend::kCuda;
  std::unique_ptr<HwExecutor> ex;
  Status s = HwExecutor::Create(TinyModel(), HardwareOptions{}, o, &ex);
  ASSERT_TRUE(s.ok()) << s.ToString();
  MemoryRunLog log;
  ScriptedScores scores(Agreeing);
  PipelineOptions po;
  po.system = sys;
  Pipeline pipeline(TinyModel(), po, ex.get(), &scores, &log);
  for (const Request& r : Requests()) ASSERT_TRUE(pipeline.Run(r).ok());
  pipeline.Finish();
  EXPECT_EQ(ex->stats().chunks_verified, ex->stats().chunks_read);
  for (const LayerRecord& l : log.layers) EXPECT_GE(l.stall_s, 0.0);
}

}  // namespace
}  // namespace kvtier::hw
