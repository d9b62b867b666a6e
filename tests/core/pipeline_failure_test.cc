// The Pipeline's handling of operation failures (core/executor.h "Failure", core/pipeline.h
// "Failures"), over FakeExecutor with scripted failures: for every shipped system
// (configs/systems/*.ini) and every operation kind it performs, a failure of that kind fails
// the run with a message naming the operation (kind, purpose, request, layer), the chunk and
// the error; the transfers are logged as they happened; the executor contract (dependents of a
// failed op are aborted, naming the root) holds for FakeExecutor itself.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "core/config.h"
#include "core/options.h"
#include "core/pipeline.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"
#include "tests/testutil/tiny_model.h"

namespace kvtier {
namespace {

using testing::Agreeing;
using testing::FakeExecutor;
using testing::FakeExecutorOptions;
using testing::FakeFailure;
using testing::PrefixRequests;
using testing::ScriptedScores;
using testing::TinyModel;

std::string SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");  // set by ctest (tests/CMakeLists.txt)
  return s != nullptr ? s : KVTIER_TEST_SOURCE_DIR;
}

// A shipped system, as its INI file defines it, at the tiny model's scale: 4-token chunks,
// no GPU or CPU cache (every reused chunk comes from the SSD), Cake chunks of 8 tokens.
SystemOptions ShippedSystem(const std::string& name) {
  const Config c = Config::Load(SourceDir() + "/configs/systems/" + name + ".ini",
                                {"cache.chunk_tokens=4", "cache.gpu_capacity=0",
                                 "cache.cpu_capacity=0", "cake.chunk_tokens=8"});
  return BuildSystemOptions(c, TinyModel());
}

std::vector<Request> Requests() { return PrefixRequests({40, 64, 80}); }

// One run as the drivers (hw/run_hw.cc, sim/simulate.cc) make it: requests until the first
// failure, then Finish; the first failure is the run's.
struct DrivenRun {
  DrivenRun(const SystemOptions& system, std::vector<FakeFailure> failures)
      : executor([&] {
          FakeExecutorOptions o;
          o.failures = std::move(failures);
          return o;
        }()),
        scores(Agreeing) {
    PipelineOptions options;
    options.system = system;
    pipeline = std::make_unique<Pipeline>(TinyModel(), options, &executor, &scores, &log);
    for (const Request& r : Requests()) {
      failure = pipeline->Run(r);
      if (!failure.ok()) {
        failed_request = r.id;
        break;
      }
      ++served;
    }
    if (Status st = pipeline->Finish(); failure.ok()) {
      failure = st;
      failed_in_finish = !st.ok();
    }
  }
  const RequestRecord* RecordOf(RequestId id) const {
    for (const RequestRecord& r : log.requests) {
      if (r.request_id == id) return &r;
    }
    return nullptr;
  }

  FakeExecutor executor;
  ScriptedScores scores;
  MemoryRunLog log;
  std::unique_ptr<Pipeline> pipeline;
  Status failure;
  RequestId failed_request = 0;  // the request whose Run returned the failure
  bool failed_in_finish = false;
  int served = 0;
};

// The operation kinds one system performs; each is a row of the matrix below.
enum class OpKind { kSsdRead, kSsdWrite, kH2D, kD2H, kCpuGather, kCompute };
const OpKind kAllKinds[] = {OpKind::kSsdRead, OpKind::kSsdWrite,  OpKind::kH2D,
                            OpKind::kD2H,     OpKind::kCpuGather, OpKind::kCompute};
std::string KindName(OpKind k) {
  switch (k) {
    case OpKind::kSsdRead: return "ssd_read";
    case OpKind::kSsdWrite: return "ssd_write";
    case OpKind::kH2D: return "h2d";
    case OpKind::kD2H: return "d2h";
    case OpKind::kCpuGather: return "cpu_gather";
    case OpKind::kCompute: return "compute";
  }
  return "?";
}
TransferKind TransferOf(OpKind k) {
  switch (k) {
    case OpKind::kSsdRead: return TransferKind::kSsdRead;
    case OpKind::kSsdWrite: return TransferKind::kSsdWrite;
    case OpKind::kH2D: return TransferKind::kH2D;
    case OpKind::kD2H: return TransferKind::kD2H;
    default: return TransferKind::kCpuGather;
  }
}

// What each shipped system does with no caches: recomp only computes; `as` and Cake load
// whole chunks (no gather: Cake's 8-token chunks cover whole 4-token stored chunks); the H2O
// and ITF systems gather the rows they keep.
const std::map<std::string, std::set<OpKind>>& KindsBySystem() {
  static const std::set<OpKind> all(std::begin(kAllKinds), std::end(kAllKinds));
  static const std::map<std::string, std::set<OpKind>> kinds = {
      {"recomp", {OpKind::kCompute}},
      {"as", all},  // staged_gather (the default) gathers every load
      {"as_h2o_lru", all},
      {"as_h2o_lfu", all},
      {"impress", all},
      {"spec", all},
      {"ablation_itf", all},
      {"ablation_ro", all},
      {"cake", all},
      {"spec_cake", all},
      // The decode systems' prefills (these requests have no output tokens: no decode step;
      // tests/core/decode_test.cc runs their decode).
      {"full_gpu", {OpKind::kCompute}},
      {"kivi", {OpKind::kCompute}},
      {"offload_all", {OpKind::kCompute}},
      {"specache", {OpKind::kCompute}},
      {"specache_nospec", {OpKind::kCompute}},
      {"spec_specache", all},
  };
  return kinds;
}

TEST(PipelineFailure, TheMatrixCoversEveryShippedSystem) {
  std::set<std::string> shipped;
  for (const auto& e : std::filesystem::directory_iterator(SourceDir() + "/configs/systems")) {
    if (e.path().extension() == ".ini") shipped.insert(e.path().stem().string());
  }
  std::set<std::string> covered;
  for (const auto& [name, kinds] : KindsBySystem()) covered.insert(name);
  EXPECT_EQ(shipped, covered) << "a system INI was added or removed: update KindsBySystem";
}

// Without failures each system performs exactly the kinds the matrix lists, and completes.
TEST(PipelineFailure, EachSystemPerformsTheKindsTheMatrixLists) {
  for (const auto& [name, expected] : KindsBySystem()) {
    SCOPED_TRACE(name);
    DrivenRun run(ShippedSystem(name), {});
    ASSERT_TRUE(run.failure.ok()) << run.failure.ToString();
    EXPECT_EQ(run.served, 3);
    std::set<OpKind> seen;
    for (const auto& s : run.executor.history()) {
      if (!s.is_transfer) {
        seen.insert(OpKind::kCompute);
        continue;
      }
      for (OpKind k : kAllKinds) {
        if (k != OpKind::kCompute && TransferOf(k) == s.transfer.kind) seen.insert(k);
      }
    }
    EXPECT_EQ(seen, expected);
    for (const RequestRecord& r : run.log.requests) EXPECT_EQ(r.status, "ok");
    for (const TransferRecord& t : run.log.transfers) {
      EXPECT_EQ(t.outcome, TransferOutcome::kOk);
    }
  }
}

// The matrix: the first operation of each kind fails, in each system that performs it.
TEST(PipelineFailure, EveryOperationKindFailsTheRunInEverySystem) {
  const Status io = Status::IoError("scripted I/O error (EIO)");
  const Status cuda = Status::CudaError("scripted CUDA error: an illegal memory access");
  for (const auto& [name, kinds] : KindsBySystem()) {
    for (OpKind kind : kinds) {
      SCOPED_TRACE(name + " / " + KindName(kind));
      FakeFailure f;
      if (kind == OpKind::kCompute) {
        f.compute = ComputeKind::kLayerPrefill;
        f.status = cuda;
      } else {
        f.transfer = TransferOf(kind);
        f.status = io;
      }
      DrivenRun run(ShippedSystem(name), {f});
      ASSERT_FALSE(run.failure.ok()) << "the run did not fail";
      const std::string msg = run.failure.ToString();
      // The root failure, not one of its aborted dependents, with its own code and text.
      EXPECT_EQ(run.failure.code(), kind == OpKind::kCompute ? Status::Code::kCudaError
                                                             : Status::Code::kIoError)
          << msg;
      EXPECT_NE(msg.find(kind == OpKind::kCompute ? cuda.message() : io.message()),
                std::string::npos)
          << msg;
      // The operation: kind, then purpose (transfers), request and layer.
      const std::string op =
          kind == OpKind::kCompute ? "layer_prefill (request 1, layer 0)" : KindName(kind) + " (";
      EXPECT_NE(msg.find(op), std::string::npos) << msg;
      EXPECT_NE(msg.find("request "), std::string::npos) << msg;
      // Transfers that move chunks name the first one (the store's D2H copies bytes only).
      if (kind != OpKind::kCompute && kind != OpKind::kD2H) {
        EXPECT_NE(msg.find("chunk 0x"), std::string::npos) << msg;
      }
      // Exactly the scripted op failed; what depended on it never ran and moved nothing.
      int failed = 0;
      for (const TransferRecord& t : run.log.transfers) {
        if (t.outcome == TransferOutcome::kFailed) ++failed;
        if (t.outcome == TransferOutcome::kAborted) {
          EXPECT_EQ(t.bytes, 0u);
          EXPECT_EQ(t.ios, 0u);
        }
      }
      EXPECT_EQ(failed, kind == OpKind::kCompute ? 0 : 1);
      // The run stopped at the failure: the request that failed (or, for a background failure,
      // the one that found it) was the last one served.
      if (run.failed_request != 0) {
        EXPECT_EQ(run.log.requests.size(), std::size_t(run.served) +
                                               (run.RecordOf(run.failed_request) ? 1 : 0));
        if (const RequestRecord* r = run.RecordOf(run.failed_request)) {
          EXPECT_EQ(r->status, msg);
        }
      }
    }
  }
}

// A read fails (`as` loads layer 1 by prefetch during layer 0): the request's row carries the
// error, the read is logged with the bytes it moved (FakeExecutor: half), its H2D and the
// layer's compute never ran, and the request's byte counts are what moved.
TEST(PipelineFailure, AFailedReadIsLoggedAsWhatMoved) {
  FakeFailure f;
  f.transfer = TransferKind::kSsdRead;
  f.purpose = Purpose::kPrefetch;
  f.layer = 1;
  DrivenRun run(ShippedSystem("as"), {f});
  ASSERT_FALSE(run.failure.ok());
  EXPECT_EQ(run.failed_request, 2u);
  EXPECT_NE(run.failure.ToString().find("IoError: ssd_read (prefetch, request 2, layer 1): chunk 0x"),
            std::string::npos)
      << run.failure.ToString();
  const RequestRecord* r = run.RecordOf(2);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, run.failure.ToString());
  Bytes read = 0, planned = 0;
  int aborted_h2d = 0;
  for (const auto& s : run.executor.history()) {
    if (s.is_transfer && s.transfer.request == 2 && s.transfer.kind == TransferKind::kSsdRead) {
      planned += s.transfer.bytes;
    }
  }
  for (const TransferRecord& t : run.log.transfers) {
    if (t.request_id != 2) continue;
    if (t.kind == TransferKind::kSsdRead) read += t.bytes;
    if (t.kind == TransferKind::kSsdRead && t.outcome == TransferOutcome::kFailed) {
      EXPECT_EQ(t.layer, 1);
      EXPECT_GT(t.bytes, 0u);  // FakeExecutor: half of it moved before the failure
    }
    if (t.kind == TransferKind::kH2D && t.layer == 1 && t.purpose == Purpose::kPrefetch) {
      EXPECT_EQ(t.outcome, TransferOutcome::kAborted);
      ++aborted_h2d;
    }
  }
  // K's and V's: V's prefetch read is ordered after K's on the SSD, so it was aborted too.
  EXPECT_EQ(aborted_h2d, 2);
  EXPECT_LT(read, planned);
  EXPECT_EQ(r->ssd_read_bytes, read);
  // Layer 1's compute (and every later one) was aborted, not run: no compute after the read.
  for (const auto& s : run.executor.history()) {
    if (s.is_transfer || s.compute.request != 2 || s.compute.layer < 1) continue;
    EXPECT_EQ(s.times.status.code(), Status::Code::kAborted);
    EXPECT_NE(s.times.status.message().find("after failed ssd_read (prefetch, request 2, layer 1)"),
              std::string::npos)
        << s.times.status.message();
  }
  EXPECT_EQ(run.served, 1);  // request 3 was never served
  EXPECT_EQ(run.RecordOf(3), nullptr);
}

// A background store fails: nobody waits for it, so it is found when it is retired, and the
// next Run returns it without serving (or logging) its request.
TEST(PipelineFailure, ABackgroundStoreFailureIsReportedByTheNextRun) {
  FakeFailure f;
  f.transfer = TransferKind::kSsdWrite;
  f.purpose = Purpose::kStore;
  // Request 2 starts before request 1's store is done (it follows request 1's output layer),
  // request 3 after.
  DrivenRun run(ShippedSystem("as"), {f});
  ASSERT_FALSE(run.failure.ok());
  EXPECT_NE(run.failure.ToString().find("IoError: ssd_write (store, request 1): chunk 0x"),
            std::string::npos)
      << run.failure.ToString();
  ASSERT_NE(run.failed_request, 0u);
  EXPECT_EQ(run.RecordOf(run.failed_request), nullptr);  // not served, not logged
  for (const RequestRecord& r : run.log.requests) EXPECT_EQ(r.status, "ok");
  int failed_writes = 0;
  for (const TransferRecord& t : run.log.transfers) {
    if (t.kind == TransferKind::kSsdWrite && t.outcome == TransferOutcome::kFailed) {
      ++failed_writes;
      EXPECT_EQ(t.request_id, 1u);
    }
  }
  EXPECT_EQ(failed_writes, 1);
}

// The last request's store fails: only Finish can report it.
TEST(PipelineFailure, FinishReportsABackgroundFailureNoRunSaw) {
  FakeFailure f;
  f.transfer = TransferKind::kSsdWrite;
  f.purpose = Purpose::kStore;
  f.nth = 3;  // request 3's store (requests 1 and 2 stored first)
  DrivenRun run(ShippedSystem("spec"), {f});
  ASSERT_FALSE(run.failure.ok());
  EXPECT_TRUE(run.failed_in_finish);
  EXPECT_EQ(run.served, 3);
  EXPECT_NE(run.failure.ToString().find("ssd_write (store, request 3)"), std::string::npos)
      << run.failure.ToString();
}

// Cake waits with WaitAny: a failed load stops its loop at once.
TEST(PipelineFailure, CakeStopsAtAFailedLoad) {
  FakeFailure f;
  f.transfer = TransferKind::kH2D;
  f.purpose = Purpose::kCakeLoad;
  DrivenRun run(ShippedSystem("cake"), {f});
  ASSERT_FALSE(run.failure.ok());
  EXPECT_EQ(run.failed_request, 2u);
  EXPECT_NE(run.failure.ToString().find("h2d (cake_load, request 2)"), std::string::npos)
      << run.failure.ToString();
  // No output layer was computed for the failed request.
  for (const auto& s : run.executor.history()) {
    EXPECT_FALSE(!s.is_transfer && s.compute.request == 2 &&
                 s.compute.kind == ComputeKind::kOutputLayer);
  }
}

// The executor contract, on FakeExecutor: a failed op's dependents (and theirs) complete at
// its end without running, each naming the root; independent ops run on; `nth` and `layer`
// pick the op.
TEST(FakeExecutorFailure, DependentsAreAbortedNamingTheRoot) {
  FakeExecutorOptions o;
  FakeFailure f;
  f.transfer = TransferKind::kSsdRead;
  f.layer = 4;
  f.nth = 2;
  o.failures = {f};
  FakeExecutor ex(o);
  TransferOp read;
  read.kind = TransferKind::kSsdRead;
  read.request = 9;
  read.layer = 4;
  read.bytes = 1000000;  // 1 ms at 1 GB/s
  read.ios = 1;
  read.chunks.push_back({ChunkId::Make(2, KvKind::kValue, 4, 7), 1000000, {}, {}});
  const OpId first = ex.Submit(read, {});          // layer 4, first match: runs fine
  const OpId second = ex.Submit(read, {});         // second match: fails
  TransferOp h2d = read;
  h2d.kind = TransferKind::kH2D;
  const OpId copy = ex.Submit(h2d, std::vector<OpId>{second});
  ComputeOp layer;
  layer.kind = ComputeKind::kLayerPrefill;
  layer.request = 9;
  layer.layer = 4;
  const OpId compute = ex.Submit(layer, std::vector<OpId>{copy, first});
  const OpId independent = ex.Submit(layer, std::vector<OpId>{first});
  EXPECT_TRUE(ex.Wait(first).ok());
  const Status s = ex.Wait(second);
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_EQ(s.message(),
            "chunk 0x0000000240400007 (segment 2, layer 4, V, index 7): scripted I/O error (EIO)");
  const Status root =
      Status::Aborted("after failed ssd_read (demand, request 9, layer 4): " + s.ToString());
  EXPECT_EQ(ex.Wait(copy).ToString(), root.ToString());
  EXPECT_EQ(ex.Wait(compute).ToString(), root.ToString());  // transitively, the same root
  EXPECT_TRUE(ex.Wait(independent).ok());
  // An op submitted after its dependency already failed is aborted too.
  const OpId late = ex.Submit(h2d, std::vector<OpId>{copy});
  EXPECT_EQ(ex.Wait(late).ToString(), root.ToString());
  const OpTimes t_second = ex.Retire(second);
  const OpTimes t_copy = ex.Retire(copy);
  const OpTimes t_compute = ex.Retire(compute);
  EXPECT_EQ(t_second.failed_moved_bytes, 500000u);
  EXPECT_DOUBLE_EQ(t_copy.start_s, t_second.end_s);  // at once, taking no time
  EXPECT_DOUBLE_EQ(t_copy.end_s, t_second.end_s);
  EXPECT_DOUBLE_EQ(t_compute.end_s, t_second.end_s);
  EXPECT_EQ(t_compute.status.code(), Status::Code::kAborted);
  EXPECT_TRUE(ex.Retire(first).status.ok());
}

}  // namespace
}  // namespace kvtier
