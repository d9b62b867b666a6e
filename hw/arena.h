#pragma once
// Memory arenas with fixed-size slots: the pinned staging / CPU-tier arena on the host and the
// GPU cache arena (notes/hw-path.md section 6.3).
//
// HostArena: one anonymous mmap (MAP_HUGETLB tried first, then normal pages; MAP_POPULATE so no
// page fault lands in a timed region), carved into `slot_count` slots of `slot_bytes` (rounded
// up to 4 KiB, so every slot is O_DIRECT- and io_uring-fixed-buffer-friendly). A device backend
// that needs pinned memory pins it (hw/device_backend.h: the cuda backend cudaHostRegister's
// the whole range, so H2D copies from a slot are async DMAs) and says how to unpin it. The
// mmap'ed memory is anonymous, so it can also be registered with io_uring (`iovecs()`, pieces
// of at most 1 GiB).
//
// DeviceArena: one allocation carved into slots: device memory a device backend allocated
// (Adopt: one cudaMalloc on cuda), or, on the host backend (no GPU, CI), a separate host
// mapping standing in for device memory (CreateOnHost).
//
// Slot allocation is thread-safe (a mutex-guarded free list); the memory itself is the caller's
// to synchronise. Capacities come from the caller; nothing is allocated after Create.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/status.h"

namespace kvtier::hw {

// Fixed-size slot allocator over [0, slot_count). Thread-safe. Lowest free slot first, so
// allocation order is deterministic.
class SlotAllocator {
 public:
  explicit SlotAllocator(uint32_t slot_count);
  std::optional<uint32_t> Allocate();
  // REQUIRES: `slot` was allocated and not freed since (checked).
  void Free(uint32_t slot);
  uint32_t free_count() const;
  uint32_t slot_count() const { return slot_count_; }

 private:
  const uint32_t slot_count_;
  mutable std::mutex mu_;
  std::vector<uint32_t> free_;  // Kept as a max-heap of negated indices -> lowest first.
  std::vector<bool> used_;
};

struct HostArenaOptions {
  uint64_t slot_bytes = 0;  // REQUIRES: > 0; rounded up to 4 KiB.
  uint32_t slot_count = 0;  // REQUIRES: > 0.
  bool try_huge_pages = true;
  bool populate = true;       // MAP_POPULATE: fault every page in at Create.
};

class HostArena {
 public:
  // Fails with OutOfSpace when the mapping cannot be made (ENOMEM). Not pinned.
  static Status Create(const HostArenaOptions& options, std::unique_ptr<HostArena>* out);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  std::byte* base() const { return base_; }
  uint64_t size_bytes() const { return size_bytes_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  std::byte* slot(uint32_t index) const;  // REQUIRES: index < slot_count.
  SlotAllocator& slots() { return slots_; }
  bool huge_pages() const { return huge_pages_; }
  // Pinned by a device backend: `unpin(base())` runs at destruction, before the unmap.
  // REQUIRES: not pinned yet.
  void SetPinned(std::function<void(std::byte*)> unpin);
  bool pinned() const { return static_cast<bool>(unpin_); }
  // The arena as io_uring fixed buffers, split into pieces of at most 1 GiB.
  std::vector<iovec> iovecs() const;

 private:
  HostArena(std::byte* base, uint64_t size, uint64_t slot_bytes, uint32_t count, bool huge);
  std::byte* base_;
  uint64_t size_bytes_;
  uint64_t slot_bytes_;
  SlotAllocator slots_;
  bool huge_pages_;
  std::function<void(std::byte*)> unpin_;
};

class DeviceArena {
 public:
  // The bytes one slot of `slot_bytes` takes: rounded up to 256 (cudaMalloc's alignment; keeps
  // slots vector-aligned).
  static constexpr uint64_t SlotStride(uint64_t slot_bytes) {
    return (slot_bytes + 255) / 256 * 256;
  }
  // Host memory standing in for device memory (the host backend): a separate anonymous
  // mapping. InvalidArgument for 0 slots or bytes, OutOfSpace when the mapping fails.
  static Status CreateOnHost(uint64_t slot_bytes, uint32_t slot_count,
                             std::unique_ptr<DeviceArena>* out);
  // Device memory a backend allocated: `slot_count` slots of SlotStride(slot_bytes) from
  // `base`, released by `release(base)` at destruction.
  static std::unique_ptr<DeviceArena> Adopt(std::byte* base, uint64_t slot_bytes,
                                            uint32_t slot_count,
                                            std::function<void(std::byte*)> release);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // True for the host stand-in: base() may be dereferenced on the host.
  bool on_host() const { return on_host_; }
  // A device pointer (never dereference on the host) unless on_host().
  std::byte* base() const { return base_; }
  uint64_t size_bytes() const { return size_bytes_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  std::byte* slot(uint32_t index) const;
  SlotAllocator& slots() { return slots_; }

 private:
  DeviceArena(bool on_host, std::byte* base, uint64_t size, uint64_t slot_bytes, uint32_t count,
              std::function<void(std::byte*)> release);
  bool on_host_;
  std::byte* base_;
  uint64_t size_bytes_;
  uint64_t slot_bytes_;
  SlotAllocator slots_;
  std::function<void(std::byte*)> release_;
};

}  // namespace kvtier::hw
