// The decode engine (core/decode_engine.h) over FakeExecutor: footprints and the batch limit a GPU
// memory budget gives, the speculative prefetch's overlap (specache) against the fetch after
// the step's own scores (specache_nospec), and a system without decode left as it was.

#include "core/decode_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/pipeline.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"
#include "tests/testutil/tiny_model.h"

namespace kvtier {
namespace {

using testing::FakeExecutor;
using testing::FakeExecutorOptions;
using testing::ScriptedScores;

// 4 layers; K (or V) of one token in one layer: 2 KV heads * 16 * 2 B = 64 B, so 16-bit K + V
// is 128 B per token and layer.
ModelSpec TinyModel() {
  ModelSpec m = testing::TinyModel(4);
  m.hidden = 64;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.ffn = 128;
  return m;
}

Request MakeRequest(RequestId id, std::int64_t prefix, std::int64_t outputs, Seconds arrival = 0) {
  Request r;
  r.id = id;
  r.arrival_s = arrival;
  r.prefix.resize(std::size_t(prefix));
  std::iota(r.prefix.begin(), r.prefix.end(), std::uint64_t(id) * 100000);
  r.query_tokens = 4;
  r.output_tokens = outputs;
  return r;
}

SystemOptions DecodingSystem(DecodePolicy policy) {
  SystemOptions s;
  s.schedule = "recompute";
  s.decode.policy = policy;
  s.decode.bits = 2;
  s.decode.group = 16;
  s.decode.residual = 8;
  s.decode.topk = 4;
  s.decode.gpu_memory = Bytes(1) << 30;
  return s;
}

struct Served {
  MemoryRunLog log;
  std::vector<FakeExecutor::Submitted> history;
  Status status;
  long long served = 0;
};

Served Serve(const SystemOptions& system, const std::vector<Request>& requests,
             FakeExecutorOptions eo = {}) {
  Served out;
  FakeExecutor ex(std::move(eo));
  ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
  PipelineOptions po;
  po.system = system;
  Pipeline p(TinyModel(), po, &ex, &scores, &out.log);
  std::size_t next = 0;
  out.status = ServeWithDecode(
      p, ex,
      [&](bool* warmup) -> const Request* {
        *warmup = false;
        return next < requests.size() ? &requests[next++] : nullptr;
      },
      [&](const Request&, bool, const Status& st) { EXPECT_TRUE(st.ok()) << st.ToString(); },
      &out.served);
  ex.Drain();
  out.history = ex.history();
  return out;
}

TEST(Decode, FootprintsByHand) {
  const ModelSpec m = TinyModel();
  DecodeBatchOptions o = DecodingSystem(DecodePolicy::kFullGpu).decode;
  // 16-bit: 100 positions * 128 B per layer.
  EXPECT_DOUBLE_EQ(DecodeLayerKvBytes(m, o, 100), 12800.0);
  // KIVI 2 bits, g = 16: 64 elements per token and layer * (2/8 + 4/16) B = 32 B.
  EXPECT_DOUBLE_EQ(LowBitBytesPerTokenLayer(m, 2, 16), 32.0);
  EXPECT_DOUBLE_EQ(LowBitBytesPerTokenLayer(m, 1, 16), 24.0);
  o.policy = DecodePolicy::kKivi;  // 92 low-bit positions + the residual 8 in 16 bits
  EXPECT_DOUBLE_EQ(DecodeLayerKvBytes(m, o, 100), 92 * 32.0 + 8 * 128.0);
  o.policy = DecodePolicy::kSpeCache;  // and 4 fetched positions (of both K and V) in 16 bits
  EXPECT_DOUBLE_EQ(DecodeLayerKvBytes(m, o, 100), 92 * 32.0 + 8 * 128.0 + 4 * 128.0);
  EXPECT_DOUBLE_EQ(DecodeLayerKvBytes(m, o, 5), 5 * 128.0);  // all in the residual window
  o.policy = DecodePolicy::kOffloadAll;  // one layer's buffer
  EXPECT_DOUBLE_EQ(DecodeLayerKvBytes(m, o, 100), 12800.0);
}

// full_gpu: each request of 60 + 4 prompt tokens and 4 output tokens holds 4 layers * 68
// positions * 128 B = 34,816 B at its peak. A budget of 3.5 of them beside the weights lets 3
// decode at once; decode.max_batch = 2 lets 2.
TEST(Decode, BatchLimitFromGpuMemory) {
  const ModelSpec m = TinyModel();
  SystemOptions sys = DecodingSystem(DecodePolicy::kFullGpu);
  const Bytes footprint = 4 * 68 * 128;
  sys.decode.gpu_memory = m.WeightBytes() + footprint * 7 / 2;
  std::vector<Request> reqs;
  for (RequestId i = 1; i <= 6; ++i) reqs.push_back(MakeRequest(i, 60, 4));
  {
    FakeExecutor ex({});
    ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
    MemoryRunLog log;
    PipelineOptions po;
    po.system = sys;
    Pipeline p(m, po, &ex, &scores, &log);
    ASSERT_NE(p.decode_engine(), nullptr);
    EXPECT_EQ(p.decode_engine()->Footprint(reqs[0]), footprint);
    EXPECT_DOUBLE_EQ(p.decode_engine()->Budget(), double(footprint) * 3.5);
  }
  const Served s = Serve(sys, reqs);
  ASSERT_TRUE(s.status.ok()) << s.status.ToString();
  EXPECT_EQ(s.served, 6);
  int max_batch = 0;
  for (const DecodeStepRecord& st : s.log.decode_steps) {
    max_batch = std::max(max_batch, st.batch);
    EXPECT_LE(st.gpu_bytes, footprint * 7 / 2);
  }
  EXPECT_EQ(max_batch, 3);
  // All arrive at 0: three prefill, then decode 3 steps (3 tokens each after the first);
  // then the other three. 6 steps of 3.
  ASSERT_EQ(s.log.decode_steps.size(), 6u);
  EXPECT_EQ(s.log.decode_steps[0].batch, 3);
  EXPECT_EQ(s.log.decode_steps[3].batch, 3);
  ASSERT_EQ(s.log.decode_requests.size(), 6u);
  for (const DecodeRequestRecord& d : s.log.decode_requests) {
    EXPECT_EQ(d.output_tokens, 4);
    EXPECT_EQ(d.steps, 3);
    EXPECT_NEAR(d.tpot_s, (d.end_s - d.first_token_s) / 3, 1e-15);
  }
  sys.decode.max_batch = 2;
  const Served two = Serve(sys, reqs);
  int max2 = 0;
  for (const DecodeStepRecord& st : two.log.decode_steps) max2 = std::max(max2, st.batch);
  EXPECT_EQ(max2, 2);
  EXPECT_EQ(two.log.decode_requests.size(), 6u);
}

TEST(Decode, ARequestThatCannotFitFailsTheRun) {
  SystemOptions sys = DecodingSystem(DecodePolicy::kFullGpu);
  sys.decode.gpu_memory = TinyModel().WeightBytes() + 1000;
  const Served s = [&] {
    Served out;
    FakeExecutor ex({});
    ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
    PipelineOptions po;
    po.system = sys;
    Pipeline p(TinyModel(), po, &ex, &scores, &out.log);
    out.status = p.Run(MakeRequest(1, 60, 4));
    return out;
  }();
  ASSERT_EQ(s.status.code(), Status::Code::kOutOfSpace);
  EXPECT_NE(s.status.message().find("decode: request 1 (64 prompt + 4 output tokens) needs 34816 B"),
            std::string::npos)
      << s.status.ToString();
  ASSERT_EQ(s.log.requests.size(), 1u);
  EXPECT_EQ(s.log.requests[0].status, s.status.ToString());
}

// The speculative overlap (SpeCache §3.3, Table 4). specache: during step t, the prefetch of
// step t+1's pairs of layer l is submitted with the step and starts when layer l's compute
// ends, before step t's computes end; step t+1's layer l waits for it. specache_nospec: no
// prefetch; each fetch is submitted in its own step (after the previous step ended) and starts
// after that step's scores of its layer.
TEST(Decode, SpeCacheSubmitsTheNextStepsPrefetchBeforeTheStepEnds) {
  FakeExecutorOptions eo;
  eo.compute_s = 1e-3;
  eo.h2d_bw = 16e6;  // a layer's pairs (3 sequences * 4 * 2 heads * 2 kinds * 32 B) in 0.1 ms
  std::vector<Request> reqs;
  for (RequestId i = 1; i <= 3; ++i) reqs.push_back(MakeRequest(i, 60, 5));
  struct StepOps {
    std::vector<const FakeExecutor::Submitted*> computes, prefetches, fetches;
    const FakeExecutor::Submitted* output = nullptr;
  };
  // Splits the decode ops by step: a step ends with its output layer.
  auto steps_of = [](const Served& s) {
    std::vector<StepOps> steps(1);
    bool decoding = false;
    for (const auto& op : s.history) {
      if (!op.is_transfer && op.compute.kind == ComputeKind::kDecodeStep) decoding = true;
      if (!decoding) continue;
      if (op.is_transfer) {
        if (op.transfer.purpose == Purpose::kDecodePrefetch && op.transfer.kind == TransferKind::kH2D) {
          steps.back().prefetches.push_back(&op);
        }
        if (op.transfer.purpose == Purpose::kDecodeFetch && op.transfer.kind == TransferKind::kH2D) {
          steps.back().fetches.push_back(&op);
        }
      } else if (op.compute.kind == ComputeKind::kOutputLayer) {
        steps.back().output = &op;
        steps.emplace_back();
        decoding = false;
      } else {
        steps.back().computes.push_back(&op);
      }
    }
    steps.pop_back();
    return steps;
  };

  const Served spec = Serve(DecodingSystem(DecodePolicy::kSpeCache), reqs, eo);
  ASSERT_TRUE(spec.status.ok()) << spec.status.ToString();
  const std::vector<StepOps> s = steps_of(spec);
  ASSERT_EQ(s.size(), 5u);  // the pre-decoding step and 4 tokens
  for (std::size_t t = 0; t + 1 < s.size(); ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    ASSERT_EQ(s[t].prefetches.size(), 4u);  // one per layer, for step t+1
    ASSERT_EQ(s[t].computes.size(), 4u);
    for (int l = 0; l < 4; ++l) {
      const auto* pf = s[t].prefetches[std::size_t(l)];
      EXPECT_EQ(pf->transfer.layer, l);
      // Submitted with step t and running before step t's computes end.
      EXPECT_LT(pf->times.submit_s, s[t].output->times.end_s);
      EXPECT_LT(pf->times.start_s, s[t].output->times.end_s);
      EXPECT_GE(pf->times.start_s, s[t].computes[std::size_t(l)]->times.end_s);
      // Step t+1's layer l reads the pairs.
      EXPECT_GE(s[t + 1].computes[std::size_t(l)]->times.start_s, pf->times.end_s);
    }
    EXPECT_TRUE(s[t].fetches.empty());
  }
  EXPECT_TRUE(s.back().prefetches.empty());  // nothing decodes after the last step

  const Served nospec = Serve(DecodingSystem(DecodePolicy::kSpeCacheNoSpec), reqs, eo);
  ASSERT_TRUE(nospec.status.ok()) << nospec.status.ToString();
  const std::vector<StepOps> n = steps_of(nospec);
  ASSERT_EQ(n.size(), 4u);  // no pre-decoding step
  for (std::size_t t = 0; t < n.size(); ++t) {
    SCOPED_TRACE("nospec step " + std::to_string(t));
    EXPECT_TRUE(n[t].prefetches.empty());
    ASSERT_EQ(n[t].fetches.size(), 4u);
    ASSERT_EQ(n[t].computes.size(), 8u);  // scores and attend per layer
    for (int l = 0; l < 4; ++l) {
      const auto* f = n[t].fetches[std::size_t(l)];
      if (t > 0) {  // not before the previous step ended
        EXPECT_GE(f->times.submit_s, n[t - 1].output->times.end_s);
        EXPECT_GE(f->times.start_s, n[t - 1].output->times.end_s);
      }
      const auto* scores = n[t].computes[std::size_t(2 * l)];
      const auto* attend = n[t].computes[std::size_t(2 * l + 1)];
      EXPECT_EQ(scores->compute.decode_part, DecodePart::kScores);
      EXPECT_EQ(attend->compute.decode_part, DecodePart::kAttend);
      EXPECT_GE(f->times.start_s, scores->times.end_s);
      EXPECT_GE(attend->times.start_s, f->times.end_s);
    }
  }
  // Stalls: a non-speculative step waits for each layer's fetch (1,536 B at 16 MB/s: 96 us,
  // plus its gather); the speculative steps after the first overlap theirs with compute.
  double spec_stall = 0, nospec_stall = 0;
  for (std::size_t t = 1; t < spec.log.decode_steps.size(); ++t) {
    spec_stall += spec.log.decode_steps[t].stall_s;
  }
  for (const DecodeStepRecord& st : nospec.log.decode_steps) nospec_stall += st.stall_s;
  EXPECT_NEAR(spec_stall, 0, 1e-12);
  EXPECT_GT(nospec_stall, 4 * 4 * 0.9e-4);
}

// A decode transfer that fails fails the run, named as the pipeline names a request's failed
// op (core/executor.h "Failure"): its own error, not the aborted computes after it.
TEST(Decode, AFailedPrefetchFailsTheRun) {
  FakeExecutorOptions eo;
  testing::FakeFailure f;
  f.transfer = TransferKind::kH2D;
  f.purpose = Purpose::kDecodePrefetch;
  f.layer = 2;
  eo.failures.push_back(f);
  std::vector<Request> reqs;
  for (RequestId i = 1; i <= 2; ++i) reqs.push_back(MakeRequest(i, 60, 5));
  const Served s = Serve(DecodingSystem(DecodePolicy::kSpeCache), reqs, eo);
  ASSERT_EQ(s.status.code(), Status::Code::kIoError) << s.status.ToString();
  EXPECT_NE(s.status.message().find("h2d (decode_prefetch, request 0, layer 2)"),
            std::string::npos)
      << s.status.ToString();
  int failed = 0, aborted = 0;
  for (const TransferRecord& t : s.log.transfers) {
    failed += t.outcome == TransferOutcome::kFailed;
    aborted += t.outcome == TransferOutcome::kAborted;
  }
  EXPECT_EQ(failed, 1);
  EXPECT_GT(aborted, 0);              // the prefetches of the aborted layers after it
  EXPECT_TRUE(s.log.decode_requests.empty());  // nobody finished: the run stopped there
}

// Without decode.policy nothing changes: no decode engine, CanAdmit is true, no decode rows.
TEST(Decode, OffByDefault) {
  SystemOptions sys;
  sys.schedule = "recompute";
  FakeExecutor ex({});
  ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
  MemoryRunLog log;
  PipelineOptions po;
  po.system = sys;
  Pipeline p(TinyModel(), po, &ex, &scores, &log);
  EXPECT_FALSE(p.decodes());
  const Request r = MakeRequest(1, 60, 100);
  EXPECT_TRUE(p.CanAdmit(r));
  ASSERT_TRUE(p.Run(r).ok());
  EXPECT_FALSE(p.decoding());
  ASSERT_TRUE(p.Finish().ok());
  EXPECT_TRUE(log.decode_steps.empty());
  EXPECT_TRUE(log.decode_requests.empty());
  for (const auto& [name, value] : log.metrics) EXPECT_EQ(name.find("decode"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
