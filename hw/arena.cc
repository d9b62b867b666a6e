#include "hw/arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <functional>

#include "core/check.h"
#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kHugePage = 2ull << 20;
constexpr uint64_t kMaxFixedBuffer = 1ull << 30;  // io_uring's per-buffer limit

// Maps `bytes` of anonymous memory, huge pages first when asked. Returns nullptr + errno.
std::byte* MapAnonymous(uint64_t bytes, bool try_huge, bool populate, bool* huge) {
  const int base_flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0);
  *huge = false;
  if (try_huge && bytes % kHugePage == 0) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, base_flags | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
      *huge = true;
      return static_cast<std::byte*>(p);
    }
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, base_flags, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

}  // namespace

SlotAllocator::SlotAllocator(uint32_t slot_count) : slot_count_(slot_count), used_(slot_count) {
  free_.reserve(slot_count);
  for (uint32_t i = 0; i < slot_count; ++i) free_.push_back(i);
  std::make_heap(free_.begin(), free_.end(), std::greater<>());  // min-heap: lowest slot first
}

std::optional<uint32_t> SlotAllocator::Allocate() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return std::nullopt;
  std::pop_heap(free_.begin(), free_.end(), std::greater<>());
  const uint32_t slot = free_.back();
  free_.pop_back();
  used_[slot] = true;
  return slot;
}

void SlotAllocator::Free(uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  KVTIER_CHECK(slot < slot_count_ && used_[slot], "freeing a slot that is not allocated");
  used_[slot] = false;
  free_.push_back(slot);
  std::push_heap(free_.begin(), free_.end(), std::greater<>());
}

uint32_t SlotAllocator::free_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(free_.size());
}

// --- HostArena ----------------------------------------------------------------------------------

HostArena::HostArena(std::byte* base, uint64_t size, uint64_t slot_bytes, uint32_t count, bool huge)
    : base_(base), size_bytes_(size), slot_bytes_(slot_bytes), slots_(count), huge_pages_(huge) {}

Status HostArena::Create(const HostArenaOptions& o, std::unique_ptr<HostArena>* out) {
  if (o.slot_bytes == 0 || o.slot_count == 0) {
    return Status::InvalidArgument("host arena: slot_bytes and slot_count must be > 0");
  }
  const uint64_t slot_bytes = RoundUp(o.slot_bytes, kPage);
  const uint64_t bytes = slot_bytes * o.slot_count;
  bool huge = false;
  std::byte* base = MapAnonymous(bytes, o.try_huge_pages, o.populate, &huge);
  if (base == nullptr) {
    return Status::OutOfSpace("host arena: mmap " + std::to_string(bytes) +
                              " bytes: " + ErrnoText(errno));
  }
  out->reset(new HostArena(base, bytes, slot_bytes, o.slot_count, huge));
  return Status::OK();
}

HostArena::~HostArena() {
  if (unpin_) unpin_(base_);
  ::munmap(base_, size_bytes_);
}

void HostArena::SetPinned(std::function<void(std::byte*)> unpin) {
  KVTIER_CHECK(!unpin_, "host arena pinned twice");
  unpin_ = std::move(unpin);
}

std::byte* HostArena::slot(uint32_t index) const {
  KVTIER_DCHECK(index < slots_.slot_count(), "host arena slot out of range");
  return base_ + static_cast<uint64_t>(index) * slot_bytes_;
}

std::vector<iovec> HostArena::iovecs() const {
  std::vector<iovec> v;
  for (uint64_t off = 0; off < size_bytes_; off += kMaxFixedBuffer) {
    v.push_back(iovec{base_ + off, std::min(kMaxFixedBuffer, size_bytes_ - off)});
  }
  return v;
}

// --- DeviceArena --------------------------------------------------------------------------------

DeviceArena::DeviceArena(bool on_host, std::byte* base, uint64_t size, uint64_t slot_bytes,
                         uint32_t count, std::function<void(std::byte*)> release)
    : on_host_(on_host), base_(base), size_bytes_(size), slot_bytes_(slot_bytes), slots_(count),
      release_(std::move(release)) {}

Status DeviceArena::CreateOnHost(uint64_t slot_bytes, uint32_t slot_count,
                                 std::unique_ptr<DeviceArena>* out) {
  if (slot_bytes == 0 || slot_count == 0) {
    return Status::InvalidArgument("device arena: slot_bytes and slot_count must be > 0");
  }
  slot_bytes = SlotStride(slot_bytes);
  const uint64_t bytes = slot_bytes * slot_count;
  bool huge = false;
  std::byte* base =
      MapAnonymous(RoundUp(bytes, kPage), /*try_huge=*/false, /*populate=*/true, &huge);
  if (base == nullptr) {
    return Status::OutOfSpace("device arena (host backend): mmap " + std::to_string(bytes) +
                              " bytes: " + ErrnoText(errno));
  }
  const uint64_t mapped = RoundUp(bytes, kPage);
  out->reset(new DeviceArena(/*on_host=*/true, base, bytes, slot_bytes, slot_count,
                             [mapped](std::byte* b) { ::munmap(b, mapped); }));
  return Status::OK();
}

std::unique_ptr<DeviceArena> DeviceArena::Adopt(std::byte* base, uint64_t slot_bytes,
                                                uint32_t slot_count,
                                                std::function<void(std::byte*)> release) {
  slot_bytes = SlotStride(slot_bytes);
  return std::unique_ptr<DeviceArena>(new DeviceArena(/*on_host=*/false, base,
                                                      slot_bytes * slot_count, slot_bytes,
                                                      slot_count, std::move(release)));
}

DeviceArena::~DeviceArena() {
  if (release_) release_(base_);
}

std::byte* DeviceArena::slot(uint32_t index) const {
  KVTIER_DCHECK(index < slots_.slot_count(), "device arena slot out of range");
  return base_ + static_cast<uint64_t>(index) * slot_bytes_;
}

}  // namespace kvtier::hw
