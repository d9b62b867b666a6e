// Fault injection on the hardware path (hw/fault_injection.h, issue 18): each fault at its seam
// -- the I/O engine, the chunk store's writes, the device backend -- and through a Pipeline on
// an HwExecutor, where each must become a failed run naming the operation and the chunk, with
// nothing retried into success. Torn writes are also checked across a reopen of the store
// (killed writer, acknowledged tear). No timing assertion is an upper bound: a slow read is
// only checked to take at least its delay, so a loaded machine cannot fail these tests.

#include "hw/fault_injection.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>

#include "core/errors.h"
#include "hw/posix_util.h"
#include "tests/hw/executor_fixture.h"
#include "tests/hw/hw_test_util.h"

namespace kvtier::hw {
namespace {

using fixture::Agreeing;
using fixture::Requests;
using fixture::ScriptedScores;
using testing::ChunkBytes;
using testing::ScratchDir;
using B = IoEngineOptions::Backend;

std::shared_ptr<FaultInjector> Injector(const std::string& spec) {
  return std::make_shared<FaultInjector>(ParseFaultPlan(spec, "test"));
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

ChunkId Id(uint32_t index) { return ChunkId::Make(4, KvKind::kKey, 2, index); }

// ---- the I/O engine seam ----------------------------------------------------------------------

class FaultyReads : public ::testing::TestWithParam<B> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ChunkStore::Open({dir_.path(), 8 << 20, false, false}, &store_).ok());
    for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(store_->Put(Id(i), Bytes(i)).ok());
  }
  static std::vector<std::byte> Bytes(uint32_t i) { return ChunkBytes(Id(i).value, 1, 64 << 10); }

  std::unique_ptr<IoEngine> Engine(FaultInjector* faults) {
    IoEngineOptions o;
    o.backend = GetParam();
    std::unique_ptr<IoEngine> engine;
    Status s = IoEngine::Create(store_->read_fd(), o, &engine);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return faults->WrapIoEngine(std::move(engine));
  }

  ReadRequest Req(uint32_t i, std::byte* dst) {
    const ChunkLocation loc = *store_->Lookup(Id(i));
    ReadRequest r;
    r.chunk_id = Id(i);
    r.offset = loc.offset;
    r.length = loc.extent_bytes();
    r.dst = dst;
    return r;
  }

  // Reads chunks 0..3 one after another through a faulty engine; returns the results.
  std::vector<ReadResult> ReadAll(FaultInjector* faults, std::vector<AlignedBuffer>* bufs) {
    auto engine = Engine(faults);
    std::vector<ReadResult> out;
    for (uint32_t i = 0; i < 4; ++i) {
      bufs->push_back(AllocateAligned(64 << 10, 4096));
      out.push_back(engine->SubmitWithFuture(Req(i, bufs->back().get())).get());
    }
    return out;
  }

  ScratchDir dir_;
  std::unique_ptr<ChunkStore> store_;
};

TEST_P(FaultyReads, ReadEioFailsThatReadWithTheErrnoTextAndDeliversNothing) {
  auto faults = Injector("read_eio@2");
  std::vector<AlignedBuffer> bufs;
  const std::vector<ReadResult> r = ReadAll(faults.get(), &bufs);
  for (uint32_t i = 0; i < 4; ++i) {
    if (i == 1) continue;
    EXPECT_TRUE(r[i].status.ok()) << r[i].status.ToString();
    EXPECT_EQ(std::memcmp(bufs[i].get(), Bytes(i).data(), 64 << 10), 0);
  }
  EXPECT_EQ(r[1].status.code(), Status::Code::kIoError);
  EXPECT_EQ(r[1].bytes, 0u);
  const std::string m = r[1].status.message();
  EXPECT_TRUE(Has(m, DescribeChunk(Id(1)) + ": read 65536 bytes at offset ")) << m;
  EXPECT_TRUE(Has(m, "Input/output error (errno 5)")) << m;
  // Nothing of the chunk is in the buffer: a caller ignoring the status would see garbage.
  EXPECT_NE(std::memcmp(bufs[1].get(), Bytes(1).data(), 16), 0);
  EXPECT_EQ(faults->injected(FaultKind::kReadEio), 1u);
  EXPECT_EQ(faults->events(FaultClass::kRead), 4u);
}

TEST_P(FaultyReads, ShortReadDeliversHalfAndSaysShort) {
  auto faults = Injector("short_read@1");
  std::vector<AlignedBuffer> bufs;
  const std::vector<ReadResult> r = ReadAll(faults.get(), &bufs);
  EXPECT_EQ(r[0].status.code(), Status::Code::kIoError);
  EXPECT_EQ(r[0].bytes, 32u << 10);
  EXPECT_TRUE(Has(r[0].status.message(), DescribeChunk(Id(0)) + ": short read 32768 < 65536"))
      << r[0].status.message();
  EXPECT_EQ(std::memcmp(bufs[0].get(), Bytes(0).data(), 32 << 10), 0);  // the half it got
  EXPECT_NE(std::memcmp(bufs[0].get() + (32 << 10), Bytes(0).data() + (32 << 10), 16), 0);
  for (uint32_t i = 1; i < 4; ++i) EXPECT_TRUE(r[i].status.ok());
  EXPECT_EQ(faults->injected(FaultKind::kShortRead), 1u);
}

TEST_P(FaultyReads, SlowReadCompletesIntactNoSoonerThanItsDelay) {
  auto faults = Injector("slow_read@*=30ms");
  std::vector<AlignedBuffer> bufs;
  const std::vector<ReadResult> r = ReadAll(faults.get(), &bufs);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(r[i].status.ok()) << r[i].status.ToString();
    EXPECT_EQ(r[i].bytes, 64u << 10);
    EXPECT_EQ(std::memcmp(bufs[i].get(), Bytes(i).data(), 64 << 10), 0);
    EXPECT_GE(r[i].stamps.complete_ns - r[i].stamps.enqueue_ns, 30'000'000);
  }
  EXPECT_EQ(faults->injected(FaultKind::kSlowRead), 4u);
}

// The engine's contract holds through the decorator: every request completes exactly once,
// before the destructor returns, even one whose completion is being held.
TEST_P(FaultyReads, DestructorDeliversAHeldCompletionExactlyOnce) {
  auto faults = Injector("slow_read@1=200ms");
  auto buf = AllocateAligned(64 << 10, 4096);
  std::atomic<int> calls{0};
  Status status = Status::Internal("not delivered");
  {
    auto engine = Engine(faults.get());
    ReadRequest req = Req(2, buf.get());
    req.on_complete = [&](const ReadResult& r) {
      status = r.status;
      ++calls;
    };
    engine->Submit(std::move(req));
  }
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(status.ok()) << status.ToString();
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultyReads, ::testing::Values(B::kIoUring, B::kPread),
                         [](const ::testing::TestParamInfo<B>& i) {
                           return i.param == B::kIoUring ? std::string("IoUring")
                                                         : std::string("Pread");
                         });

// ---- the chunk store's writes ----------------------------------------------------------------

std::unique_ptr<ChunkStore> Open(const std::string& dir, ChunkWriteHook* hook = nullptr) {
  std::unique_ptr<ChunkStore> store;
  ChunkStoreOptions o{dir, 4 << 20, false, true};
  o.write_hook = hook;
  const Status s = ChunkStore::Open(o, &store);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return store;
}

std::vector<std::byte> Get(const ChunkStore& store, ChunkId id, Status* status = nullptr) {
  auto loc = store.Lookup(id);
  if (!loc) return {};
  std::vector<std::byte> out(loc->length);
  const Status s = store.Get(id, out);
  if (status != nullptr) *status = s;
  return s.ok() ? out : std::vector<std::byte>{};
}

constexpr size_t kChunk = 40000;  // 10 blocks of 4 KiB: a torn write lands 5 of them

TEST(FaultyWrites, WriteEnospcIsOutOfSpaceAndStoresNothing) {
  ScratchDir dir;
  auto faults = Injector("write_enospc@2");
  auto store = Open(dir.path(), faults->write_hook());
  ASSERT_TRUE(store->Put(Id(0), ChunkBytes(0, 1, kChunk)).ok());
  const Status s = store->Put(Id(1), ChunkBytes(1, 1, kChunk));
  EXPECT_EQ(s.code(), Status::Code::kOutOfSpace);
  EXPECT_TRUE(Has(s.message(), DescribeChunk(Id(1)) + ": write 40960 bytes at offset ")) << s.message();
  EXPECT_TRUE(Has(s.message(), "No space left on device")) << s.message();
  EXPECT_FALSE(store->Lookup(Id(1)));
  EXPECT_TRUE(store->Put(Id(2), ChunkBytes(2, 1, kChunk)).ok());  // the fault was one write
  store = Open(dir.path());
  EXPECT_EQ(store->ChunkIds(), (std::vector<ChunkId>{Id(0), Id(2)}));
  EXPECT_TRUE(store->dropped_on_open().empty());
}

TEST(FaultyWrites, WriteEioIsAnIoErrorAndStoresNothing) {
  ScratchDir dir;
  auto faults = Injector("write_eio@1");
  auto store = Open(dir.path(), faults->write_hook());
  const Status s = store->Put(Id(0), ChunkBytes(0, 1, kChunk));
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_TRUE(Has(s.message(), "Input/output error (errno 5)")) << s.message();
  EXPECT_EQ(store->chunk_count(), 0u);
  EXPECT_EQ(store->largest_free_extent(), store->capacity_bytes());  // the extent came back
}

// A torn write the kernel reports: half the new version landed, the put fails, and the old
// version stays what the store serves -- now and after reopening.
TEST(FaultyWrites, TornWriteFailsThePutAndTheOldVersionSurvivesReopen) {
  ScratchDir dir;
  auto faults = Injector("torn_write@2");
  auto store = Open(dir.path(), faults->write_hook());
  ASSERT_TRUE(store->Put(Id(0), ChunkBytes(Id(0).value, 1, kChunk)).ok());
  const Status s = store->Put(Id(0), ChunkBytes(Id(0).value, 2, kChunk));  // the replacement tears
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_TRUE(Has(s.message(), DescribeChunk(Id(0)))) << s.message();
  EXPECT_EQ(Get(*store, Id(0)), ChunkBytes(Id(0).value, 1, kChunk));
  store = Open(dir.path());
  EXPECT_TRUE(store->dropped_on_open().empty());
  EXPECT_EQ(Get(*store, Id(0)), ChunkBytes(Id(0).value, 1, kChunk));
}

// Whether `needle` (a chunk's first bytes) is anywhere in the data file: proof a torn half landed.
bool DataFileHolds(const std::string& dir, const std::vector<std::byte>& chunk) {
  UniqueFd fd(::open((dir + "/chunks.dat").c_str(), O_RDONLY));
  std::vector<std::byte> block(kChunkAlign);
  for (off_t off = 0;; off += off_t(kChunkAlign)) {
    if (::pread(fd.get(), block.data(), block.size(), off) != ssize_t(block.size())) return false;
    if (std::memcmp(block.data(), chunk.data(), 64) == 0) return true;
  }
}

// A writer killed in the middle of a chunk write: half the bytes are on disk, no record points
// at them; reopening serves every acknowledged chunk intact and never the torn one.
TEST(FaultyWrites, TornWriteKillLeavesNothingAReopenAccepts) {
  ScratchDir dir;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto faults = Injector("torn_write_kill@4");
    std::unique_ptr<ChunkStore> store;
    ChunkStoreOptions o{dir.path(), 4 << 20, false, true};
    o.write_hook = faults->write_hook();
    if (!ChunkStore::Open(o, &store).ok()) ::_exit(3);
    for (uint32_t i = 0; i < 3; ++i) {
      if (!store->Put(Id(i), ChunkBytes(Id(i).value, 1, kChunk)).ok()) ::_exit(4);
    }
    (void)store->Put(Id(0), ChunkBytes(Id(0).value, 2, kChunk));  // killed in here
    ::_exit(5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the writer exited with " << WEXITSTATUS(status);
  EXPECT_TRUE(DataFileHolds(dir.path(), ChunkBytes(Id(0).value, 2, kChunk)))
      << "the torn half should be on disk";
  auto store = Open(dir.path());
  EXPECT_TRUE(store->dropped_on_open().empty());
  ASSERT_EQ(store->chunk_count(), 3u);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(Get(*store, Id(i)), ChunkBytes(Id(i).value, 1, kChunk));
}

// A torn write the device acknowledged: the record points at half-written bytes. Every read
// catches it by its CRC-32C, and reopening drops the chunk (durably: a second reopen has
// nothing left to drop) while keeping every intact chunk.
TEST(FaultyWrites, TornWriteSilentFailsEveryReadAndIsDroppedOnReopen) {
  ScratchDir dir;
  auto faults = Injector("torn_write_silent@2");
  auto store = Open(dir.path(), faults->write_hook());
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(store->Put(Id(i), ChunkBytes(Id(i).value, 1, kChunk)).ok());
  Status s;
  EXPECT_TRUE(Get(*store, Id(1), &s).empty());
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_TRUE(Has(s.message(), DescribeChunk(Id(1)) + ": checksum mismatch: CRC-32C 0x")) << s.message();
  store = Open(dir.path());
  ASSERT_EQ(store->dropped_on_open().size(), 1u);
  EXPECT_TRUE(Has(store->dropped_on_open()[0].message(), DescribeChunk(Id(1)) + ": checksum mismatch"));
  EXPECT_EQ(store->ChunkIds(), (std::vector<ChunkId>{Id(0), Id(2)}));
  EXPECT_EQ(Get(*store, Id(0)), ChunkBytes(Id(0).value, 1, kChunk));
  EXPECT_EQ(Get(*store, Id(2)), ChunkBytes(Id(2).value, 1, kChunk));
  ASSERT_TRUE(store->Put(Id(3), ChunkBytes(Id(3).value, 1, kChunk)).ok());  // may reuse its extent
  store = Open(dir.path());
  EXPECT_TRUE(store->dropped_on_open().empty());
  EXPECT_EQ(store->chunk_count(), 3u);
  EXPECT_EQ(Get(*store, Id(3)), ChunkBytes(Id(3).value, 1, kChunk));
}

// ---- through the executor: each fault is a failed run --------------------------------------

// Chunks of several 4 KiB blocks (1 KiB per token and layer, 16-token chunks: 16 KiB), so a torn
// write really lands half a chunk.
ModelSpec WideModel() {
  ModelSpec m = fixture::TinyModel();
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = 64;
  m.ffn = 1024;
  return m;
}

struct RunCase {
  const char* spec;
  const char* system;
  Bytes gpu, cpu;
  Status::Code code;
  std::vector<const char*> parts;  // in the run's failure
  const char* failed_kind;         // the transfer logged as failed ("" for compute)
  friend void PrintTo(const RunCase& c, std::ostream* os) { *os << c.spec << " in " << c.system; }
};

struct PipelineRun {
  Status failure;
  MemoryRunLog log;
  HwExecutorStats stats;
};

// One pipeline run of Requests() on a host-backend HwExecutor with `faults`. `verify` off is
// kvtier hw's default: the header and CRC-32C checks are what stand between a torn chunk and a
// silent success.
PipelineRun RunWithFaults(const std::string& dir, const char* system, Bytes gpu, Bytes cpu,
                          std::shared_ptr<FaultInjector> faults, bool verify = false) {
  SystemOptions sys = fixture::System(system, gpu, cpu);
  sys.chunk_tokens = 16;
  HwExecutorOptions o = fixture::Options(dir, sys);
  o.verify = verify;
  o.faults = std::move(faults);
  PipelineRun run;
  std::unique_ptr<HwExecutor> ex;
  const Status created = HwExecutor::Create(WideModel(), HardwareOptions{}, o, &ex);
  EXPECT_TRUE(created.ok()) << created.ToString();
  if (!created.ok()) return run;
  ScriptedScores scores(fixture::Agreeing);
  PipelineOptions po;
  po.system = sys;
  Pipeline pipeline(WideModel(), po, ex.get(), &scores, &run.log);
  for (const Request& r : Requests()) {
    run.failure = pipeline.Run(r);
    if (!run.failure.ok()) break;
  }
  if (Status st = pipeline.Finish(); run.failure.ok()) run.failure = st;
  ex->Drain();
  run.stats = ex->stats();
  return run;
}

class FaultFailsTheRun : public ::testing::TestWithParam<RunCase> {};

TEST_P(FaultFailsTheRun, NamingTheOperationAndTheChunk) {
  const RunCase& c = GetParam();
  ScratchDir dir;
  auto faults = Injector(c.spec);
  const PipelineRun run = RunWithFaults(dir.path(), c.system, c.gpu, c.cpu, faults);
  ASSERT_FALSE(run.failure.ok()) << "the run must fail, not succeed around the fault";
  // The fault's own status, or (a background store or copy failed; a later op that needed it
  // was aborted first) Aborted naming it: "Aborted: after failed ssd_write (...): IoError: ...".
  if (run.failure.code() != c.code) {
    EXPECT_EQ(run.failure.code(), Status::Code::kAborted) << run.failure.ToString();
  }
  EXPECT_TRUE(Has(run.failure.ToString(), std::string(CodeName(c.code)) + ": "))
      << run.failure.ToString();
  for (const char* part : c.parts) {
    EXPECT_TRUE(Has(run.failure.ToString(), part)) << run.failure.ToString();
  }
  const FaultRule& rule = faults->plan().rules.front();
  const bool once = rule.nth != 0;
  if (once) {
    EXPECT_EQ(faults->injected(rule.kind), 1u);
  }
  EXPECT_GE(faults->injected(rule.kind), 1u);
  int failed = 0;
  for (const TransferRecord& t : run.log.transfers) {
    if (t.outcome == TransferOutcome::kFailed) {
      ++failed;
      EXPECT_EQ(TransferKindName(t.kind), std::string(c.failed_kind));
    }
    if (t.outcome == TransferOutcome::kAborted) {
      EXPECT_EQ(t.bytes, 0u);
    }
  }
  // One fault, one failed operation: what depended on it was aborted and nothing ran it again.
  // (A fault on every event may fail two operations in flight at once.)
  if (std::string(c.failed_kind).empty()) {
    EXPECT_EQ(failed, 0);
  } else if (once) {
    EXPECT_EQ(failed, 1);
  } else {
    EXPECT_GE(failed, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Injected, FaultFailsTheRun,
    ::testing::Values(
        RunCase{"read_eio@2", "as", 0, 0, Status::Code::kIoError,
                {"ssd_read (", "chunk 0x", "Input/output error (errno 5)"}, "ssd_read"},
        RunCase{"short_read@3", "as", 0, 0, Status::Code::kIoError,
                {"ssd_read (", "chunk 0x", ": short read "}, "ssd_read"},
        RunCase{"write_enospc@1", "as", 0, 0, Status::Code::kOutOfSpace,
                {"ssd_write (store, request 1)", "chunk 0x", "No space left on device"},
                "ssd_write"},
        RunCase{"write_eio@5", "as", 0, 0, Status::Code::kIoError,
                {"ssd_write (store", "chunk 0x", "Input/output error (errno 5)"}, "ssd_write"},
        RunCase{"torn_write@3", "spec", 0, 0, Status::Code::kIoError,
                {"ssd_write (store", "chunk 0x", " bytes at offset ", "Input/output error"},
                "ssd_write"},
        // Acknowledged tears pass the write and fail the first whole read of a torn chunk.
        RunCase{"torn_write_silent@*", "as", 0, 0, Status::Code::kIoError,
                {"ssd_read (", "chunk 0x", ": checksum mismatch: CRC-32C 0x"}, "ssd_read"},
        RunCase{"device_h2d@2", "as", 0, 0, Status::Code::kCudaError,
                {"h2d (", "injected device_h2d", "an illegal memory access"}, "h2d"},
        RunCase{"device_d2h@1", "as", 128 << 10, 512 << 10, Status::Code::kCudaError,
                {"d2h (", "injected device_d2h"}, "d2h"},
        RunCase{"device_gather@1", "spec", 0, 0, Status::Code::kCudaError,
                {"cpu_gather (", "injected device_gather"}, "cpu_gather"},
        RunCase{"device_compute@2", "as", 0, 0, Status::Code::kCudaError,
                {"layer_prefill (", "injected device_compute"}, ""}),
    [](const ::testing::TestParamInfo<RunCase>& info) {
      std::string name = info.param.spec;
      name = name.substr(0, name.find('@'));
      std::string out;
      bool up = true;
      for (char ch : name) {
        if (ch == '_') {
          up = true;
          continue;
        }
        out += up ? char(std::toupper(ch)) : ch;
        up = false;
      }
      return out;
    });

// Slow I/O is not a failure: every read completes intact (content and CRC checked) and each
// read op lasts at least the injected delay.
TEST(FaultInjectedRun, SlowReadsCompleteCorrectlyAndTakeAtLeastTheirDelay) {
  ScratchDir dir;
  auto faults = Injector("slow_read@*=20ms");
  const PipelineRun run = RunWithFaults(dir.path(), "as", 0, 0, faults, /*verify=*/true);
  ASSERT_TRUE(run.failure.ok()) << run.failure.ToString();
  ASSERT_GT(run.stats.ssd_reads, 0u);
  EXPECT_EQ(faults->injected(FaultKind::kSlowRead), run.stats.ssd_reads);
  EXPECT_EQ(run.stats.chunks_verified, run.stats.chunks_read - run.stats.staging_reused);
  EXPECT_EQ(run.stats.crc_checked, run.stats.chunks_verified);
  int reads = 0;
  for (const TransferRecord& t : run.log.transfers) {
    EXPECT_EQ(t.outcome, TransferOutcome::kOk);
    if (t.kind != TransferKind::kSsdRead) continue;
    ++reads;
    EXPECT_GE(t.end_s - t.start_s, 0.020 - 1e-6) << "request " << t.request_id;
  }
  EXPECT_GT(reads, 0);
  for (const RequestRecord& r : run.log.requests) EXPECT_EQ(r.status, "ok");
}

// The CRC-32C check on whole-chunk reads (what catches an acknowledged torn write without
// hw.verify): a run without faults checks every whole chunk it reads.
TEST(FaultInjectedRun, EveryWholeChunkReadIsCheckedAgainstItsCrc) {
  ScratchDir dir;
  const PipelineRun run = RunWithFaults(dir.path(), "as", 0, 0, nullptr);
  ASSERT_TRUE(run.failure.ok()) << run.failure.ToString();
  ASSERT_GT(run.stats.chunks_read, 0u);
  EXPECT_EQ(run.stats.crc_checked, run.stats.chunks_read - run.stats.staging_reused);
  EXPECT_EQ(run.stats.chunks_verified, 0u);  // hw.verify off: the CRC is the only full check
}

// Rules count events per class, and the first listed rule wins an event.
TEST(FaultInjector, EventsAreCountedPerClass) {
  FaultInjector f(ParseFaultPlan("write_eio@2,torn_write@2,read_eio@1", "k"));
  EXPECT_EQ(f.Next(FaultClass::kWrite), nullptr);
  const FaultRule* r = f.Next(FaultClass::kWrite);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->kind, FaultKind::kWriteEio);
  EXPECT_EQ(f.Next(FaultClass::kWrite), nullptr);
  ASSERT_NE(f.Next(FaultClass::kRead), nullptr);
  EXPECT_EQ(f.Next(FaultClass::kH2D), nullptr);
  EXPECT_EQ(f.injected(FaultKind::kWriteEio), 1u);
  EXPECT_EQ(f.injected(FaultKind::kTornWrite), 0u);
  EXPECT_EQ(f.events(FaultClass::kWrite), 3u);
}

}  // namespace
}  // namespace kvtier::hw
