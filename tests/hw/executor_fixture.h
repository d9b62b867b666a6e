#pragma once
// Helpers shared by the HwExecutor tests (host and cuda backends): a tiny model, systems,
// requests, executor options on a scratch directory, and one pipeline run on the real disk.

#include "hw/hw_executor.h"
#include <gtest/gtest.h>
#include "core/pipeline.h"
#include "hw/arena.h"
#include "hw/chunk_store.h"
#include "tests/hw/hw_test_util.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"
#include "tests/testutil/tiny_model.h"

namespace kvtier::hw::fixture {

using kvtier::testing::Agreeing;
using kvtier::testing::FakeExecutor;
using kvtier::testing::ScriptedScores;
// K (or V) of one token in one layer: 32 B; a 4-token chunk 128 B.
using kvtier::testing::TinyModel;
using testing::ScratchDir;

inline SystemOptions System(const std::string& name, Bytes gpu, Bytes cpu) {
  SystemOptions s;
  s.name = name;
  s.chunk_tokens = 4;
  s.retention = 0.25;
  s.itf_options.retention = 0.25;
  s.itf_options.probe_heads = 3;
  s.cache.gpu_capacity = gpu;
  s.cache.cpu_capacity = cpu;
  if (name == "recomp") s.schedule = "recompute";
  if (name == "as") s.prefetch = PrefetchMode::kLayer;
  if (name == "as_h2o_lfu") {
    s.select = "h2o";
    s.prefetch = PrefetchMode::kLayer;
    s.cache_policy = "lfu";
  }
  if (name == "spec") {
    s.select = "itf";
    s.reorder = true;
    s.cache_policy = "score";
    s.prefetch = PrefetchMode::kLayer;
  }
  if (name == "cake") {
    s.schedule = "cake";
    s.cake_chunk_tokens = 8;
  }
  if (name == "spec_cake") {
    s.schedule = "cake";
    s.select = "history";
    s.cache_policy = "score";
    s.cake_chunk_tokens = 8;
  }
  return s;
}

// A few requests sharing prefixes: the first stores, the later ones reuse (and extend) it.
inline std::vector<Request> Requests() {
  return kvtier::testing::PrefixRequests({40, 60, 60, 48, 60});
}

inline HwExecutorOptions Options(const std::string& dir, const SystemOptions& s) {
  HwExecutorOptions o;
  o.backend = BackendKind::kHost;
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

inline HwRun RunOnHw(const SystemOptions& system, const std::string& dir) {
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

}  // namespace kvtier::hw::fixture
