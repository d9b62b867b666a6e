// Cake on the hw executor (host backend, real disk): what Cake's loads must move.
//
// Guards the RunCake drift of issue 13: Cake's load submission in core/pipeline.cc was a copy
// of the layer-wise one that never submitted the CPU gather of partly needed chunks and dropped
// the chunk lists of promotions and demotions (now every schedule submits through the one
// LoadPlanner, core/load_planner.h). In sim only byte totals matter, so nothing
// showed; in hw a partly needed chunk's rows were copied to the GPU without a gather, and the
// promoted and demoted chunks never moved (a bytes-only copy between the staging rings). These
// tests look at what the executor did (HwExecutorStats), not at the Pipeline's plan.

#include <gtest/gtest.h>

#include "core/pipeline.h"
#include "hw/hw_executor.h"
#include "tests/hw/executor_fixture.h"
#include "tests/hw/hw_test_util.h"

namespace kvtier::hw {
namespace {

using namespace kvtier::hw::fixture;  // NOLINT: test helpers
using testing::ScratchDir;

// Cake with 6-token compute/load chunks over 4-token stored chunks: a Cake chunk [6c, 6c + 6)
// covers one stored chunk whole and another one half, so Cake loads partly needed chunks.
SystemOptions CakeSixOverFour(Bytes gpu, Bytes cpu) {
  SystemOptions s = System("cake", gpu, cpu);
  s.cake_chunk_tokens = 6;
  return s;
}

int Count(const MemoryRunLog& log, const char* decision) {
  int n = 0;
  for (const DecisionRecord& d : log.decisions) n += d.kind == decision ? 1 : 0;
  return n;
}

// No caches: every chunk Cake loads comes from the SSD. Request 3 (60 tokens, the same prefix as
// request 2) reuses all 60 stored tokens; Cake's I/O starts at its last chunk, tokens 54-59,
// which needs rows 2-3 of the stored chunk of tokens 52-55: a partly needed chunk read from the
// SSD, so its rows must be gathered before the H2D -- 2 rows x 32 B (K or V of one token in
// one layer of the tiny model) x 2 kinds x 3 layers = 384 B at least.
TEST(HwCake, PartlyNeededChunksAreGathered) {
  ScratchDir dir;
  const HwRun run = RunOnHw(CakeSixOverFour(0, 0), dir.path());
  for (const Status& s : run.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(run.stats.chunks_read, 0u);
  EXPECT_GE(run.stats.bytes_gathered, 384u);
  // Everything a gather moved is what the Pipeline planned to gather.
  Bytes planned = 0;
  for (const TransferRecord& t : run.log.transfers) {
    if (t.kind == TransferKind::kCpuGather) planned += t.bytes;
  }
  EXPECT_EQ(run.stats.bytes_gathered, planned);
}

// A GPU cache of 8 chunks and a CPU cache of 32 under LRU: Cake's loads admit chunks to the GPU,
// whose victims are demoted to the CPU, and later requests find chunks in the CPU cache and
// promote them. Each demotion the caches decide must copy that chunk out of its GPU slot, and
// each promotion copy must move the chunks it promotes.
TEST(HwCake, PromotedAndDemotedChunksMove) {
  ScratchDir dir;
  const HwRun run = RunOnHw(CakeSixOverFour(8 * 128, 32 * 128), dir.path());
  for (const Status& s : run.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  const int demotions = Count(run.log, "demote");
  int promote_copies = 0;
  for (const TransferRecord& t : run.log.transfers) {
    if (t.purpose == Purpose::kPromote && t.bytes > 0) ++promote_copies;
  }
  ASSERT_GT(demotions, 0) << "the scenario must demote";
  ASSERT_GT(promote_copies, 0) << "the scenario must promote part of a chunk";
  EXPECT_EQ(run.stats.demoted_chunks, std::uint64_t(demotions));
  EXPECT_GE(run.stats.promoted_chunks, std::uint64_t(promote_copies));
}

}  // namespace
}  // namespace kvtier::hw
