#include "hw/arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

namespace kvtier::hw {
namespace {

TEST(SlotAllocator, HandsOutLowestFreeSlotAndExhausts) {
  SlotAllocator a(3);
  EXPECT_EQ(a.Allocate(), 0u);
  EXPECT_EQ(a.Allocate(), 1u);
  EXPECT_EQ(a.Allocate(), 2u);
  EXPECT_FALSE(a.Allocate());
  a.Free(1);
  a.Free(0);
  EXPECT_EQ(a.free_count(), 2u);
  EXPECT_EQ(a.Allocate(), 0u);
  EXPECT_EQ(a.Allocate(), 1u);
}

TEST(HostArena, SlotsArePageAlignedDisjointAndWritable) {
  std::unique_ptr<HostArena> arena;
  Status s = HostArena::Create({10000, 5, true, true}, &arena);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(arena->slot_bytes(), 12288u);
  EXPECT_EQ(arena->size_bytes(), 5u * 12288);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena->slot(i)) % 4096, 0u);
    std::memset(arena->slot(i), static_cast<int>(i + 1), arena->slot_bytes());
  }
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(arena->slot(i)[0], std::byte(i + 1));
    EXPECT_EQ(arena->slot(i)[arena->slot_bytes() - 1], std::byte(i + 1));
  }
  EXPECT_FALSE(arena->pinned());  // a device backend pins (hw/device_backend.h)
  auto iov = arena->iovecs();
  ASSERT_EQ(iov.size(), 1u);
  EXPECT_EQ(iov[0].iov_len, arena->size_bytes());
}

TEST(HostArena, HugePagesFallBackWhenUnavailable) {
  std::unique_ptr<HostArena> arena;
  ASSERT_TRUE(HostArena::Create({2 << 20, 2, true, true}, &arena).ok());
  // Either way the memory is usable; huge_pages() records which one we got.
  std::memset(arena->base(), 0x11, arena->size_bytes());
  EXPECT_EQ(arena->base()[arena->size_bytes() - 1], std::byte{0x11});
}

TEST(DeviceArena, HostMemoryStandsInForDeviceMemory) {
  std::unique_ptr<DeviceArena> arena;
  ASSERT_TRUE(DeviceArena::CreateOnHost(1000, 4, &arena).ok());
  EXPECT_TRUE(arena->on_host());
  EXPECT_EQ(arena->slot_bytes(), 1024u);
  std::set<std::byte*> seen;
  while (auto s = arena->slots().Allocate()) {
    std::memset(arena->slot(*s), 0x22, arena->slot_bytes());
    seen.insert(arena->slot(*s));
  }
  EXPECT_EQ(seen.size(), 4u);
}

TEST(DeviceArena, AnAdoptedAllocationIsReleasedOnce) {
  std::vector<std::byte> memory(4 * 512);
  int released = 0;
  {
    auto arena = DeviceArena::Adopt(memory.data(), 500, 4, [&](std::byte* base) {
      EXPECT_EQ(base, memory.data());
      ++released;
    });
    EXPECT_FALSE(arena->on_host());
    EXPECT_EQ(arena->slot_bytes(), 512u);
    EXPECT_EQ(arena->slot(3), memory.data() + 3 * 512);
  }
  EXPECT_EQ(released, 1);
}

}  // namespace
}  // namespace kvtier::hw
