// Parity of the transfer strategies between the simulator and the hw path (issue 14, "What must
// hold"): for every strategy, SSD read unit and shipped system, on a small trace through the
// Pipeline,
//   1. hw issued what each op says: per transfer op, the calls the host backend was asked to
//      make -- DMA calls (pieces of a Copy), one batched call with `descriptors` descriptors,
//      one device gather over `descriptors` runs, a memcpy per run of a CPU gather -- and their
//      bytes equal the op's ios / descriptors / bytes (as multisets: the lanes run ops in the
//      order they become ready, not in submission order), and the SSD read requests issued
//      equal the read ops' ios (whole chunks or extents);
//   2. the simulator charged the same ops: the ops SimExecutor was given (kind, method, staged,
//      ios, descriptors, bytes) equal, one by one in submission order, those HwExecutor was
//      given, for the systems whose decisions do not depend on timing (all but Cake's
//      schedule, whose loading meets its compute where timing says: its ops are checked by 1).
// Together: per op, what the simulator counted is what the host backend did.

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/pipeline.h"
#include "core/transfer_strategy.h"
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

ModelSpec WideModel() { return fixture::WideModel("wide"); }

SystemOptions StrategySystem(const std::string& name, const std::string& strategy,
                             const std::string& unit) {
  SystemOptions s = System(name, 24 * 1024, 96 * 1024);  // some GPU and CPU hits, evictions
  s.chunk_tokens = 16;
  if (s.schedule == "cake") s.cake_chunk_tokens = 16;
  s.transfer_strategy = FindTransferStrategy(strategy);
  s.ssd_read_unit = FindSsdReadUnit(unit);
  return s;
}

// What an executor was asked to do: every transfer op, as it arrived.
class OpRecorder : public ExecutorWrapper {
 public:
  explicit OpRecorder(Executor* target) : ExecutorWrapper(target) {}
  OpId Submit(TransferOp op, std::span<const OpId> after) override {
    ops.push_back(op);
    return ExecutorWrapper::Submit(std::move(op), after);
  }
  using ExecutorWrapper::Submit;
  std::vector<TransferOp> ops;
};

struct HwResult {
  std::vector<TransferOp> ops;
  std::vector<Call> calls;
  HwExecutorStats stats;
};

// A run: the system, its requests and the importance they see.
struct Workload {
  std::vector<Request> requests = Requests();
  ScriptedScores::Fn scores = Agreeing;
};

HwResult RunHw(const SystemOptions& sys, const Workload& w) {
  ScratchDir dir;
  HwResult out;
  std::mutex mu;
  HwExecutorOptions o = Options(dir.path(), sys);
  o.pace_pcie = false;
  o.wrap_backend = [&](std::unique_ptr<DeviceBackend> b) -> std::unique_ptr<DeviceBackend> {
    return std::make_unique<Recorder>(std::move(b), &out.calls, &mu, /*check_bytes=*/false);
  };
  std::unique_ptr<HwExecutor> ex;
  const Status s = HwExecutor::Create(WideModel(), HardwareOptions{}, o, &ex);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return out;
  OpRecorder rec(ex.get());
  ScriptedScores scores(w.scores);
  MemoryRunLog log;
  PipelineOptions po;
  po.system = sys;
  Pipeline pipeline(WideModel(), po, &rec, &scores, &log);
  for (const Request& r : w.requests) EXPECT_TRUE(pipeline.Run(r).ok());
  EXPECT_TRUE(pipeline.Finish().ok());
  ex->Drain();
  out.ops = std::move(rec.ops);
  out.stats = ex->stats();
  return out;
}

// The same requests through SimExecutor (in a child: one SimGrid engine per process): the ops
// it was given, one Line each.
std::string RunSim(const SystemOptions& sys, const Workload& w) {
  return kvtier::testing::InChildText([&] {
    sim::SimExecutor ex(WideModel(), HardwareOptions{});
    OpRecorder rec(&ex);
    ScriptedScores scores(w.scores);
    MemoryRunLog log;
    PipelineOptions po;
    po.system = sys;
    po.chunk_detail = false;  // as `kvtier sim` runs (sim/simulate.cc): byte totals only
    Pipeline pipeline(WideModel(), po, &rec, &scores, &log);
    ex.Run([&] {
      for (const Request& r : w.requests) pipeline.Run(r);
      pipeline.Finish();
    });
    std::string text;
    for (const TransferOp& op : rec.ops) text += Line(op) + "\n";
    return text;
  });
}

struct Case {
  std::string system, strategy, unit;
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.system << " " << c.strategy << " " << c.unit;
  }
};

// Runs `w` through hw and the simulator and checks 1. and 2. above; `c` names the case.
// Returns what hw did.
HwResult ExpectParity(const Case& c, const SystemOptions& sys, const Workload& w) {
  const HwResult hw = RunHw(sys, w);

  // 1. Per op, the backend call it stands for: (what, direction, count, bytes), the count being
  // the DMA calls of a Copy (its `copies`: one per piece for ops that list chunks, the op's ios
  // for a bytes-only op such as the store's D2H, whose pieces are ring-sized), the descriptors
  // of a batched call or a device gather, the memcpys of a CPU gather.
  std::vector<CallKey> want, got;
  std::uint64_t ssd_ios = 0, extent_chunks = 0, bytes_only = 0;
  int loads = 0;
  for (const TransferOp& op : hw.ops) {
    if (op.bytes == 0) continue;
    if (op.kind == TransferKind::kSsdRead) {
      if (!op.chunks.empty()) ssd_ios += op.ios;
      for (const ChunkIo& io : op.chunks) extent_chunks += !io.extents.empty();
      continue;
    }
    if (op.kind == TransferKind::kSsdWrite) continue;
    want.push_back(ExpectedCall(op));
    const int what = std::get<0>(want.back());
    if (what == Call::kBatched || what == Call::kDeviceGather) {
      EXPECT_EQ(op.ios, 1u) << Line(op);  // one call
    }
    bytes_only += what == Call::kCopy && op.chunks.empty();
    loads += op.kind == TransferKind::kH2D && op.purpose != Purpose::kPromote;
  }
  std::uint64_t copies_not_pieces = 0;
  for (const Call& call : hw.calls) {
    got.push_back(KeyOf(call));
    copies_not_pieces += call.what == Call::kCopy && call.copies != call.pieces;
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  if (got != want) {
    // Name what differs: the keys only one side has.
    std::vector<CallKey> only_ops, only_calls;
    std::set_difference(want.begin(), want.end(), got.begin(), got.end(),
                        std::back_inserter(only_ops));
    std::set_difference(got.begin(), got.end(), want.begin(), want.end(),
                        std::back_inserter(only_calls));
    auto text = [](const std::vector<CallKey>& keys) {
      std::string t;
      for (const auto& [what, dir, count, bytes] : keys) {
        t += "(" + std::to_string(what) + "," + std::to_string(dir) + "," +
             std::to_string(count) + "," + std::to_string(bytes) + ") ";
      }
      return t;
    };
    ADD_FAILURE() << "backend calls differ from the ops' counts (what, direction, count, bytes)"
                  << "\n  ops without a matching call: " << text(only_ops)
                  << "\n  calls without a matching op: " << text(only_calls);
  }
  // One piece per DMA call, except in bytes-only copies.
  EXPECT_LE(copies_not_pieces, bytes_only);
  if (c.system == "recomp") {
    EXPECT_EQ(loads, 0);
  } else {
    EXPECT_GT(loads, 0) << "the trace must load rows";
  }
  EXPECT_EQ(hw.stats.ssd_reads, ssd_ios);
  EXPECT_EQ(hw.stats.staged_misses, 0u);
  // Extents are read for demand reads of partly needed chunks the cache does not admit: the
  // systems that select rows (H2O, ITF) read some here; whole-prefix loads and Cake's never do.
  if (c.unit == "extent" && (c.system == "as_h2o_lfu" || c.system == "spec")) {
    EXPECT_GT(extent_chunks, 0u) << "the trace must read some chunks in part";
  }
  if (c.unit == "chunk") {
    EXPECT_EQ(extent_chunks, 0u);
  }
  EXPECT_EQ(hw.stats.extents_verified, hw.stats.extents_read);
  EXPECT_EQ(hw.stats.chunks_verified, hw.stats.chunks_read);

  // 2. The simulator was given the same ops, in the same order.
  if (sys.schedule == "cake") return hw;
  std::string hw_text;
  for (const TransferOp& op : hw.ops) hw_text += Line(op) + "\n";
  EXPECT_EQ(RunSim(sys, w), hw_text);
  return hw;
}

class StrategyParity : public ::testing::TestWithParam<Case> {};

TEST_P(StrategyParity, HwIssuesWhatTheSimulatorCharges) {
  const Case& c = GetParam();
  ExpectParity(c, StrategySystem(c.system, c.strategy, c.unit), Workload{});
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* system : {"recomp", "as", "as_h2o_lfu", "spec", "cake", "spec_cake"}) {
    for (const char* strategy :
         {"per_row", "per_chunk", "staged_gather", "batched", "device_gather"}) {
      for (const char* unit : {"chunk", "extent"}) out.push_back({system, strategy, unit});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryStrategyAndSystem, StrategyParity, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.system + "_" + info.param.strategy + "_" +
                                  info.param.unit;
                         });

// Repacks (core/pipeline.cc, RepackSegment): ten reuses of one 96-token prefix whose important
// tokens are scattered alike for every query, a reorder pass before every request, so spec
// repacks the segment from what the caches hold (the GPU-held chunks copied to host memory,
// the rest read), gathers the rows into the new layout, copies the new chunks that take GPU
// room as the strategy moves whole chunks, and writes the segment; the simulator charges the
// same ops, hw issues them.
class RepackParity : public ::testing::TestWithParam<Case> {};

TEST_P(RepackParity, HwIssuesTheRepacksTheSimulatorCharges) {
  const Case& c = GetParam();
  SystemOptions sys = StrategySystem("spec", c.strategy, c.unit);
  sys.reorder_interval = 0;
  sys.reorder_min_accesses = 1;
  Workload w;
  w.requests.clear();
  for (int i = 0; i < 10; ++i) {
    Request r;
    r.id = RequestId(i + 1);
    r.prefix.resize(96);
    std::iota(r.prefix.begin(), r.prefix.end(), 1000);
    r.query_tokens = 6;
    w.requests.push_back(r);
  }
  w.scores = [](const Request&, int, int, std::int64_t t) { return float((t * 37) % 11); };
  const HwResult hw = ExpectParity(c, sys, w);
  // The run did repack, from memory, and copied new chunks to the GPU.
  int reads = 0, copies_out = 0, gathers = 0, copies_in = 0, writes = 0;
  for (const TransferOp& op : hw.ops) {
    if (op.purpose != Purpose::kReorder) continue;
    reads += op.kind == TransferKind::kSsdRead;
    copies_out += op.kind == TransferKind::kD2H;
    gathers += op.kind == TransferKind::kCpuGather;
    copies_in += op.kind == TransferKind::kH2D;
    writes += op.kind == TransferKind::kSsdWrite;
  }
  EXPECT_GT(writes, 0) << "no repack";
  EXPECT_GT(copies_out, 0) << "no GPU-held chunk was repacked from memory";
  EXPECT_GT(copies_in, 0) << "no new chunk took GPU room";
  EXPECT_GE(gathers, writes);
  (void)reads;  // some chunks may come from the SSD, or none
}

std::vector<Case> RepackCases() {
  std::vector<Case> out;
  for (const char* strategy : {"per_row", "per_chunk", "staged_gather", "batched", "device_gather"}) {
    for (const char* unit : {"chunk", "extent"}) out.push_back({"spec", strategy, unit});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryStrategy, RepackParity, ::testing::ValuesIn(RepackCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.strategy + "_" + info.param.unit;
                         });

}  // namespace
}  // namespace kvtier::hw
