#include "hw/chunk_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "tests/hw/hw_test_util.h"

namespace kvtier::hw {
namespace {

using testing::ChunkBytes;
using testing::ScratchDir;

ChunkId Id(uint32_t index) { return ChunkId::Make(7, KvKind::kValue, 3, index); }

std::unique_ptr<ChunkStore> OpenOrDie(const std::string& dir, uint64_t capacity, bool sync = true) {
  std::unique_ptr<ChunkStore> store;
  Status s = ChunkStore::Open({dir, capacity, false, sync}, &store);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return store;
}

std::vector<std::byte> ReadBack(const ChunkStore& store, ChunkId id) {
  auto loc = store.Lookup(id);
  if (!loc) return {};
  std::vector<std::byte> out(loc->length);
  Status s = store.Get(id, out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(ChunkStore, RoundTripIsByteExactWithODirect) {
  ScratchDir dir;
  auto store = OpenOrDie(dir.path(), 64 << 20);
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->direct_io());
  const size_t sizes[] = {1, 4095, 4096, 4097, 65536 + 100, 3 << 20};
  for (uint32_t i = 0; i < std::size(sizes); ++i) {
    auto data = ChunkBytes(i, 1, sizes[i]);
    ASSERT_TRUE(store->Put(Id(i), data).ok());
    auto loc = store->Lookup(Id(i));
    ASSERT_TRUE(loc);
    EXPECT_EQ(loc->offset % kChunkAlign, 0u);
    EXPECT_EQ(loc->length, sizes[i]);
  }
  for (uint32_t i = 0; i < std::size(sizes); ++i)
    EXPECT_EQ(ReadBack(*store, Id(i)), ChunkBytes(i, 1, sizes[i]));
  store.reset();
  // Reopen: the manifest brings every chunk back.
  store = OpenOrDie(dir.path(), 64 << 20);
  EXPECT_EQ(store->chunk_count(), std::size(sizes));
  for (uint32_t i = 0; i < std::size(sizes); ++i)
    EXPECT_EQ(ReadBack(*store, Id(i)), ChunkBytes(i, 1, sizes[i]));
}

TEST(ChunkStore, ReplaceAndRemoveSurviveReopenAndFreeSpaceIsReused) {
  ScratchDir dir;
  const uint64_t cap = 1 << 20;  // 256 extents of 4 KiB
  auto store = OpenOrDie(dir.path(), cap);
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(store->Put(Id(i), ChunkBytes(i, 1, 200 << 10)).ok());
  ASSERT_TRUE(store->Put(Id(1), ChunkBytes(1, 2, 100 << 10)).ok());  // repack: new extent
  ASSERT_TRUE(store->Remove(Id(2)).ok());
  EXPECT_EQ(store->Remove(Id(2)).code(), Status::Code::kNotFound);
  store = OpenOrDie(dir.path(), cap);
  EXPECT_EQ(store->ChunkIds(), (std::vector<ChunkId>{Id(0), Id(1), Id(3)}));
  EXPECT_EQ(ReadBack(*store, Id(1)), ChunkBytes(1, 2, 100 << 10));
  EXPECT_EQ(store->used_bytes(), 2 * (200u << 10) + (100u << 10));
  // Freed extents coalesce: after removing everything one chunk can take the whole capacity.
  for (ChunkId id : store->ChunkIds()) ASSERT_TRUE(store->Remove(id).ok());
  EXPECT_EQ(store->largest_free_extent(), cap);
  ASSERT_TRUE(store->Put(Id(9), ChunkBytes(9, 1, cap)).ok());
  EXPECT_EQ(ReadBack(*store, Id(9)), ChunkBytes(9, 1, cap));
}

TEST(ChunkStore, CapacityLimitIsOutOfSpaceNamingTheChunk) {
  ScratchDir dir;
  auto store = OpenOrDie(dir.path(), 256 << 10);
  ASSERT_TRUE(store->Put(Id(1), ChunkBytes(1, 1, 200 << 10)).ok());
  Status s = store->Put(Id(2), ChunkBytes(2, 1, 100 << 10));
  EXPECT_EQ(s.code(), Status::Code::kOutOfSpace) << s.ToString();
  EXPECT_NE(s.message().find(DescribeChunk(Id(2))), std::string::npos) << s.message();
  // The failed put left nothing behind.
  EXPECT_FALSE(store->Lookup(Id(2)));
  EXPECT_EQ(OpenOrDie(dir.path(), 256 << 10)->chunk_count(), 1u);
}

TEST(ChunkStore, DiskTooSmallForCapacityIsOutOfSpace) {
  ScratchDir dir;
  struct statvfs vfs;
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t want = avail + (64ull << 30);
  if (want > (8ull << 40)) GTEST_SKIP() << "file system too large to ask for more than it has";
  std::unique_ptr<ChunkStore> store;
  Status s = ChunkStore::Open({dir.path(), want, false, true}, &store);
  EXPECT_EQ(s.code(), Status::Code::kOutOfSpace) << s.ToString();
  EXPECT_NE(s.message().find("chunks.dat"), std::string::npos);
}

TEST(ChunkStore, TornManifestTailIsIgnoredAndCutOff) {
  ScratchDir dir;
  {
    auto store = OpenOrDie(dir.path(), 1 << 20);
    for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(store->Put(Id(i), ChunkBytes(i, 1, 5000)).ok());
  }
  const std::string log = dir.path() + "/manifest.log";
  const auto good_size = std::filesystem::file_size(log);
  {
    // A writer killed mid-record: half a record of garbage at the end.
    int fd = ::open(log.c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    char junk[20];
    std::memset(junk, 0xAB, sizeof(junk));
    ASSERT_EQ(::write(fd, junk, sizeof(junk)), 20);
    ::close(fd);
  }
  auto store = OpenOrDie(dir.path(), 1 << 20);
  EXPECT_TRUE(store->truncated_torn_tail());
  EXPECT_EQ(store->replayed_records(), 3u);
  EXPECT_EQ(std::filesystem::file_size(log), good_size);
  // Appends after the cut are visible on the next open.
  ASSERT_TRUE(store->Put(Id(5), ChunkBytes(5, 1, 5000)).ok());
  store = OpenOrDie(dir.path(), 1 << 20);
  EXPECT_FALSE(store->truncated_torn_tail());
  EXPECT_EQ(store->chunk_count(), 4u);
  EXPECT_EQ(ReadBack(*store, Id(5)), ChunkBytes(5, 1, 5000));
}

TEST(ChunkStore, CorruptDataIsAnIoErrorNamingTheChunk) {
  ScratchDir dir;
  auto store = OpenOrDie(dir.path(), 1 << 20);
  ASSERT_TRUE(store->Put(Id(4), ChunkBytes(4, 1, 10000)).ok());
  const uint64_t off = store->Lookup(Id(4))->offset;
  int fd = ::open(store->data_path().c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const char flip = 0x5A;
  ASSERT_EQ(::pwrite(fd, &flip, 1, static_cast<off_t>(off + 777)), 1);
  ::fsync(fd);
  ::close(fd);
  std::vector<std::byte> out(10000);
  Status s = store->Get(Id(4), out);
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(DescribeChunk(Id(4))), std::string::npos) << s.message();
}

// Reopening reads every chunk back against its CRC-32C: one whose bytes changed on disk is
// dropped (named in dropped_on_open), never served; the others are kept, and the drop is
// durable (a second reopen finds nothing to drop, and the extent is free again).
TEST(ChunkStore, ACorruptChunkIsDroppedOnReopenAndTheRestKept) {
  ScratchDir dir;
  auto store = OpenOrDie(dir.path(), 1 << 20);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(store->Put(Id(i), ChunkBytes(i, 1, 9000)).ok());
  const uint64_t off = store->Lookup(Id(1))->offset;
  store.reset();
  {
    UniqueFd fd(::open((dir.path() + "/chunks.dat").c_str(), O_WRONLY));
    ASSERT_GE(fd.get(), 0);
    const char flip = 0x5A;
    ASSERT_EQ(::pwrite(fd.get(), &flip, 1, static_cast<off_t>(off + 5000)), 1);
  }
  store = OpenOrDie(dir.path(), 1 << 20);
  ASSERT_EQ(store->dropped_on_open().size(), 1u);
  const std::string why = store->dropped_on_open()[0].message();
  EXPECT_NE(why.find(DescribeChunk(Id(1)) + ": checksum mismatch: CRC-32C 0x"), std::string::npos)
      << why;
  EXPECT_NE(why.find(" of the 9000 bytes read at offset " + std::to_string(off)), std::string::npos)
      << why;
  EXPECT_FALSE(store->Lookup(Id(1)));
  EXPECT_EQ(ReadBack(*store, Id(0)), ChunkBytes(0, 1, 9000));
  EXPECT_EQ(ReadBack(*store, Id(2)), ChunkBytes(2, 1, 9000));
  EXPECT_EQ(store->used_bytes(), 2 * RoundUp(9000, kChunkAlign));
  store = OpenOrDie(dir.path(), 1 << 20);
  EXPECT_TRUE(store->dropped_on_open().empty());
  EXPECT_EQ(store->chunk_count(), 2u);
}

TEST(ChunkStore, ManyRecordsAreCheckpointedOnReopen) {
  ScratchDir dir;
  {
    auto store = OpenOrDie(dir.path(), 1 << 20, /*sync=*/false);
    for (uint32_t v = 1; v <= 1200; ++v)
      ASSERT_TRUE(store->Put(Id(v % 3), ChunkBytes(v % 3, v, 4096)).ok());
  }
  auto store = OpenOrDie(dir.path(), 1 << 20);
  EXPECT_EQ(std::filesystem::file_size(dir.path() + "/manifest.log"), 3u * 48);
  for (uint32_t i = 0; i < 3; ++i) {
    const uint32_t last = 1200 - ((1200 - i) % 3);
    EXPECT_EQ(ReadBack(*store, Id(i)), ChunkBytes(i, last, 4096));
  }
  store = OpenOrDie(dir.path(), 1 << 20);
  EXPECT_EQ(store->chunk_count(), 3u);
}

// A writer child puts and replaces chunks (so freed extents get reused) and reports each
// acknowledged put through a pipe; the parent SIGKILLs it mid-stream. After reopen, every
// manifest entry must read back exactly the bytes of one version of that chunk (checksums and
// content), and that version must be at least the last one acknowledged.
TEST(ChunkStore, KilledWriterNeverLeavesManifestPointingAtGarbage) {
  for (int round = 0; round < 3; ++round) {
    ScratchDir dir;
    const uint64_t cap = 8 << 20;
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      std::unique_ptr<ChunkStore> store;
      if (!ChunkStore::Open({dir.path(), cap, false, true}, &store).ok()) ::_exit(3);
      for (uint64_t v = 1;; ++v) {
        const uint32_t idx = static_cast<uint32_t>(v % 12);
        const size_t size = 4096 + (v * 7919) % (400 << 10);
        Status s = store->Put(Id(idx), ChunkBytes(Id(idx).value, v, size));
        if (!s.ok()) {
          if (store->Remove(Id(static_cast<uint32_t>((v + 5) % 12))).ok()) continue;
          ::_exit(4);
        }
        const uint64_t ack[2] = {idx, v};
        if (::write(fds[1], ack, sizeof(ack)) != sizeof(ack)) ::_exit(5);
      }
    }
    ::close(fds[1]);
    std::map<uint32_t, uint64_t> acked;
    const int kill_after = 40 + round * 37;
    for (int n = 0; n < kill_after; ++n) {
      uint64_t ack[2];
      ASSERT_EQ(::read(fds[0], ack, sizeof(ack)), static_cast<ssize_t>(sizeof(ack)));
      acked[static_cast<uint32_t>(ack[0])] = ack[1];
    }
    ::usleep(1000 * (round + 1));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "writer exited early with " << WEXITSTATUS(status);
    uint64_t ack[2];  // acks written before the kill
    while (::read(fds[0], ack, sizeof(ack)) == sizeof(ack))
      acked[static_cast<uint32_t>(ack[0])] = ack[1];
    ::close(fds[0]);

    auto store = OpenOrDie(dir.path(), cap);
    ASSERT_TRUE(store);
    for (ChunkId id : store->ChunkIds()) {
      auto bytes = ReadBack(*store, id);
      ASSERT_GE(bytes.size(), 24u);
      uint64_t header[3];
      std::memcpy(header, bytes.data(), sizeof(header));
      EXPECT_EQ(header[0], id.value);
      EXPECT_EQ(header[2], bytes.size());
      EXPECT_EQ(bytes, ChunkBytes(id.value, header[1], bytes.size())) << DescribeChunk(id);
      auto it = acked.find(id.index());
      if (it != acked.end()) {
        EXPECT_GE(header[1], it->second) << DescribeChunk(id);
      }
    }
    EXPECT_GT(store->chunk_count(), 0u);
  }
}

TEST(ChunkStore, ODirectRefusalIsAnErrorUnlessBufferedIsAllowed) {
  // tmpfs refused O_DIRECT before Linux 6.6; newer kernels accept it, then there is nothing to
  // refuse and the test skips.
  const std::string shm = "/dev/shm/kvtier_hw_odirect_" + std::to_string(::getpid());
  std::filesystem::create_directories(shm);
  std::unique_ptr<ChunkStore> store;
  Status s = ChunkStore::Open({shm, 1 << 20, false, true}, &store);
  if (s.ok()) {
    std::filesystem::remove_all(shm);
    GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT";
  }
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  ASSERT_TRUE(ChunkStore::Open({shm, 1 << 20, true, true}, &store).ok());
  EXPECT_FALSE(store->direct_io());
  ASSERT_TRUE(store->Put(Id(1), ChunkBytes(1, 1, 3000)).ok());
  EXPECT_EQ(ReadBack(*store, Id(1)), ChunkBytes(1, 1, 3000));
  std::filesystem::remove_all(shm);
}

}  // namespace
}  // namespace kvtier::hw
