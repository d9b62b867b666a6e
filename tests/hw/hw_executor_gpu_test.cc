// HwExecutor on the cuda backend (label gpu; skips without a device): the Pipeline end to end
// with the helpers of tests/hw/executor_fixture.h.

#include "hw/hw_executor.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/pipeline.h"
#include "hw/arena.h"
#include "hw/device_backend.h"
#include "hw/chunk_store.h"
#include "tests/hw/executor_fixture.h"
#include "tests/hw/hw_test_util.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier::hw {
namespace {

using namespace kvtier::hw::fixture;  // NOLINT: test helpers
using kvtier::testing::ScriptedScores;
using testing::ScratchDir;

TEST(HwExecutorGpu, CudaBackendRunsThePipeline) {
  if (!CudaDevicePresent()) GTEST_SKIP() << "no CUDA device";
  ScratchDir dir;
  SystemOptions sys = System("as", 1024, 4096);
  HwExecutorOptions o = Options(dir.path(), sys);
  o.backend = BackendKind::kCuda;
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
