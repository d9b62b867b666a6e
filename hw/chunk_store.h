#pragma once
// ChunkStore: the SSD tier's on-disk home for prefix-KV chunks.
//
// A chunk is an opaque byte record (up to a few MiB) named by a 64-bit chunk id. All chunks live
// in one preallocated data file (`<dir>/chunks.dat`, fallocate'd to `capacity_bytes` at open) in
// 4 KiB-aligned extents handed out by a first-fit extent allocator that coalesces on free. Data
// is written with O_DIRECT from an aligned bounce buffer; readers (the IoEngine) read the same
// file with O_DIRECT through `read_fd()` at the offsets `Lookup` returns.
//
// Crash consistency. The manifest (`<dir>/manifest.log`) is an append-only log of fixed-size
// records (put: id -> offset, length, CRC-32C of the bytes; remove: id), each carrying its own
// CRC. A put writes the data into a free extent, fdatasyncs the data file, and only then appends
// the record and fdatasyncs the log. A writer killed at any point therefore leaves either no
// record for the new bytes (the extent is simply free again after reopen) or a complete record
// pointing at durable bytes. A torn or corrupt tail record is ignored and cut off on reopen. An
// extent freed by a replace or remove is reused only after the record that frees it is durable,
// so no live record ever points at an extent being overwritten. Reopen also rewrites the log as a
// compact checkpoint (write temp, fsync, rename, fsync dir) when most of it is dead records.
// With `sync = false` the fdatasyncs are skipped: still safe against a killed process (the page
// cache survives), not against power loss.
//
// Checksums. Every put record carries the CRC-32C of the chunk's bytes. `Get` checks it on every
// read (the executor checks it on every whole-chunk read it makes through the IoEngine:
// CheckChunkCrc). Reopening reads every live chunk back and checks it too, so a record that
// points at bytes which never landed whole -- a torn write the device acknowledged, a power loss
// with `sync = false`, corruption at rest -- is never accepted: such a chunk is dropped (a remove
// record is appended and made durable before its extent can be reused) and listed in
// `dropped_on_open()`. Opening therefore reads the store's live bytes once (setup cost,
// proportional to what is stored; nothing for a new store).
//
// Errors. A full store or a full disk is `Status::OutOfSpace` naming the chunk; failed I/O is
// `IoError` naming the chunk, the file and the errno text. O_DIRECT is required: `Open` checks
// `statx(STATX_DIOALIGN)` and refuses a file system without direct I/O (or with an alignment
// above 4 KiB) unless `allow_buffered` is set, in which case `direct_io()` reports false and the
// caller must record that its "SSD" reads may be page-cache reads.
//
// Thread safety: all methods are thread-safe (one internal mutex serialises writers; `Lookup`
// and the accessors take it too). Reads through `read_fd()` may run concurrently with puts of
// other chunks; a chunk being replaced or removed must not be read at the same time (the caller's
// cache policy owns that).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/types.h"
#include "hw/posix_util.h"

namespace kvtier::hw {

// How every hw/ error names a chunk (core/types.h).
using kvtier::DescribeChunk;

// Every extent offset and allocation size is a multiple of this (page and NVMe LBA size).
inline constexpr uint64_t kChunkAlign = 4096;

// The seam fault injection writes through (hw/fault_injection.h): when ChunkStoreOptions::
// write_hook is set, Put writes a chunk's extent with it instead of pwrite. Production runs
// never set it (a plain pwrite, no indirection).
class ChunkWriteHook {
 public:
  virtual ~ChunkWriteHook() = default;
  // Writes `extent` (the chunk's bytes, zero-padded to a multiple of kChunkAlign) at `offset` of
  // `fd`, as PwriteAll would: `fd` may be O_DIRECT, so a partial write must stay
  // kChunkAlign-aligned. Returns 0 when every byte was written, else the errno that stopped it
  // (some bytes may have landed: a torn write). It may also never return (a killed process).
  // Called with the store's lock held, from the thread calling Put.
  virtual int WriteExtent(ChunkId id, int fd, std::span<const std::byte> extent,
                          uint64_t offset) = 0;
};

struct ChunkStoreOptions {
  std::string dir;              // Created if missing. Holds chunks.dat and manifest.log.
  uint64_t capacity_bytes = 0;  // Data file size; rounded up to kChunkAlign. REQUIRES: > 0.
  bool allow_buffered = false;  // Accept a file system that refuses O_DIRECT (recorded).
  bool sync = true;             // fdatasync data before each manifest record, and the record.
  ChunkWriteHook* write_hook = nullptr;  // Fault injection only; not owned, outlives the store.
};

// Where a chunk's bytes are: `length` bytes at `offset` (kChunkAlign-aligned); the extent holds
// RoundUp(length, kChunkAlign) bytes, zero-padded.
struct ChunkLocation {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t crc32c = 0;
  uint64_t extent_bytes() const { return RoundUp(length, kChunkAlign); }
};

// OK when the `loc.length` bytes at `data` have the CRC-32C `loc` records for chunk `id`;
// otherwise IoError "chunk ...: checksum mismatch: CRC-32C 0x... of the N bytes read at offset O
// of `path`, 0x... recorded".
Status CheckChunkCrc(ChunkId id, const ChunkLocation& loc, const std::byte* data,
                     const std::string& path);

class ChunkStore {
 public:
  // Opens (or creates) the store in `options.dir`, replays the manifest, reads every live chunk
  // back against its checksum (dropping those that fail: dropped_on_open()) and rebuilds the
  // free extents. Fails with InvalidArgument for bad options, OutOfSpace when the disk cannot hold
  // `capacity_bytes`, IoError for I/O failures or an unusable (overlapping) manifest, and
  // Unavailable when O_DIRECT is refused and `allow_buffered` is false.
  static Status Open(const ChunkStoreOptions& options, std::unique_ptr<ChunkStore>* out);

  ~ChunkStore();
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  // Stores `data` as chunk `id`, replacing any previous version (written to a new extent; the
  // old extent is freed once the new record is durable: this is how a repack rewrites a chunk).
  // OutOfSpace when no free extent is large enough. REQUIRES: !data.empty().
  Status Put(ChunkId id, std::span<const std::byte> data);

  // Forgets chunk `id` and frees its extent. NotFound when absent.
  Status Remove(ChunkId id);

  // Reads chunk `id` synchronously (O_DIRECT when available) into `dst` and checks its CRC.
  // REQUIRES: dst.size() >= the chunk's length. NotFound, IoError (short read, checksum
  // mismatch, errno) otherwise. For tests and simple callers; the hot path uses the IoEngine.
  Status Get(ChunkId id, std::span<std::byte> dst) const;

  std::optional<ChunkLocation> Lookup(ChunkId id) const;
  std::vector<ChunkId> ChunkIds() const;  // Sorted.
  size_t chunk_count() const;

  // The data file opened read-only (O_DIRECT when direct_io()); valid for the store's lifetime.
  int read_fd() const { return read_fd_.get(); }
  const std::string& data_path() const { return data_path_; }
  bool direct_io() const { return direct_io_; }
  // statx(STATX_DIOALIGN) values at open (0 when the file system does not report them).
  uint32_t dio_mem_align() const { return dio_mem_align_; }
  uint32_t dio_offset_align() const { return dio_offset_align_; }

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t used_bytes() const;           // Sum of live extents.
  uint64_t largest_free_extent() const;  // The largest chunk a Put can take now.
  // Manifest records replayed at open, and whether the torn-tail rule cut anything off.
  uint64_t replayed_records() const { return replayed_records_; }
  bool truncated_torn_tail() const { return truncated_torn_tail_; }
  // Chunks the manifest listed whose bytes did not read back intact at open (checksum mismatch
  // or a failed read), one Status each naming the chunk and why; they were dropped.
  const std::vector<Status>& dropped_on_open() const { return dropped_on_open_; }

 private:
  explicit ChunkStore(const ChunkStoreOptions& options);
  Status OpenFiles();
  Status Replay();
  Status VerifyLiveChunks();
  Status ReadExtent(ChunkId id, const ChunkLocation& loc, std::byte* buf) const;
  Status Checkpoint();
  Status AppendRecord(uint32_t type, ChunkId id, const ChunkLocation& loc);
  std::optional<uint64_t> AllocateExtent(uint64_t bytes);
  void FreeExtent(uint64_t offset, uint64_t bytes);

  const ChunkStoreOptions options_;
  std::string data_path_;
  std::string manifest_path_;
  uint64_t capacity_bytes_ = 0;
  UniqueFd write_fd_;
  UniqueFd read_fd_;
  UniqueFd log_fd_;
  bool direct_io_ = true;
  uint32_t dio_mem_align_ = 0;
  uint32_t dio_offset_align_ = 0;
  uint64_t replayed_records_ = 0;
  bool truncated_torn_tail_ = false;
  std::vector<Status> dropped_on_open_;

  mutable std::mutex mu_;
  std::unordered_map<ChunkId, ChunkLocation> chunks_;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, coalesced
  uint64_t next_seq_ = 1;
  uint64_t log_records_ = 0;
  AlignedBuffer bounce_;
  size_t bounce_bytes_ = 0;
};

}  // namespace kvtier::hw
