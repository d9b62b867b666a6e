#include "hw/io_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <mutex>

#include "hw/arena.h"
#include "hw/chunk_store.h"
#include "hw/posix_util.h"
#include "tests/hw/hw_test_util.h"

namespace kvtier::hw {
namespace {

using B = IoEngineOptions::Backend;
using testing::ChunkBytes;
using testing::ScratchDir;

ChunkId Id(uint32_t index) { return ChunkId::Make(2, KvKind::kKey, 1, index); }

class IoEngineTest : public ::testing::TestWithParam<B> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ChunkStore::Open({dir_.path(), 32 << 20, false, false}, &store_).ok());
    for (uint32_t i = 0; i < 16; ++i) {
      const size_t size = (i == 0) ? (3 << 20) + (512 << 10) : 64 << 10;
      ASSERT_TRUE(store_->Put(Id(i), ChunkBytes(i, 1, size)).ok());
    }
  }

  std::unique_ptr<IoEngine> Make(IoEngineOptions o, int fd = -2) {
    o.backend = GetParam();
    std::unique_ptr<IoEngine> engine;
    Status s = IoEngine::Create(fd == -2 ? store_->read_fd() : fd, o, &engine);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (engine) {
      EXPECT_EQ(engine->backend(), GetParam());
    }
    return engine;
  }

  ReadRequest Req(uint32_t i, void* dst, IoClass c = IoClass::kDemand) {
    auto loc = store_->Lookup(Id(i));
    ReadRequest r;
    r.chunk_id = Id(i);
    r.tag = i;
    r.io_class = c;
    r.offset = loc->offset;
    r.length = loc->extent_bytes();
    r.dst = dst;
    return r;
  }

  ScratchDir dir_;
  std::unique_ptr<ChunkStore> store_;
};

TEST_P(IoEngineTest, ReadsExactBytesAndSplitsLargeReads) {
  IoEngineOptions o;
  o.max_io_bytes = 1 << 20;
  auto engine = Make(o);
  std::vector<AlignedBuffer> bufs;
  std::vector<std::future<ReadResult>> futures;
  for (uint32_t i = 0; i < 16; ++i) {
    bufs.push_back(AllocateAligned(store_->Lookup(Id(i))->extent_bytes(), 4096));
    std::memset(bufs.back().get(), 0xEE, store_->Lookup(Id(i))->extent_bytes());  // poison
    futures.push_back(engine->SubmitWithFuture(Req(i, bufs.back().get())));
  }
  for (uint32_t i = 0; i < 16; ++i) {
    ReadResult r = futures[i].get();
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.chunk_id, Id(i));
    EXPECT_EQ(r.tag, i);
    EXPECT_EQ(r.bytes, store_->Lookup(Id(i))->extent_bytes());
    EXPECT_LE(r.stamps.enqueue_ns, r.stamps.submit_ns);
    EXPECT_LE(r.stamps.submit_ns, r.stamps.complete_ns);
    auto want = ChunkBytes(i, 1, store_->Lookup(Id(i))->length);
    EXPECT_EQ(std::memcmp(bufs[i].get(), want.data(), want.size()), 0) << "chunk " << i;
  }
  // Chunk 0 is 3.5 MiB: four sub-IOs of at most 1 MiB; the others one each.
  IoEngineStats st = engine->stats();
  EXPECT_EQ(st.sub_ios, 4u + 15u);
  EXPECT_EQ(st.completed[0], 16u);
  EXPECT_EQ(st.failed, 0u);
}

// A batch goes to the engine at once: every read completes with its bytes, and on io_uring one
// submission carried all of them (the caps admit 32; the batch is queued under one lock, so the
// ring thread sees all of it or none). An invalid request in the batch fails alone.
TEST_P(IoEngineTest, SubmitBatchReadsEveryRequestInOneSubmission) {
  auto engine = Make({});
  std::vector<AlignedBuffer> bufs;
  std::vector<ReadRequest> batch;
  std::mutex mu;
  std::vector<ReadResult> results;
  std::promise<void> all;
  const int n = 9;
  for (uint32_t i = 1; i <= 8; ++i) {
    bufs.push_back(AllocateAligned(64 << 10, 4096));
    batch.push_back(Req(i, bufs.back().get()));
  }
  bufs.push_back(AllocateAligned(128 << 10, 4096));
  batch.push_back(Req(9, bufs.back().get() + 8));  // misaligned
  for (ReadRequest& r : batch) {
    r.on_complete = [&](const ReadResult& res) {
      std::lock_guard<std::mutex> l(mu);
      results.push_back(res);
      if (int(results.size()) == n) all.set_value();
    };
  }
  engine->SubmitBatch(std::move(batch));
  all.get_future().wait();
  int ok = 0;
  for (const ReadResult& r : results) {
    if (r.chunk_id == Id(9)) {
      EXPECT_EQ(r.status.code(), Status::Code::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    const uint32_t i = uint32_t(r.tag);
    auto want = ChunkBytes(i, 1, store_->Lookup(Id(i))->length);
    EXPECT_EQ(std::memcmp(bufs[i - 1].get(), want.data(), want.size()), 0) << "chunk " << i;
    ++ok;
  }
  EXPECT_EQ(ok, 8);
  if (GetParam() == B::kIoUring) {
    EXPECT_EQ(engine->stats().submit_calls, 1u);
  }
}

TEST_P(IoEngineTest, ShortReadPastEndOfFileNamesTheChunk) {
  auto engine = Make({});
  auto buf = AllocateAligned(1 << 20, 4096);
  ReadRequest r = Req(3, buf.get());
  r.offset = store_->capacity_bytes() - 8192;  // only 8 KiB left in the file
  r.length = 64 << 10;
  ReadResult res = engine->SubmitWithFuture(r).get();
  EXPECT_EQ(res.status.code(), Status::Code::kIoError);
  EXPECT_NE(res.status.message().find("short read"), std::string::npos) << res.status.message();
  EXPECT_NE(res.status.message().find(DescribeChunk(Id(3))), std::string::npos);
  EXPECT_EQ(engine->stats().failed, 1u);
}

TEST_P(IoEngineTest, InvalidFdIsAnIoErrorWithErrnoText) {
  // A descriptor opened write-only: every read fails with EBADF. (A closed descriptor number
  // would be reused by the engine's own ring or eventfd.)
  UniqueFd fd(::open(store_->data_path().c_str(), O_WRONLY));
  ASSERT_TRUE(fd.valid());
  IoEngineOptions o;
  o.register_file = false;
  auto engine = Make(o, fd.get());
  auto buf = AllocateAligned(64 << 10, 4096);
  ReadResult res = engine->SubmitWithFuture(Req(5, buf.get())).get();
  EXPECT_EQ(res.status.code(), Status::Code::kIoError);
  EXPECT_NE(res.status.message().find("Bad file descriptor"), std::string::npos)
      << res.status.message();
  EXPECT_NE(res.status.message().find(DescribeChunk(Id(5))), std::string::npos);
}

TEST_P(IoEngineTest, MisalignedRequestIsRejectedNamingTheChunk) {
  auto engine = Make({});
  auto buf = AllocateAligned(128 << 10, 4096);
  ReadRequest r = Req(6, buf.get() + 8);  // buffer 8 bytes past alignment
  ReadResult res = engine->SubmitWithFuture(r).get();
  EXPECT_EQ(res.status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(res.status.message().find(DescribeChunk(Id(6))), std::string::npos);
  r = Req(6, buf.get());
  r.offset += 512;
  EXPECT_EQ(engine->SubmitWithFuture(r).get().status.code(), Status::Code::kInvalidArgument);
}

TEST_P(IoEngineTest, DemandOvertakesQueuedPrefetchAndProbe) {
  IoEngineOptions o;
  o.max_ops_in_flight = 1;
  o.prefetch_max_ops = 1;
  o.start_paused = true;
  auto engine = Make(o);
  std::mutex mu;
  std::vector<std::pair<int64_t, uint64_t>> started;  // (submit stamp, tag)
  std::atomic<int> done{0};
  std::vector<AlignedBuffer> bufs;
  auto submit = [&](uint32_t i, IoClass c) {
    bufs.push_back(AllocateAligned(64 << 10, 4096));
    ReadRequest r = Req(i, bufs.back().get(), c);
    r.on_complete = [&](const ReadResult& res) {
      EXPECT_TRUE(res.status.ok()) << res.status.ToString();
      std::lock_guard<std::mutex> lock(mu);
      started.emplace_back(res.stamps.submit_ns, res.tag);
      ++done;
    };
    engine->Submit(std::move(r));
  };
  for (uint32_t i = 1; i <= 8; ++i) submit(i, IoClass::kPrefetch);
  submit(9, IoClass::kProbe);
  submit(10, IoClass::kProbe);
  submit(11, IoClass::kDemand);
  engine->Resume();
  while (done < 11) std::this_thread::yield();
  // Strict priority, FIFO inside a class, in the order reads were handed to the kernel (with
  // one op in flight; callbacks of the pread pool may run in any order).
  std::sort(started.begin(), started.end());
  std::vector<uint64_t> order;
  for (const auto& [t, tag] : started) order.push_back(tag);
  EXPECT_EQ(order, (std::vector<uint64_t>{11, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST_P(IoEngineTest, CapsOnOpsAndBytesInFlightHold) {
  IoEngineOptions o;
  o.max_ops_in_flight = 4;
  o.max_bytes_in_flight = 192 << 10;
  o.prefetch_max_ops = 2;
  o.prefetch_max_bytes = 128 << 10;
  o.max_io_bytes = 64 << 10;
  auto engine = Make(o);
  // Prefetch alone never exceeds its own caps.
  std::vector<AlignedBuffer> bufs;
  std::vector<std::future<ReadResult>> fs;
  for (int rep = 0; rep < 4; ++rep) {
    for (uint32_t i = 1; i < 16; ++i) {
      bufs.push_back(AllocateAligned(64 << 10, 4096));
      fs.push_back(engine->SubmitWithFuture(Req(i, bufs.back().get(), IoClass::kPrefetch)));
    }
  }
  for (auto& f : fs) ASSERT_TRUE(f.get().status.ok());
  IoEngineStats st = engine->stats();
  EXPECT_LE(st.max_ops_in_flight_seen, 2u);
  EXPECT_LE(st.max_bytes_in_flight_seen, 128u << 10);
  // Demand (incl. the 3.5 MiB chunk split into 64 KiB sub-IOs) uses the full budget.
  fs.clear();
  for (uint32_t i = 0; i < 16; ++i) {
    bufs.push_back(AllocateAligned(store_->Lookup(Id(i))->extent_bytes(), 4096));
    fs.push_back(engine->SubmitWithFuture(Req(i, bufs.back().get(), IoClass::kDemand)));
  }
  for (auto& f : fs) ASSERT_TRUE(f.get().status.ok());
  st = engine->stats();
  EXPECT_LE(st.max_ops_in_flight_seen, 4u);
  EXPECT_LE(st.max_bytes_in_flight_seen, 192u << 10);
  EXPECT_EQ(st.completed[2], 60u);
  EXPECT_EQ(st.completed[0], 16u);
}

TEST_P(IoEngineTest, FixedBuffersFromHostArenaGiveSameBytes) {
  std::unique_ptr<HostArena> arena;
  ASSERT_TRUE(HostArena::Create({4 << 20, 2, true, true}, &arena).ok());
  IoEngineOptions o;
  o.fixed_buffers = arena->iovecs();
  auto engine = Make(o);
  ReadResult r = engine->SubmitWithFuture(Req(0, arena->slot(1))).get();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  auto want = ChunkBytes(0, 1, store_->Lookup(Id(0))->length);
  EXPECT_EQ(std::memcmp(arena->slot(1), want.data(), want.size()), 0);
  if (GetParam() == B::kIoUring) {
    EXPECT_EQ(engine->stats().fixed_buffer_reads, 4u);
  }
}

TEST_P(IoEngineTest, DestructorCompletesEverySubmittedRequest) {
  std::atomic<int> done{0};
  std::vector<AlignedBuffer> bufs;
  {
    IoEngineOptions o;
    o.max_ops_in_flight = 2;
    o.prefetch_max_ops = 2;
    auto engine = Make(o);
    for (uint32_t i = 1; i < 16; ++i) {
      bufs.push_back(AllocateAligned(64 << 10, 4096));
      ReadRequest r = Req(i, bufs.back().get(), IoClass::kPrefetch);
      r.on_complete = [&](const ReadResult& res) { done += res.status.ok(); };
      engine->Submit(std::move(r));
    }
  }
  EXPECT_EQ(done.load(), 15);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest, ::testing::Values(B::kIoUring, B::kPread),
                         [](const auto& info) {
                           return info.param == B::kIoUring ? "IoUring" : "Pread";
                         });

TEST(IoEngine, RejectsInconsistentOptions) {
  std::unique_ptr<IoEngine> engine;
  IoEngineOptions o;
  o.prefetch_max_ops = o.max_ops_in_flight + 1;
  EXPECT_EQ(IoEngine::Create(0, o, &engine).code(), Status::Code::kInvalidArgument);
  o = {};
  o.max_io_bytes = 1000;
  EXPECT_EQ(IoEngine::Create(0, o, &engine).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::hw
