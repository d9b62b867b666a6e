// HwExecutor on the host backend with the real disk (a scratch directory, O_DIRECT): the
// Pipeline end to end with every chunk read checked byte for byte, dependency order in the
// logged transfers, errors that name the chunk, and parity of decisions with FakeExecutor.

#include "hw/hw_executor.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/pipeline.h"
#include "hw/arena.h"
#include "hw/chunk_store.h"
#include "tests/hw/executor_fixture.h"
#include "tests/hw/hw_test_util.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier::hw {
namespace {

using namespace kvtier::hw::fixture;  // NOLINT: test helpers
using kvtier::testing::FakeExecutor;
using kvtier::testing::ScriptedScores;
using testing::ScratchDir;

TEST(HwExecutor, PipelineEndToEndReadsBackWhatItStored) {
  ScratchDir dir;
  HwRun run = RunOnHw(System("as", 0, 0), dir.path());
  for (const Status& s : run.statuses) EXPECT_TRUE(s.ok()) << s.ToString();
  // Caches of 0 bytes: every reused chunk comes from the SSD, after the first request stored it.
  EXPECT_GT(run.stats.chunks_written, 0u);
  EXPECT_GT(run.stats.chunks_read, 0u);
  EXPECT_EQ(run.stats.chunks_verified, run.stats.chunks_read);  // every byte checked
  EXPECT_GT(run.stats.bytes_h2d, 0u);
  ASSERT_EQ(run.log.requests.size(), 5u);
  EXPECT_EQ(run.log.requests[0].reused_tokens, 0);
  EXPECT_EQ(run.log.requests[1].reused_tokens, 40);
  EXPECT_GT(run.log.requests[2].ssd_read_bytes, 0u);
  for (const RequestRecord& r : run.log.requests) {
    EXPECT_EQ(r.status, "ok");
    EXPECT_GE(r.io_stall_s, 0.0);
    EXPECT_GT(r.ttft_s, 0.0);
    EXPECT_LE(r.start_s, r.end_s);
  }
  for (const LayerRecord& l : run.log.layers) {
    EXPECT_GE(l.stall_s, 0.0);
    EXPECT_LE(l.start_s, l.end_s);
  }
  int reads = 0;
  for (const TransferRecord& t : run.log.transfers) {
    EXPECT_LE(t.submit_s, t.start_s);
    EXPECT_LE(t.start_s, t.end_s);
    reads += t.kind == TransferKind::kSsdRead;
  }
  EXPECT_GT(reads, 0);
}

// spec_cake on the host backend: Cake's loads of the rows the importance history keeps are
// real reads of the stored chunks (every byte checked), and the history's partial rows are
// gathered on the CPU before the copy to the device.
TEST(HwExecutor, SpecCakeReadsBackTheHistorysRows) {
  ScratchDir dir;
  HwRun run = RunOnHw(System("spec_cake", 0, 0), dir.path());
  for (const Status& s : run.statuses) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(run.stats.chunks_read, 0u);
  EXPECT_EQ(run.stats.chunks_verified, run.stats.chunks_read);
  int gathers = 0, loads = 0;
  for (const TransferRecord& t : run.log.transfers) {
    if (t.purpose != Purpose::kCakeLoad) continue;
    ++loads;
    gathers += t.kind == TransferKind::kCpuGather;
  }
  EXPECT_GT(loads, 0);
  EXPECT_GT(gathers, 0);
  for (const RequestRecord& r : run.log.requests) EXPECT_EQ(r.status, "ok");
}

TEST(HwExecutor, TransfersRunInDependencyOrder) {
  ScratchDir dir;
  HwRun run = RunOnHw(System("as", 0, 0), dir.path());
  // Within one (request, layer, purpose) group the H2D of SSD data starts after its read ends.
  int checked = 0;
  for (const TransferRecord& h : run.log.transfers) {
    if (h.kind != TransferKind::kH2D || h.purpose != Purpose::kDemand) continue;
    for (const TransferRecord& r : run.log.transfers) {
      if (r.kind != TransferKind::kSsdRead || r.request_id != h.request_id ||
          r.layer != h.layer || r.purpose != h.purpose) {
        continue;
      }
      if (h.start_s >= r.end_s) ++checked;
    }
  }
  EXPECT_GT(checked, 0);
  // A layer's compute starts after the demand loads it waited for.
  for (const LayerRecord& l : run.log.layers) {
    for (const TransferRecord& t : run.log.transfers) {
      if (t.request_id == l.request_id && t.layer == l.layer && t.purpose == Purpose::kDemand &&
          t.kind == TransferKind::kH2D) {
        EXPECT_GE(l.start_s + 1e-9, t.end_s) << "request " << l.request_id << " layer " << l.layer;
      }
    }
  }
}

// A read's completion starts the next stage on the completing thread (the I/O engine's) when
// that stage's lane is idle: on the host backend the gather after a read, or the copy right
// after a read, run there; what follows a gather (the copy) goes to its lane, so gathers and
// copies still overlap; compute (the modeled GPU) stays on its own lane, and the driving thread
// runs nothing. Checked through the threads the backend's calls ran on.
TEST(HwExecutor, AReadsCompletionRunsTheNextStageOnItsThread) {
  ScratchDir dir;
  struct Threads : DeviceBackendWrapper {
    using DeviceBackendWrapper::DeviceBackendWrapper;
    std::mutex mu;
    std::vector<std::thread::id> gather, copy, compute;
    Status Gather(std::span<const CopyPiece> pieces) override {
      {
        std::lock_guard<std::mutex> l(mu);
        gather.push_back(std::this_thread::get_id());
      }
      return DeviceBackendWrapper::Gather(pieces);
    }
    Status Copy(CopyDirection d, std::span<const CopyPiece> pieces, std::uint32_t copies,
                const std::function<void()>& release, Interval* when) override {
      {
        std::lock_guard<std::mutex> l(mu);
        copy.push_back(std::this_thread::get_id());
      }
      return DeviceBackendWrapper::Copy(d, pieces, copies, release, when);
    }
    Status Compute(const ComputeOp& op, Seconds ready_s, Interval* when) override {
      {
        std::lock_guard<std::mutex> l(mu);
        compute.push_back(std::this_thread::get_id());
      }
      return DeviceBackendWrapper::Compute(op, ready_s, when);
    }
  };
  Threads* seen = nullptr;
  HwExecutorOptions o = Options(dir.path(), System("as", 0, 0));
  o.wrap_backend = [&](std::unique_ptr<DeviceBackend> b) -> std::unique_ptr<DeviceBackend> {
    auto w = std::make_unique<Threads>(std::move(b));
    seen = w.get();
    return w;
  };
  // Every layer step sleeps 50 ms: a step gates each chain's read, so the whole chain is
  // submitted before the read can complete (else a dependent submitted after its read ended
  // starts from the driving thread, which queues it on its lane).
  HardwareOptions hw;
  hw.gpu_kernel_overhead = 0.05;
  std::unique_ptr<HwExecutor> ex;
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), hw, o, &ex).ok());
  const ModelSpec m = TinyModel();
  const Bytes chunk = m.ChunkBytes(4);
  const ChunkId id = ChunkId::Make(1, KvKind::kKey, 0, 0);
  ASSERT_TRUE(ex->Prepopulate(id, chunk, false).ok());
  TransferOp read;
  read.kind = TransferKind::kSsdRead;
  read.chunks = {{id, chunk, {}, {}}};
  read.bytes = chunk;
  read.ios = 1;
  ComputeOp c;
  c.new_tokens = 1;
  c.context_tokens = 4;
  for (int i = 0; i < 3; ++i) {
    // read -> gather -> h2d -> compute
    TransferOp gather = read;
    gather.kind = TransferKind::kCpuGather;
    gather.chunks[0].rows = {0, 2};
    gather.bytes = gather.chunks[0].bytes = 2 * m.KBytesPerTokenLayer();
    TransferOp h2d = gather;
    h2d.kind = TransferKind::kH2D;
    OpId gate = ex->Submit(c, {});
    OpId r = ex->Submit(read, std::span(&gate, 1));
    const OpId g = ex->Submit(gather, std::span(&r, 1));
    OpId h = ex->Submit(h2d, std::span(&g, 1));
    OpId k = ex->Submit(c, std::span(&h, 1));
    ASSERT_TRUE(ex->Wait(k).ok());
    for (OpId op : {gate, r, g, h, k}) ex->Retire(op);
    // read -> h2d -> compute
    h2d = read;
    h2d.kind = TransferKind::kH2D;
    gate = ex->Submit(c, {});
    r = ex->Submit(read, std::span(&gate, 1));
    h = ex->Submit(h2d, std::span(&r, 1));
    k = ex->Submit(c, std::span(&h, 1));
    ASSERT_TRUE(ex->Wait(k).ok());
    for (OpId op : {gate, r, h, k}) ex->Retire(op);
  }
  ASSERT_NE(seen, nullptr);
  ASSERT_EQ(seen->gather.size(), 3u);
  ASSERT_EQ(seen->copy.size(), 6u);
  ASSERT_EQ(seen->compute.size(), 12u);
  const std::thread::id io = seen->gather[0];  // the engine's thread, completing the read
  EXPECT_NE(io, std::this_thread::get_id());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(seen->gather[i], io) << "chain " << i;
    EXPECT_EQ(seen->copy[2 * i + 1], io) << "chain " << i << ": the copy right after the read";
    EXPECT_NE(seen->copy[2 * i], io) << "chain " << i << ": the copy after the gather";
    EXPECT_NE(seen->copy[2 * i], std::this_thread::get_id());
  }
  for (const std::thread::id& t : seen->compute) EXPECT_NE(t, io);
}

TEST(HwExecutor, CachesHoldChunksInArenas) {
  ScratchDir dir;
  HwRun run = RunOnHw(System("as", 2048, 8192), dir.path());
  for (const Status& s : run.statuses) EXPECT_TRUE(s.ok()) << s.ToString();
  std::int64_t gpu = 0, cpu = 0;
  for (const RequestRecord& r : run.log.requests) {
    gpu += r.gpu_hit_chunks;
    cpu += r.cpu_hit_chunks;
  }
  EXPECT_GT(gpu + cpu, 0);
  EXPECT_EQ(run.stats.chunks_verified, run.stats.chunks_read);
}

// Cake is left out: where its loading meets its compute depends on timing by design (SPEC's
// Cake baseline), and its cake_load/cake_meet rows are not marked timing_dependent.
TEST(HwExecutor, DecisionsMatchFakeExecutor) {
  for (const std::string name : {"recomp", "as", "as_h2o_lfu", "spec"}) {
    SCOPED_TRACE(name);
    const SystemOptions sys = System(name, 1024, 4096);
    ScratchDir dir;
    HwRun hw = RunOnHw(sys, dir.path());
    for (const Status& s : hw.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
    MemoryRunLog fake_log;
    FakeExecutor fake({});
    ScriptedScores scores(Agreeing);
    PipelineOptions po;
    po.system = sys;
    Pipeline pipeline(TinyModel(), po, &fake, &scores, &fake_log);
    for (const Request& r : Requests()) ASSERT_TRUE(pipeline.Run(r).ok());
    pipeline.Finish();
    if (name != "recomp") {
      ASSERT_FALSE(fake_log.decisions.empty());
    }
    EXPECT_EQ(hw.log.decisions.size(), fake_log.decisions.size());
    EXPECT_TRUE(hw.log.decisions == fake_log.decisions);
  }
}

TEST(HwExecutor, MissingChunkErrorNamesTheChunk) {
  ScratchDir dir;
  std::unique_ptr<HwExecutor> ex;
  const SystemOptions sys = System("as", 0, 0);
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, Options(dir.path(), sys), &ex).ok());
  TransferOp op;
  op.kind = TransferKind::kSsdRead;
  op.bytes = 128;
  op.ios = 1;
  const ChunkId id = ChunkId::Make(7, KvKind::kValue, 2, 3);
  op.chunks.push_back({id, 128, {}, {}});
  OpId r = ex->Submit(op, {});
  Status s = ex->Wait(r);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find(DescribeChunk(id)), std::string::npos) << s.message();
  ex->Retire(r);
}

TEST(HwExecutor, CorruptChunkErrorNamesTheChunk) {
  ScratchDir dir;
  const ChunkId id = ChunkId::Make(9, KvKind::kKey, 1, 0);
  {
    ChunkStoreOptions so;
    so.dir = dir.path();
    so.capacity_bytes = 64ull << 20;
    std::unique_ptr<ChunkStore> store;
    ASSERT_TRUE(ChunkStore::Open(so, &store).ok());
    std::vector<std::byte> wrong(128);
    FillChunkContent(ChunkId::Make(9, KvKind::kKey, 1, 1), 128, wrong.data());  // another chunk's bytes
    ASSERT_TRUE(store->Put(id, wrong).ok());
  }
  std::unique_ptr<HwExecutor> ex;
  const SystemOptions sys = System("as", 0, 0);
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, Options(dir.path(), sys), &ex).ok());
  TransferOp op;
  op.kind = TransferKind::kSsdRead;
  op.bytes = 128;
  op.chunks.push_back({id, 128, {}, {}});
  OpId r = ex->Submit(op, {});
  Status s = ex->Wait(r);
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_NE(s.message().find(DescribeChunk(id)), std::string::npos) << s.message();
  ex->Retire(r);
}

TEST(HwExecutor, ReadWaitsForThePendingStoreOfItsChunk) {
  ScratchDir dir;
  std::unique_ptr<HwExecutor> ex;
  const SystemOptions sys = System("as", 0, 0);
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, Options(dir.path(), sys), &ex).ok());
  const ChunkId id = ChunkId::Make(3, KvKind::kKey, 0, 0);
  TransferOp w;
  w.kind = TransferKind::kSsdWrite;
  w.purpose = Purpose::kStore;
  w.bytes = 128;
  w.chunks.push_back({id, 128, {}, {}});
  TransferOp r = w;
  r.kind = TransferKind::kSsdRead;
  r.purpose = Purpose::kDemand;
  OpId wid = ex->Submit(w, {});
  OpId rid = ex->Submit(r, {});  // no explicit dependency: the executor adds it
  ASSERT_TRUE(ex->Wait(rid).ok());
  ASSERT_TRUE(ex->Wait(wid).ok());
  const OpTimes wt = ex->Retire(wid), rt = ex->Retire(rid);
  EXPECT_GE(rt.start_s, wt.end_s);
  EXPECT_EQ(ex->stats().chunks_verified, 1u);
}

// A store of 64 value chunks of 128 bytes (8 KiB) of `segment`, layer 0.
TransferOp SmallStore(std::uint32_t segment) {
  TransferOp w;
  w.kind = TransferKind::kSsdWrite;
  w.purpose = Purpose::kStore;
  for (std::uint32_t c = 0; c < 64; ++c) {
    w.chunks.push_back({ChunkId::Make(segment, KvKind::kValue, 0, c), 128, {}, {}});
    w.bytes += 128;
  }
  return w;
}

// Stores are background traffic: the write lane paces them to ssd.background_share of the
// profile's ssd.write_bw, the simulator's cap. 64 chunks of 128 bytes at 0.25 x 128 KiB/s take
// at least 8 KiB / 32 KiB/s = 0.25 s (pacing only slows a write down, so no upper bound), and
// what was paced was still written.
TEST(HwExecutor, StoresArePacedToTheBackgroundShare) {
  ScratchDir dir;
  std::unique_ptr<HwExecutor> ex;
  HardwareOptions hw;
  hw.ssd_write_bw = 128 << 10;
  hw.ssd_background_share = 0.25;
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), hw, Options(dir.path(), System("as", 0, 0)), &ex).ok());
  const OpId id = ex->Submit(SmallStore(5), {});
  ASSERT_TRUE(ex->Wait(id).ok());
  const OpTimes t = ex->Retire(id);
  EXPECT_GE(t.end_s - t.start_s, 0.25 - 1e-3);
  EXPECT_EQ(ex->stats().chunks_written, 64u);
  EXPECT_EQ(ex->stats().bytes_written, 64u * 128);
}

// The driving thread's own time (between returning from a wait and entering the next) and
// its wake-ups after waits that blocked are counted: two paced stores of 62.5 ms each (8 KiB at
// 128 KiB/s) waited for, 30 ms of "planning" between them, and a wait on an op already done
// (not blocked).
TEST(HwExecutor, DriverTimeBetweenWaitsAndItsWakeUpsAreCounted) {
  ScratchDir dir;
  std::unique_ptr<HwExecutor> ex;
  HardwareOptions hw;
  hw.ssd_write_bw = 128 << 10;
  hw.ssd_background_share = 1;
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), hw, Options(dir.path(), System("as", 0, 0)), &ex).ok());
  const OpId a = ex->Submit(SmallStore(5), {});
  ASSERT_TRUE(ex->Wait(a).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const OpId b = ex->Submit(SmallStore(6), {});
  ASSERT_TRUE(ex->Wait(b).ok());
  ASSERT_TRUE(ex->Wait(b).ok());  // done already: not a blocked wait
  const HwExecutorStats st = ex->stats();
  EXPECT_EQ(st.driver_blocked_waits, 2u);
  EXPECT_EQ(st.driver_ops, 2u);  // what cpu.driver_op_cost divides the awake time by
  EXPECT_GE(st.driver_awake_s, 0.030);
  EXPECT_LT(st.driver_awake_s, 0.060 + 0.5);  // the sleep and two returns, on a loaded machine
  EXPECT_GE(st.driver_wake_s, 0.0);
  EXPECT_LT(st.driver_wake_s, 0.5);
  ex->Retire(a);
  ex->Retire(b);
}

// The Executor contract on hardware: a read that fails (a chunk the store lacks) completes
// with NotFound; what depends on it, directly or through another op, is aborted at once naming
// it, and so is an op submitted after it failed. Only the chunk that was read intact counts as
// moved.
TEST(HwExecutor, DependentsOfAFailedReadAreAbortedNamingIt) {
  ScratchDir dir;
  std::unique_ptr<HwExecutor> ex;
  const SystemOptions sys = System("as", 0, 0);
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, Options(dir.path(), sys), &ex).ok());
  const ChunkId present = ChunkId::Make(4, KvKind::kKey, 1, 0);
  const ChunkId missing = ChunkId::Make(4, KvKind::kKey, 1, 1);
  ASSERT_TRUE(ex->Prepopulate(present, 128, false).ok());
  TransferOp read;
  read.kind = TransferKind::kSsdRead;
  read.request = 5;
  read.layer = 1;
  read.bytes = 256;
  read.ios = 2;
  read.chunks = {{present, 128, {}, {}}, {missing, 128, {}, {}}};
  TransferOp h2d = read;
  h2d.kind = TransferKind::kH2D;
  ComputeOp layer;
  layer.kind = ComputeKind::kLayerPrefill;
  layer.request = 5;
  layer.layer = 1;
  layer.new_tokens = 4;
  layer.context_tokens = 8;
  const OpId r = ex->Submit(read, {});
  const OpId h = ex->Submit(h2d, std::vector<OpId>{r});
  const OpId c = ex->Submit(layer, std::vector<OpId>{h});
  const Status rs = ex->Wait(r);
  EXPECT_EQ(rs.code(), Status::Code::kNotFound);
  EXPECT_NE(rs.message().find(DescribeChunk(missing)), std::string::npos) << rs.message();
  const std::string root = "after failed ssd_read (demand, request 5, layer 1): " + rs.ToString();
  const Status hs = ex->Wait(h), cs = ex->Wait(c);
  EXPECT_EQ(hs.code(), Status::Code::kAborted);
  EXPECT_EQ(hs.message(), root);
  EXPECT_EQ(cs.message(), root);  // transitively: the same root
  const OpId late = ex->Submit(h2d, std::vector<OpId>{r});
  EXPECT_EQ(ex->Wait(late).message(), root);
  const OpTimes rt = ex->Retire(r), ht = ex->Retire(h), ct = ex->Retire(c), lt = ex->Retire(late);
  EXPECT_EQ(rt.status.code(), Status::Code::kNotFound);
  EXPECT_EQ(rt.failed_moved_bytes, 128u);  // the present chunk was read and checked
  EXPECT_EQ(ht.failed_moved_bytes, 0u);
  EXPECT_EQ(ht.start_s, ht.end_s);  // never ran
  EXPECT_GE(ht.start_s, rt.end_s);
  EXPECT_EQ(ct.status.message(), root);
  EXPECT_EQ(lt.status.code(), Status::Code::kAborted);
  EXPECT_GE(lt.start_s, lt.submit_s);  // completed at once, when it was submitted
  EXPECT_EQ(lt.start_s, lt.end_s);
  EXPECT_EQ(ex->stats().bytes_h2d, 0u);  // no copy ran
  EXPECT_EQ(ex->stats().compute_ops, 0u);
}

// A store that cannot hold one chunk is refused before anything runs.
TEST(HwExecutor, AStoreTooSmallForOneChunkIsRefusedAtCreate) {
  ScratchDir dir;
  SystemOptions sys = System("as", 0, 0);
  sys.chunk_tokens = 256;  // 256 tokens * 32 B: an 8 KiB chunk
  HwExecutorOptions o = Options(dir.path(), sys);
  o.store_capacity = 4096;
  std::unique_ptr<HwExecutor> ex;
  const Status s = HwExecutor::Create(TinyModel(), HardwareOptions{}, o, &ex);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  for (const char* part : {"hw.store_capacity = 4096 B", "cannot hold one chunk", "8192 B"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  }
}

// A store that fills up fails the write that does not fit (OutOfSpace, naming the chunk and the
// capacity) and the run: the next request finds the failure, or reads of the chunks the store
// did not write are aborted naming it -- never a success, never a bare "not found".
TEST(HwExecutor, AStoreThatFillsUpFailsTheRunNamingTheCapacity) {
  ScratchDir dir;
  const SystemOptions sys = System("as", 0, 0);
  HwExecutorOptions o = Options(dir.path(), sys);
  o.store_capacity = 16384;  // four 4 KiB extents; request 1 stores 60 chunks
  std::unique_ptr<HwExecutor> ex;
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, o, &ex).ok());
  ScriptedScores scores(Agreeing);
  MemoryRunLog log;
  PipelineOptions po;
  po.system = sys;
  Pipeline pipeline(TinyModel(), po, ex.get(), &scores, &log);
  Status failure;
  for (const Request& r : Requests()) {
    failure = pipeline.Run(r);
    if (!failure.ok()) break;
  }
  if (Status st = pipeline.Finish(); failure.ok()) failure = st;
  ex->Drain();
  ASSERT_FALSE(failure.ok());
  const std::string msg = failure.ToString();
  for (const char* part : {"OutOfSpace", "ssd_write (store, request 1)", "capacity 16384",
                           "chunk 0x"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
  EXPECT_EQ(ex->stats().chunks_written, 4u);  // what fit; the rest was not attempted
  bool failed_write = false;
  for (const TransferRecord& t : log.transfers) {
    if (t.kind == TransferKind::kSsdWrite && t.outcome == TransferOutcome::kFailed) {
      failed_write = true;
      EXPECT_EQ(t.bytes, 4u * 128);
    }
  }
  EXPECT_TRUE(failed_write);
}

// A chunk whose bytes were corrupted on disk after it was stored fails the read: by its CRC-32C
// without hw.verify (the header check alone does not see it), by the content check with it.
// Reopening the store then drops the chunk rather than serve it.
TEST(HwExecutor, ACorruptedChunkFailsTheReadWithOrWithoutVerify) {
  const ChunkId id = ChunkId::Make(6, KvKind::kValue, 0, 2);
  const SystemOptions sys = System("as", 0, 0);
  for (bool verify : {false, true}) {
    SCOPED_TRACE(verify ? "verify" : "header and CRC");
    ScratchDir dir;
    HwExecutorOptions o = Options(dir.path(), sys);
    o.verify = verify;
    std::unique_ptr<HwExecutor> ex;
    ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, o, &ex).ok());
    ASSERT_TRUE(ex->Prepopulate(id, 128, false).ok());
    {  // flip one byte past the header
      UniqueFd fd(::open((dir.path() + "/chunks.dat").c_str(), O_RDWR));
      ASSERT_GE(fd.get(), 0);
      std::byte b{};
      ASSERT_EQ(::pread(fd.get(), &b, 1, 100), 1);
      b ^= std::byte{0x5A};
      ASSERT_EQ(::pwrite(fd.get(), &b, 1, 100), 1);
    }
    TransferOp op;
    op.kind = TransferKind::kSsdRead;
    op.bytes = 128;
    op.chunks.push_back({id, 128, {}, {}});
    const OpId r = ex->Submit(op, {});
    const Status s = ex->Wait(r);
    EXPECT_EQ(s.code(), Status::Code::kIoError);
    const std::string why = verify ? ": content check failed at byte 96"
                                   : ": checksum mismatch: CRC-32C 0x";
    EXPECT_NE(s.message().find(DescribeChunk(id) + why), std::string::npos) << s.message();
    EXPECT_FALSE(ex->Retire(r).status.ok());
    ex.reset();
    ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, o, &ex).ok());
    ASSERT_EQ(ex->store_dropped_on_open().size(), 1u);
    EXPECT_NE(ex->store_dropped_on_open()[0].message().find(DescribeChunk(id)), std::string::npos);
    const OpId again = ex->Submit(op, {});
    EXPECT_EQ(ex->Wait(again).code(), Status::Code::kNotFound);
    ex->Retire(again);
  }
}

TEST(HwExecutor, ContentCheckDetectsEveryByte) {
  std::vector<std::byte> b(4000);
  const ChunkId id = ChunkId::Make(1, KvKind::kProbeKey, 5, 6);
  FillChunkContent(id, b.size(), b.data());
  EXPECT_TRUE(CheckChunkContent(id, b.size(), b.data(), true).ok());
  b[3999] ^= std::byte{1};
  EXPECT_TRUE(CheckChunkContent(id, b.size(), b.data(), false).ok());  // header only
  EXPECT_FALSE(CheckChunkContent(id, b.size(), b.data(), true).ok());
}

}  // namespace
}  // namespace kvtier::hw
