// Golden decode steps on SimGrid (core/decode_engine.h): one request of 128 + 1 prompt tokens and 2
// output tokens through each decode policy on the golden model (1 layer; K or V of one token
// 128 B, so 16-bit K + V 256 B per token; a row, one head's K or V of one token, 32 B) and the
// golden hardware (PCIe 25 GB/s both ways, 10 us per DMA call; CPU gathers 8 GB/s and 100 ns
// per run, the defaults). The step's times are derived by hand from the ops' bytes and the
// link bandwidths; compute times come from the cost model (hand-checked in
// tests/models/cost_model_test.cc) for ops whose shapes are derived here.

#include <gtest/gtest.h>

#include <numeric>

#include "core/pipeline.h"
#include "models/cost_model.h"
#include "sim/sim_executor.h"
#include "tests/sim/sim_testutil.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier::sim {
namespace {

using kvtier::testing::GoldenHw;
using kvtier::testing::GoldenModel;

SystemOptions System(DecodePolicy policy, int residual) {
  SystemOptions s;
  s.schedule = "recompute";
  s.decode.policy = policy;
  s.decode.bits = 2;
  s.decode.group = 64;
  s.decode.residual = residual;
  s.decode.topk = 64;
  s.decode.gpu_memory = Bytes(80) << 30;
  return s;
}

struct DecodeRun {
  MemoryRunLog log;
  Seconds first_token_s = 0;
};

DecodeRun Decode(const SystemOptions& sys) {
  DecodeRun out;
  SimExecutor ex(GoldenModel(), GoldenHw());
  testing::ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
  PipelineOptions po;
  po.system = sys;
  Pipeline p(GoldenModel(), po, &ex, &scores, &out.log);
  Request r;
  r.id = 1;
  r.prefix.resize(128);
  std::iota(r.prefix.begin(), r.prefix.end(), 1);
  r.query_tokens = 1;
  r.output_tokens = 2;
  ex.Run([&] {
    EXPECT_TRUE(p.Run(r).ok());
    while (p.decoding()) EXPECT_TRUE(p.DecodeStep().ok());
    EXPECT_TRUE(p.Finish().ok());
    ex.Drain();
  });
  EXPECT_EQ(out.log.requests.size(), 1u);
  out.first_token_s = out.log.requests.at(0).end_s;
  return out;
}

// One layer of a decode step as the engine must shape it.
Seconds Layer(DecodePart part, std::int64_t rows, std::int64_t pairs, Bytes read, Bytes write) {
  ComputeOp op;
  op.kind = ComputeKind::kDecodeStep;
  op.layer = 0;
  op.decode_part = part;
  op.new_tokens = rows;
  op.context_tokens = pairs;
  op.kv_read_bytes = read;
  op.kv_write_bytes = write;
  return ComputeSeconds(GoldenModel(), GoldenHw(), op);
}
Seconds Output(std::int64_t rows) {
  ComputeOp op;
  op.kind = ComputeKind::kOutputLayer;
  op.new_tokens = rows;
  op.context_tokens = 1;
  return ComputeSeconds(GoldenModel(), GoldenHw(), op);
}

// The request's KV offloaded at join: 129 tokens * 256 B = 33,024 B, one DMA for the one
// layer: (33,024 + 10 us * 25e9) / 25e9 = 11.32096 us.
constexpr Seconds kJoinOffload = 11.32096e-6;
// The top-64 pairs of 4 KV heads, K and V: 512 rows of 32 B = 16,384 B, scattered (one run
// each). staged_gather: the CPU gathers them, (16,384 + 512 * 100 ns * 8e9) / 8e9 =
// 53.248 us, then one DMA per kind: (16,384 + 2 * 10 us * 25e9) / 25e9 = 20.65536 us.
constexpr Seconds kTopK = 53.248e-6 + 20.65536e-6;

void ExpectRequest(const DecodeRun& r, Seconds end) {
  ASSERT_EQ(r.log.decode_requests.size(), 1u);
  const DecodeRequestRecord& d = r.log.decode_requests[0];
  EXPECT_EQ(d.output_tokens, 2);
  EXPECT_NEAR(d.end_s, end, 1e-12);
  EXPECT_NEAR(d.tpot_s, end - r.first_token_s, 1e-12);  // one token after the first
}

// 16-bit KV on the GPU: the token attends 130 positions (129 cached and itself), reading
// 130 * 256 = 33,280 B and writing its 256 B; then the LM head. No transfer.
TEST(SimDecodeGolden, FullGpuStep) {
  const DecodeRun r = Decode(System(DecodePolicy::kFullGpu, 64));
  ASSERT_EQ(r.log.decode_steps.size(), 1u);
  const DecodeStepRecord& s = r.log.decode_steps[0];
  const Seconds step = Layer(DecodePart::kWhole, 1, 130, 33280, 256) + Output(1);
  EXPECT_NEAR(s.start_s, r.first_token_s, 1e-15);
  EXPECT_NEAR(s.end_s - s.start_s, step, 1e-12);
  EXPECT_NEAR(s.stall_s, 0, 1e-12);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.tokens, 1);
  EXPECT_EQ(s.h2d_bytes, 0u);
  EXPECT_EQ(s.d2h_bytes, 0u);
  EXPECT_EQ(s.gpu_bytes, 131u * 256);  // its peak: 129 + 2 positions
  ExpectRequest(r, s.end_s);
}

// KIVI 2 bits, g = 64, R = 128: 40 B per token (4 heads * 16 * 2 kinds * (2/8 + 4/64)); of 130
// positions 2 are codes and 128 16-bit: 2 * 40 + 128 * 256 = 32,848 B read.
TEST(SimDecodeGolden, KiviStep) {
  const DecodeRun r = Decode(System(DecodePolicy::kKivi, 128));
  ASSERT_EQ(r.log.decode_steps.size(), 1u);
  const DecodeStepRecord& s = r.log.decode_steps[0];
  EXPECT_NEAR(s.end_s - s.start_s, Layer(DecodePart::kWhole, 1, 130, 32848, 256) + Output(1),
              1e-12);
  EXPECT_NEAR(s.stall_s, 0, 1e-12);
  EXPECT_EQ(s.h2d_bytes, 0u);
  ExpectRequest(r, s.end_s);
}

// offload_all: the 129 cached tokens' K and V stream in (33,024 B, 2 DMA calls: (33,024 + 2 *
// 10 us * 25e9) / 25e9 = 21.32096 us) after the join's offload put them in CPU memory
// (11.32096 us from the first token): the layer waits 32.64192 us.
TEST(SimDecodeGolden, OffloadAllStep) {
  const DecodeRun r = Decode(System(DecodePolicy::kOffloadAll, 64));
  ASSERT_EQ(r.log.decode_steps.size(), 1u);
  const DecodeStepRecord& s = r.log.decode_steps[0];
  const Seconds wait = kJoinOffload + 21.32096e-6;
  EXPECT_NEAR(s.start_s, r.first_token_s, 1e-15);
  EXPECT_NEAR(s.end_s - s.start_s, wait + Layer(DecodePart::kWhole, 1, 130, 33280, 256) + Output(1),
              1e-12);
  EXPECT_NEAR(s.stall_s, wait, 1e-12);
  EXPECT_EQ(s.h2d_bytes, 33024u);
  EXPECT_EQ(s.d2h_bytes, 256u);  // the new token's K and V
  ExpectRequest(r, s.end_s);
}

// specache (2 bits, g = 64, R = 64, k = 64): of 130 positions 66 are codes (40 B) and 64 in
// 16 bits: 2,640 + 16,384 = 19,024 B. Step 0 is the pre-decoding step (one row, no token); the
// prefetch of step 1's pairs starts when its layer ends (kTopK after). Step 1 decodes two rows
// (the output token over 130 positions, the speculative one over 131: 261 pairs) reading the
// codes and the 64 fetched pairs (16,384 B): 35,408 B; it waits for the prefetch.
TEST(SimDecodeGolden, SpeCacheSteps) {
  const DecodeRun r = Decode(System(DecodePolicy::kSpeCache, 64));
  ASSERT_EQ(r.log.decode_steps.size(), 2u);
  const DecodeStepRecord& s0 = r.log.decode_steps[0];
  const DecodeStepRecord& s1 = r.log.decode_steps[1];
  const Seconds c0 = Layer(DecodePart::kWhole, 1, 130, 19024, 256);
  EXPECT_NEAR(s0.start_s, r.first_token_s, 1e-15);
  EXPECT_NEAR(s0.end_s - s0.start_s, c0 + Output(1), 1e-12);
  EXPECT_EQ(s0.tokens, 0);
  EXPECT_EQ(s0.rows, 1);
  EXPECT_EQ(s0.h2d_bytes, 16384u);
  ASSERT_GT(c0, kJoinOffload);  // the prompt is in CPU memory before the prefetch starts
  const Seconds prefetched = r.first_token_s + c0 + kTopK;
  EXPECT_NEAR(s1.start_s, s0.end_s, 1e-15);
  EXPECT_NEAR(s1.stall_s, prefetched - s1.start_s, 1e-12);
  EXPECT_NEAR(s1.end_s, prefetched + Layer(DecodePart::kWhole, 2, 261, 35408, 256) + Output(2),
              1e-12);
  EXPECT_EQ(s1.tokens, 1);
  EXPECT_EQ(s1.rows, 2);
  EXPECT_EQ(s1.h2d_bytes, 0u);  // nothing decodes after it
  ExpectRequest(r, s1.end_s);
}

// specache_nospec: the scores (one row, the keys' codes: 19,024 / 2 = 9,512 B), then the fetch
// of their top-64 (kTopK), then the attention with the pairs (35,408 B) and the LM head.
TEST(SimDecodeGolden, SpeCacheNoSpecStep) {
  const DecodeRun r = Decode(System(DecodePolicy::kSpeCacheNoSpec, 64));
  ASSERT_EQ(r.log.decode_steps.size(), 1u);
  const DecodeStepRecord& s = r.log.decode_steps[0];
  const Seconds scores = Layer(DecodePart::kScores, 1, 130, 9512, 0);
  ASSERT_GT(scores, kJoinOffload);
  EXPECT_NEAR(s.end_s - s.start_s,
              scores + kTopK + Layer(DecodePart::kAttend, 1, 130, 35408, 256) + Output(1), 1e-12);
  EXPECT_NEAR(s.stall_s, kTopK, 1e-12);
  EXPECT_EQ(s.h2d_bytes, 16384u);
  EXPECT_EQ(s.d2h_bytes, 256u);
  ExpectRequest(r, s.end_s);
}

}  // namespace
}  // namespace kvtier::sim
