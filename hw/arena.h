#pragma once
// Memory arenas with fixed-size slots: the pinned staging / CPU-tier arena on the host and the
// GPU cache arena (notes/hw-path.md section 6.3).
//
// HostArena: one anonymous mmap (MAP_HUGETLB tried first, then normal pages; MAP_POPULATE so no
// page fault lands in a timed region), carved into `slot_count` slots of `slot_bytes` (rounded
// up to 4 KiB, so every slot is O_DIRECT- and io_uring-fixed-buffer-friendly). When kvtier is
// built with CUDA and a device is present, the whole range is cudaHostRegister'ed (Portable):
// H2D copies from a slot are then async DMAs. The mmap'ed memory is anonymous, so it can also be
// registered with io_uring (`iovecs()`, pieces of at most 1 GiB).
//
// DeviceArena: one allocation carved into slots. The CUDA backend uses one cudaMalloc; the host
// backend (no GPU, CI) uses a separate host mmap standing in for device memory.
//
// Slot allocation is thread-safe (a mutex-guarded free list); the memory itself is the caller's
// to synchronise. Capacities come from the caller; nothing is allocated after Create.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
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
  bool cuda_register = true;  // cudaHostRegister when built with CUDA and a device is present.
};

class HostArena {
 public:
  // Fails with OutOfSpace when the mapping cannot be made (ENOMEM), CudaError when
  // cudaHostRegister fails on a present device.
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
  bool cuda_registered() const { return cuda_registered_; }
  // The arena as io_uring fixed buffers, split into pieces of at most 1 GiB.
  std::vector<iovec> iovecs() const;

 private:
  HostArena(std::byte* base, uint64_t size, uint64_t slot_bytes, uint32_t count, bool huge);
  std::byte* base_;
  uint64_t size_bytes_;
  uint64_t slot_bytes_;
  SlotAllocator slots_;
  bool huge_pages_;
  bool cuda_registered_ = false;
};

enum class DeviceBackendKind { kHost, kCuda };

class DeviceArena {
 public:
  // kCuda: one cudaMalloc (CudaError when it fails, Unavailable when built without CUDA).
  // kHost: host memory standing in for device memory.
  static Status Create(DeviceBackendKind kind, uint64_t slot_bytes, uint32_t slot_count,
                       std::unique_ptr<DeviceArena>* out);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  DeviceBackendKind kind() const { return kind_; }
  // A device pointer for kCuda (never dereference on the host), a host pointer for kHost.
  std::byte* base() const { return base_; }
  uint64_t size_bytes() const { return size_bytes_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  std::byte* slot(uint32_t index) const;
  SlotAllocator& slots() { return slots_; }

 private:
  DeviceArena(DeviceBackendKind kind, std::byte* base, uint64_t size, uint64_t slot_bytes,
              uint32_t count);
  DeviceBackendKind kind_;
  std::byte* base_;
  uint64_t size_bytes_;
  uint64_t slot_bytes_;
  SlotAllocator slots_;
};

// True when kvtier was built with CUDA and cudaGetDeviceCount reports at least one device.
bool CudaDevicePresent();

}  // namespace kvtier::hw
