// Decode in hw (issue 17's hw half) at batch size 1: a decode trace through the Pipeline on the
// host backend and on the simulator,
//   1. the simulator was given the same ops as hw, one by one in submission order: every
//      transfer (kind, purpose, layer, method, staged, ios, descriptors, bytes) and every
//      compute (kind, layer, decode part, rows, pairs, KV bytes read and written), for every
//      decode policy and, for the policies that fetch top-k rows, every transfer strategy;
//   2. hw did what each op says: per transfer op, the calls the host backend was asked to make
//      (DMA calls of a Copy, one batched call with `descriptors` descriptors, one device gather
//      over `descriptors` runs, a memcpy per run of a CPU gather) and their bytes equal the op's
//      counts (as multisets: lanes run ops in the order they become ready);
//   3. the decode KV lives in the decode home (hw/decode_home.h): the offloads wrote it, the
//      gathers and fetches read rows of it -- checked on the home itself below, bytes included.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/pipeline.h"
#include "core/transfer_strategy.h"
#include "hw/decode_home.h"
#include "hw/hw_executor.h"
#include "sim/sim_executor.h"
#include "tests/hw/backend_recorder.h"
#include "tests/hw/executor_fixture.h"
#include "tests/hw/hw_test_util.h"
#include "tests/hw/parity_fixture.h"
#include "tests/sim/sim_testutil.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier::hw {
namespace {

using namespace kvtier::hw::fixture;  // NOLINT: test helpers

// Rows of 256 B (head_dim 128), 4 KV heads: one token's K (or V) in one layer is 1 KiB.
ModelSpec DecodeModel() { return WideModel("decode-wide"); }

struct Case {
  std::string system, policy, strategy;
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.system << " " << c.policy << " " << c.strategy;
  }
};

SystemOptions DecodeSystem(const Case& c) {
  SystemOptions s = System(c.system, 256 * 1024, 1024 * 1024);
  s.chunk_tokens = 16;
  if (c.system == "recomp") s.schedule = "recompute";
  s.transfer_strategy = FindTransferStrategy(c.strategy);
  s.decode.policy = FindDecodePolicy(c.policy);
  s.decode.bits = 2;
  s.decode.group = 32;
  s.decode.residual = 16;
  s.decode.topk = 8;
  s.decode.max_batch = 1;  // hw decodes one request at a time
  s.decode.gpu_memory = Bytes(80) << 30;
  return s;
}

// Three requests of 5 output tokens; the later ones share the first's prefix (SPEC reuses it).
std::vector<Request> DecodeRequests() {
  std::vector<Request> out;
  const std::int64_t lengths[] = {64, 80, 72};
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.id = RequestId(i + 1);
    r.prefix.resize(std::size_t(lengths[i]));
    std::iota(r.prefix.begin(), r.prefix.end(), 1000);
    r.query_tokens = 6;
    r.output_tokens = 5;
    out.push_back(r);
  }
  return out;
}

using fixture::Line;  // of a TransferOp; this file adds a ComputeOp's
std::string Line(const ComputeOp& op) {
  std::ostringstream o;
  o << ComputeKindName(op.kind) << " r" << op.request << " l" << op.layer << " part "
    << int(op.decode_part) << " n " << op.new_tokens << " ctx " << op.context_tokens << " read "
    << op.kv_read_bytes << " write " << op.kv_write_bytes;
  return o.str();
}

// Every op an executor was given, as it arrived; the transfers also as ops.
class OpRecorder : public ExecutorWrapper {
 public:
  explicit OpRecorder(Executor* target) : ExecutorWrapper(target) {}
  OpId Submit(TransferOp op, std::span<const OpId> after) override {
    text += Line(op) + "\n";
    transfers.push_back(op);
    return ExecutorWrapper::Submit(std::move(op), after);
  }
  OpId Submit(ComputeOp op, std::span<const OpId> after) override {
    text += Line(op) + "\n";
    return ExecutorWrapper::Submit(std::move(op), after);
  }
  std::string text;
  std::vector<TransferOp> transfers;
};

// Prefill then decode each request to its end (batch size 1), then finish.
void Serve(Pipeline& p, const std::vector<Request>& requests, MemoryRunLog* log) {
  for (const Request& r : requests) {
    EXPECT_TRUE(p.Run(r).ok());
    while (p.decoding()) EXPECT_TRUE(p.DecodeStep().ok());
  }
  EXPECT_TRUE(p.Finish().ok());
  EXPECT_EQ(log->decode_requests.size(), requests.size());
}

struct HwResult {
  std::string text;
  std::vector<TransferOp> ops;
  std::vector<Call> calls;
  HwExecutorStats stats;
  std::size_t steps = 0;
};

HwResult RunHw(const SystemOptions& sys) {
  ScratchDir dir;
  HwResult out;
  std::mutex mu;
  HwExecutorOptions o = Options(dir.path(), sys);
  o.pace_pcie = false;
  o.decode_home_tokens = 512;
  o.wrap_backend = [&](std::unique_ptr<DeviceBackend> b) -> std::unique_ptr<DeviceBackend> {
    return std::make_unique<Recorder>(std::move(b), &out.calls, &mu, /*check_bytes=*/false);
  };
  std::unique_ptr<HwExecutor> ex;
  const Status s = HwExecutor::Create(DecodeModel(), HardwareOptions{}, o, &ex);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return out;
  OpRecorder rec(ex.get());
  ScriptedScores scores(Agreeing);
  MemoryRunLog log;
  PipelineOptions po;
  po.system = sys;
  Pipeline pipeline(DecodeModel(), po, &rec, &scores, &log);
  Serve(pipeline, DecodeRequests(), &log);
  ex->Drain();
  out.text = std::move(rec.text);
  out.ops = std::move(rec.transfers);
  out.stats = ex->stats();
  out.steps = log.decode_steps.size();
  return out;
}

// The same through SimExecutor (in a child: one SimGrid engine per process): its ops, one Line
// each, then the number of decode steps.
std::string RunSim(const SystemOptions& sys) {
  return kvtier::testing::InChildText([&] {
    sim::SimExecutor ex(DecodeModel(), HardwareOptions{});
    OpRecorder rec(&ex);
    ScriptedScores scores(Agreeing);
    MemoryRunLog log;
    PipelineOptions po;
    po.system = sys;
    po.chunk_detail = false;  // as `kvtier sim` runs
    Pipeline pipeline(DecodeModel(), po, &rec, &scores, &log);
    ex.Run([&] { Serve(pipeline, DecodeRequests(), &log); });
    return rec.text + "steps " + std::to_string(log.decode_steps.size()) + "\n";
  });
}

class DecodeParity : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeParity, HwIssuesTheDecodeOpsTheSimulatorCharges) {
  const Case& c = GetParam();
  const SystemOptions sys = DecodeSystem(c);
  const HwResult hw = RunHw(sys);
  ASSERT_FALSE(hw.text.empty());

  // 1. The same ops, in the same order, and as many decode steps.
  EXPECT_EQ(RunSim(sys), hw.text + "steps " + std::to_string(hw.steps) + "\n");

  // 2. Per transfer op, the backend call it stands for: (what, direction, count, bytes).
  std::vector<CallKey> want, got;
  int decode_ops = 0, gathers = 0;
  Bytes gathered = 0;
  for (const TransferOp& op : hw.ops) {
    if (op.bytes == 0 || op.kind == TransferKind::kSsdRead || op.kind == TransferKind::kSsdWrite) {
      continue;
    }
    const bool decode = op.purpose == Purpose::kDecodeFetch ||
                        op.purpose == Purpose::kDecodePrefetch ||
                        op.purpose == Purpose::kDecodeOffload;
    decode_ops += decode;
    want.push_back(ExpectedCall(op));
    if (op.kind == TransferKind::kCpuGather) {
      ++gathers;
      gathered += op.bytes;
    }
  }
  for (const Call& call : hw.calls) got.push_back(KeyOf(call));
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  // full_gpu and kivi keep the KV on the GPU: no decode transfers (kivi with a reused prefix
  // loads its low-bit copy, a layer -1 copy the home does not serve); the others offload.
  const bool on_gpu = c.policy == "full_gpu" || c.policy == "kivi";
  EXPECT_EQ(decode_ops > 0, !on_gpu || c.system == "spec") << hw.text;
  EXPECT_NE(hw.text.find("decode_step"), std::string::npos);
  if (c.policy == "specache" || c.policy == "specache_nospec") {
    EXPECT_EQ(gathers > 0, c.strategy == "staged_gather");
  }
  EXPECT_EQ(hw.stats.bytes_gathered, gathered);
  EXPECT_EQ(hw.stats.decode_home_wraps, 0u);
  EXPECT_EQ(hw.stats.staged_misses, 0u);
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* policy : {"full_gpu", "kivi", "offload_all"}) {
    out.push_back({"recomp", policy, "staged_gather"});
  }
  for (const char* policy : {"specache", "specache_nospec"}) {
    for (const char* strategy :
         {"per_row", "per_chunk", "staged_gather", "batched", "device_gather"}) {
      out.push_back({"recomp", policy, strategy});
    }
  }
  // spec_specache: SPEC's prefill (prefix reuse, loads from the SSD) and SpeCache's decode.
  out.push_back({"spec", "specache", "staged_gather"});
  out.push_back({"spec", "kivi", "staged_gather"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, DecodeParity, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.system + "_" + info.param.policy + "_" +
                                  info.param.strategy;
                         });

// 3. The decode home on its own: a join's offload writes every layer's K and V from position 0,
// a step's offload appends, and gathers and fetches read rows of what was written.
class DecodeHomeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceBackendOptions o;
    o.model = DecodeModel();
    o.compute = ComputeMode::kReal;  // no timer needed: nothing is computed here
    ASSERT_TRUE(CreateDeviceBackend(BackendKind::kHost, std::move(o), &clock_, &device_).ok());
    ASSERT_TRUE(DecodeHome::Create(DecodeModel(), 16, 4096, device_.get(), &home_).ok());
  }
  // Device memory the offloads copy from: a pattern, one byte value per call.
  DecodeHome::DeviceAlloc Source(std::uint8_t value) {
    return [this, value](Bytes n) {
      device_mem_.emplace_back(n, std::byte(value));
      return device_mem_.back().data();
    };
  }
  static void Run(const std::vector<CopyPiece>& pieces) {
    for (const CopyPiece& p : pieces) std::memcpy(p.dst, p.src, p.bytes);
  }
  HostClock clock_;
  std::unique_ptr<DeviceBackend> device_;
  std::unique_ptr<DecodeHome> home_;
  std::vector<std::vector<std::byte>> device_mem_;
};

TEST_F(DecodeHomeTest, OffloadsFillTheLayersAndReadsComeFromWhatTheyWrote) {
  const ModelSpec m = DecodeModel();
  const Bytes token = m.KBytesPerTokenLayer();  // 1 KiB
  // A join of a 10-token prompt: 10 tokens of K and V in each of the 2 layers.
  TransferOp join;
  join.kind = TransferKind::kD2H;
  join.purpose = Purpose::kDecodeOffload;
  join.request = 7;
  join.layer = -1;
  join.bytes = 10 * 2 * token * Bytes(m.layers);
  join.ios = std::uint32_t(m.layers);
  std::vector<CopyPiece> pieces;
  home_->OffloadPieces(join, Source(0xA1), &pieces);
  Bytes sum = 0;
  for (const CopyPiece& p : pieces) sum += p.bytes;
  EXPECT_EQ(sum, join.bytes);
  Run(pieces);
  EXPECT_EQ(home_->held(0), 10);
  EXPECT_EQ(home_->held(1), 10);
  // A step's offload at layer 1: one token appended at position 10.
  TransferOp step = join;
  step.request = 0;
  step.layer = 1;
  step.bytes = 2 * token;
  step.ios = 1;
  pieces.clear();
  home_->OffloadPieces(step, Source(0xB2), &pieces);
  Run(pieces);
  EXPECT_EQ(home_->held(0), 10);
  EXPECT_EQ(home_->held(1), 11);
  EXPECT_EQ(home_->region(1, KvKind::kKey)[10 * token], std::byte(0xB2));
  EXPECT_EQ(home_->region(1, KvKind::kValue)[10 * token - 1], std::byte(0xA1));
  EXPECT_EQ(home_->region(1, KvKind::kValue)[10 * token], std::byte(0xB2));

  // A gather of 8 head rows (4 K, 4 V) at layer 1: each row lies inside what layer 1 holds
  // before the last step's token (its offload may still be running beside the prefetch), K rows
  // in its K region, V rows in its V region, and the bytes arrive back to back.
  TransferOp gather;
  gather.kind = TransferKind::kCpuGather;
  gather.purpose = Purpose::kDecodePrefetch;
  gather.layer = 1;
  gather.ios = 8;
  gather.bytes = 8 * m.RowBytes();
  std::vector<std::byte> dst(gather.bytes);
  pieces.clear();
  Bytes k_bytes = 0;
  home_->GatherPieces(gather, dst.data(), dst.size(), &pieces, &k_bytes);
  ASSERT_EQ(pieces.size(), 8u);
  EXPECT_EQ(k_bytes, 4 * m.RowBytes());
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const std::byte* base = home_->region(1, i < 4 ? KvKind::kKey : KvKind::kValue);
    EXPECT_GE(pieces[i].src, base);
    EXPECT_LE(pieces[i].src + pieces[i].bytes, base + 10 * token);
    EXPECT_EQ((pieces[i].src - base) % Bytes(m.RowBytes()), 0);
    EXPECT_EQ(pieces[i].dst, dst.data() + i * m.RowBytes());
  }
  Run(pieces);
  for (std::byte b : dst) EXPECT_EQ(b, std::byte(0xA1));  // the prompt's rows
  // A whole-layer fetch (offload_all: K and V of the 11 tokens, 2 DMA calls) reads from 0.
  TransferOp fetch;
  fetch.kind = TransferKind::kH2D;
  fetch.purpose = Purpose::kDecodeFetch;
  fetch.layer = 1;
  fetch.ios = 2;
  fetch.bytes = 2 * 11 * token;
  pieces.clear();
  home_->FetchPieces(fetch, fetch.ios, Source(0), &pieces);
  sum = 0;
  for (const CopyPiece& p : pieces) sum += p.bytes;
  EXPECT_EQ(sum, fetch.bytes);
  EXPECT_EQ(pieces.front().src, home_->region(1, KvKind::kKey));
  EXPECT_EQ(pieces.back().src + pieces.back().bytes,
            home_->region(1, KvKind::kValue) + 11 * token);
  EXPECT_EQ(home_->wraps(), 0u);
}

TEST_F(DecodeHomeTest, ASequenceLongerThanTheHomeWraps) {
  const ModelSpec m = DecodeModel();
  TransferOp join;
  join.kind = TransferKind::kD2H;
  join.purpose = Purpose::kDecodeOffload;
  join.request = 1;
  join.layer = -1;
  join.bytes = 20 * 2 * m.KBytesPerTokenLayer() * Bytes(m.layers);  // 20 tokens, home of 16
  std::vector<CopyPiece> pieces;
  home_->OffloadPieces(join, Source(1), &pieces);
  Bytes sum = 0;
  for (const CopyPiece& p : pieces) sum += p.bytes;
  EXPECT_EQ(sum, join.bytes);  // every byte moves; the first positions are overwritten
  EXPECT_EQ(home_->held(0), 16);
  EXPECT_EQ(home_->wraps(), 2u);  // one per layer
}

TEST(DecodeHomeServes, OnlyBytesOnlyDecodeOps) {
  TransferOp op;
  op.kind = TransferKind::kH2D;
  op.purpose = Purpose::kDecodeFetch;
  op.layer = 0;
  EXPECT_TRUE(DecodeHome::Serves(op));
  op.layer = -1;  // kivi's low-bit copy of a reused prefix: no home for it
  EXPECT_FALSE(DecodeHome::Serves(op));
  op.layer = 0;
  op.chunks.push_back(ChunkIo{});
  EXPECT_FALSE(DecodeHome::Serves(op));
  op.chunks.clear();
  op.purpose = Purpose::kDemand;
  EXPECT_FALSE(DecodeHome::Serves(op));
  op.kind = TransferKind::kD2H;
  op.purpose = Purpose::kDecodeOffload;
  EXPECT_TRUE(DecodeHome::Serves(op));
}

}  // namespace
}  // namespace kvtier::hw
