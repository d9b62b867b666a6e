#include "hw/chunk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/check.h"
#include "hw/crc32c.h"

namespace kvtier::hw {
namespace {

constexpr uint32_t kRecordMagic = 0x4D54564Bu;  // "KVTM"
constexpr uint32_t kRecordPut = 1;
constexpr uint32_t kRecordRemove = 2;

// One manifest record. Fixed size, so a torn tail is any trailing partial or bad-CRC record.
struct Record {
  uint32_t magic;
  uint32_t type;
  uint64_t seq;
  uint64_t chunk_id;
  uint64_t offset;
  uint64_t length;
  uint32_t data_crc;
  uint32_t record_crc;  // CRC-32C of all bytes before this field.
};
static_assert(sizeof(Record) == 48, "manifest record layout is part of the on-disk format");
constexpr size_t kRecordCrcBytes = offsetof(Record, record_crc);

// Rewrite the log as a checkpoint on open when it holds this many records and mostly dead ones.
constexpr uint64_t kCheckpointMinRecords = 1024;

std::string ChunkName(ChunkId id) { return DescribeChunk(id); }

bool IsNoSpace(int err) { return err == ENOSPC || err == EDQUOT; }

Status ErrnoStatus(int err, const std::string& what) {
  if (IsNoSpace(err)) return Status::OutOfSpace(what + ": " + ErrnoText(err));
  return Status::IoError(what + ": " + ErrnoText(err));
}

Status FsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "open dir " + dir);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync dir " + dir);
  return Status::OK();
}

Record MakeRecord(uint32_t type, uint64_t seq, ChunkId id, const ChunkLocation& loc) {
  Record r;
  std::memset(&r, 0, sizeof(r));
  r.magic = kRecordMagic;
  r.type = type;
  r.seq = seq;
  r.chunk_id = id.value;
  r.offset = loc.offset;
  r.length = loc.length;
  r.data_crc = loc.crc32c;
  r.record_crc = Crc32c(&r, kRecordCrcBytes);
  return r;
}

}  // namespace

ChunkStore::ChunkStore(const ChunkStoreOptions& options)
    : options_(options),
      data_path_(options.dir + "/chunks.dat"),
      manifest_path_(options.dir + "/manifest.log"),
      capacity_bytes_(RoundUp(options.capacity_bytes, kChunkAlign)) {}

ChunkStore::~ChunkStore() = default;

Status ChunkStore::Open(const ChunkStoreOptions& options, std::unique_ptr<ChunkStore>* out) {
  if (options.dir.empty()) return Status::InvalidArgument("chunk store: empty dir");
  if (options.capacity_bytes == 0) {
    return Status::InvalidArgument("chunk store " + options.dir + ": capacity_bytes is 0");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return Status::IoError("chunk store: create dir " + options.dir + ": " + ec.message());
  std::unique_ptr<ChunkStore> store(new ChunkStore(options));
  KVTIER_RETURN_IF_ERROR(store->OpenFiles());
  KVTIER_RETURN_IF_ERROR(store->Replay());
  *out = std::move(store);
  return Status::OK();
}

Status ChunkStore::OpenFiles() {
  // Data file, O_DIRECT unless refused and allowed to fall back.
  int fd = ::open(data_path_.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EINVAL) {
    if (!options_.allow_buffered) {
      return Status::Unavailable("chunk store " + data_path_ +
                                 ": O_DIRECT refused by the file system (EINVAL); set "
                                 "allow_buffered to accept page-cache reads");
    }
    direct_io_ = false;
    fd = ::open(data_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  }
  if (fd < 0) return ErrnoStatus(errno, "chunk store: open " + data_path_);
  write_fd_.reset(fd);

  struct statx sx;
  std::memset(&sx, 0, sizeof(sx));
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_SIZE | STATX_BLOCKS, &sx) != 0) {
    return ErrnoStatus(errno, "chunk store: statx " + data_path_);
  }
  if (direct_io_ && (sx.stx_mask & STATX_DIOALIGN)) {
    dio_mem_align_ = sx.stx_dio_mem_align;
    dio_offset_align_ = sx.stx_dio_offset_align;
    const bool unsupported = dio_mem_align_ == 0 || dio_offset_align_ == 0;
    const bool too_coarse = dio_mem_align_ > kChunkAlign || dio_offset_align_ > kChunkAlign;
    if (unsupported || too_coarse) {
      if (!options_.allow_buffered) {
        return Status::Unavailable("chunk store " + data_path_ + ": statx DIOALIGN mem " +
                                   std::to_string(dio_mem_align_) + " offset " +
                                   std::to_string(dio_offset_align_) +
                                   (unsupported ? ": no direct I/O" : ": alignment above 4096") +
                                   "; set allow_buffered to accept page-cache reads");
      }
      direct_io_ = false;
      if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT) != 0) {
        return ErrnoStatus(errno, "chunk store: clear O_DIRECT on " + data_path_);
      }
    }
  }

  // Preallocate. Check free space first: a failing ext4 fallocate may keep what it allocated.
  if (sx.stx_size < capacity_bytes_) {
    struct statvfs vfs;
    if (::fstatvfs(fd, &vfs) != 0) return ErrnoStatus(errno, "chunk store: statvfs " + data_path_);
    const uint64_t have = sx.stx_blocks * 512;
    const uint64_t need = capacity_bytes_ > have ? capacity_bytes_ - have : 0;
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (need > avail) {
      return Status::OutOfSpace("chunk store " + data_path_ + ": capacity " +
                                std::to_string(capacity_bytes_) + " bytes needs " +
                                std::to_string(need) + " more, the file system has " +
                                std::to_string(avail));
    }
  }
  if (::fallocate(fd, 0, 0, static_cast<off_t>(capacity_bytes_)) != 0) {
    return ErrnoStatus(errno, "chunk store: fallocate " + std::to_string(capacity_bytes_) +
                                  " bytes for " + data_path_);
  }

  int rfd = ::open(data_path_.c_str(), O_RDONLY | O_CLOEXEC | (direct_io_ ? O_DIRECT : 0));
  if (rfd < 0) return ErrnoStatus(errno, "chunk store: open for read " + data_path_);
  read_fd_.reset(rfd);

  int lfd = ::open(manifest_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lfd < 0) return ErrnoStatus(errno, "chunk store: open " + manifest_path_);
  log_fd_.reset(lfd);
  return FsyncDir(options_.dir);
}

Status ChunkStore::Replay() {
  struct stat st;
  if (::fstat(log_fd_.get(), &st) != 0) return ErrnoStatus(errno, "fstat " + manifest_path_);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  std::vector<Record> records(file_bytes / sizeof(Record));
  size_t got = 0;
  auto* dst = reinterpret_cast<char*>(records.data());
  const size_t want = records.size() * sizeof(Record);
  while (got < want) {
    ssize_t n = ::pread(log_fd_.get(), dst + got, want - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read " + manifest_path_);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  records.resize(got / sizeof(Record));

  uint64_t valid = 0;
  for (const Record& r : records) {
    if (r.magic != kRecordMagic || r.record_crc != Crc32c(&r, kRecordCrcBytes) ||
        (r.type != kRecordPut && r.type != kRecordRemove)) {
      break;  // Torn or corrupt tail: everything from here on is ignored.
    }
    ++valid;
    next_seq_ = std::max(next_seq_, r.seq + 1);
    if (r.type == kRecordRemove) {
      chunks_.erase(ChunkId{r.chunk_id});
      continue;
    }
    ChunkLocation loc{r.offset, r.length, r.data_crc};
    if (!IsAligned(loc.offset, kChunkAlign) || loc.length == 0 ||
        loc.offset + loc.extent_bytes() > capacity_bytes_) {
      return Status::InvalidArgument(manifest_path_ + ": " + ChunkName(ChunkId{r.chunk_id}) +
                                     " at offset " + std::to_string(loc.offset) + " length " +
                                     std::to_string(loc.length) + " does not fit capacity " +
                                     std::to_string(capacity_bytes_));
    }
    chunks_[ChunkId{r.chunk_id}] = loc;
  }
  replayed_records_ = valid;
  log_records_ = valid;
  if (valid * sizeof(Record) != file_bytes) {
    truncated_torn_tail_ = true;
    if (::ftruncate(log_fd_.get(), static_cast<off_t>(valid * sizeof(Record))) != 0 ||
        ::fsync(log_fd_.get()) != 0) {
      return ErrnoStatus(errno, "truncate torn tail of " + manifest_path_);
    }
  }

  // Free extents are the gaps between live extents; overlapping live extents mean a bug.
  std::vector<std::pair<uint64_t, ChunkId>> by_offset;
  by_offset.reserve(chunks_.size());
  for (const auto& [id, loc] : chunks_) by_offset.emplace_back(loc.offset, id);
  std::sort(by_offset.begin(), by_offset.end());
  uint64_t cursor = 0;
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const ChunkLocation& loc = chunks_[by_offset[i].second];
    if (loc.offset < cursor) {
      return Status::IoError(manifest_path_ + ": " + ChunkName(by_offset[i].second) + " overlaps " +
                             ChunkName(by_offset[i - 1].second));
    }
    if (loc.offset > cursor) free_[cursor] = loc.offset - cursor;
    cursor = loc.offset + loc.extent_bytes();
  }
  if (cursor < capacity_bytes_) free_[cursor] = capacity_bytes_ - cursor;

  KVTIER_RETURN_IF_ERROR(VerifyLiveChunks());
  if (log_records_ >= kCheckpointMinRecords && log_records_ > 4 * chunks_.size()) {
    KVTIER_RETURN_IF_ERROR(Checkpoint());
  }
  return Status::OK();
}

// A record is written only after its bytes were (Put), but "written" is what the device said:
// a write it acknowledged and did not finish, a power loss with sync = false, or corruption at
// rest leaves a record pointing at other bytes. Every live chunk is read back (in offset order)
// and checked against its CRC-32C; one that fails is dropped. The remove records are durable
// before this returns, so no dropped record can come back over a reused extent.
Status ChunkStore::VerifyLiveChunks() {
  std::vector<std::pair<uint64_t, ChunkId>> by_offset;
  by_offset.reserve(chunks_.size());
  uint64_t largest = 0;
  for (const auto& [id, loc] : chunks_) {
    by_offset.emplace_back(loc.offset, id);
    largest = std::max(largest, loc.extent_bytes());
  }
  if (by_offset.empty()) return Status::OK();
  std::sort(by_offset.begin(), by_offset.end());
  // Neighbouring extents are read together, up to kVerifySpan bytes per read and never across a
  // gap above kVerifyGap: one 24 KiB pread per chunk ran at 0.11 GB/s on this VM's disk.
  constexpr uint64_t kVerifySpan = 8ull << 20, kVerifyGap = 1ull << 20;
  AlignedBuffer buf = AllocateAligned(std::max(largest, kVerifySpan), kChunkAlign);
  if (!buf) return Status::Internal("chunk store: cannot allocate a verification buffer");
  std::vector<ChunkId> bad;
  auto check = [&](ChunkId id, const ChunkLocation& loc, Status s, const std::byte* bytes) {
    if (s.ok()) s = CheckChunkCrc(id, loc, bytes, data_path_);
    if (s.ok()) return;
    bad.push_back(id);
    dropped_on_open_.push_back(std::move(s));
  };
  for (size_t i = 0; i < by_offset.size();) {
    const uint64_t start = by_offset[i].first;
    uint64_t end = start;
    size_t j = i;
    for (; j < by_offset.size(); ++j) {
      const ChunkLocation& loc = chunks_[by_offset[j].second];
      const uint64_t e = loc.offset + loc.extent_bytes();
      if (j > i && (e - start > kVerifySpan || loc.offset > end + kVerifyGap)) break;
      end = std::max(end, e);
    }
    ChunkLocation span{start, end - start, 0};
    if (ReadExtent(by_offset[i].second, span, buf.get()).ok()) {
      for (size_t k = i; k < j; ++k) {
        const ChunkLocation& loc = chunks_[by_offset[k].second];
        check(by_offset[k].second, loc, Status::OK(), buf.get() + (loc.offset - start));
      }
    } else {  // read chunk by chunk, so an unreadable block drops only its chunk
      for (size_t k = i; k < j; ++k) {
        const ChunkLocation& loc = chunks_[by_offset[k].second];
        check(by_offset[k].second, loc, ReadExtent(by_offset[k].second, loc, buf.get()),
              buf.get());
      }
    }
    i = j;
  }
  for (ChunkId id : bad) {
    KVTIER_RETURN_IF_ERROR(AppendRecord(kRecordRemove, id, ChunkLocation{}));
    const ChunkLocation loc = chunks_[id];
    chunks_.erase(id);
    FreeExtent(loc.offset, loc.extent_bytes());
  }
  if (!bad.empty() && !options_.sync && ::fdatasync(log_fd_.get()) != 0) {
    return ErrnoStatus(errno, "fdatasync " + manifest_path_ + " after dropping " +
                                  std::to_string(bad.size()) + " chunks");
  }
  return Status::OK();
}

Status ChunkStore::Checkpoint() {
  // Write the live set to a temp file, make it durable, then atomically replace the log.
  const std::string tmp = manifest_path_ + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, "checkpoint: open " + tmp);
  std::vector<Record> records;
  records.reserve(chunks_.size());
  for (const auto& [id, loc] : chunks_) {
    records.push_back(MakeRecord(kRecordPut, next_seq_++, id, loc));
  }
  if (int err = PwriteAll(fd.get(), records.data(), records.size() * sizeof(Record), 0)) {
    return ErrnoStatus(err, "checkpoint: write " + tmp);
  }
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "checkpoint: fsync " + tmp);
  if (::rename(tmp.c_str(), manifest_path_.c_str()) != 0) {
    return ErrnoStatus(errno, "checkpoint: rename " + tmp + " to " + manifest_path_);
  }
  KVTIER_RETURN_IF_ERROR(FsyncDir(options_.dir));
  // The new log is open as `fd` (O_WRONLY); reopen read-write for later appends.
  int lfd = ::open(manifest_path_.c_str(), O_RDWR | O_CLOEXEC);
  if (lfd < 0) return ErrnoStatus(errno, "checkpoint: reopen " + manifest_path_);
  log_fd_.reset(lfd);
  log_records_ = records.size();
  return Status::OK();
}

Status ChunkStore::AppendRecord(uint32_t type, ChunkId id, const ChunkLocation& loc) {
  const Record r = MakeRecord(type, next_seq_, id, loc);
  const uint64_t at = log_records_ * sizeof(Record);
  if (int err = PwriteAll(log_fd_.get(), &r, sizeof(r), at)) {
    // Cut off a partial record so later appends are not hidden behind a torn record.
    (void)!::ftruncate(log_fd_.get(), static_cast<off_t>(at));
    return ErrnoStatus(err, ChunkName(id) + ": append manifest record to " + manifest_path_);
  }
  if (options_.sync && ::fdatasync(log_fd_.get()) != 0) {
    const int err = errno;
    (void)!::ftruncate(log_fd_.get(), static_cast<off_t>(at));
    return ErrnoStatus(err, ChunkName(id) + ": fdatasync " + manifest_path_);
  }
  ++next_seq_;
  ++log_records_;
  return Status::OK();
}

std::optional<uint64_t> ChunkStore::AllocateExtent(uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit
    if (it->second < bytes) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_[offset + bytes] = rest;
    return offset;
  }
  return std::nullopt;
}

void ChunkStore::FreeExtent(uint64_t offset, uint64_t bytes) {
  auto next = free_.lower_bound(offset);
  KVTIER_DCHECK(next == free_.end() || next->first >= offset + bytes, "double free of extent");
  if (next != free_.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    KVTIER_DCHECK(prev->first + prev->second <= offset, "double free of extent");
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_[offset] = bytes;
}

Status ChunkStore::Put(ChunkId id, std::span<const std::byte> data) {
  if (data.empty()) return Status::InvalidArgument(ChunkName(id) + ": empty put");
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t extent = RoundUp(data.size(), kChunkAlign);
  std::optional<uint64_t> offset = AllocateExtent(extent);
  if (!offset) {
    uint64_t largest = 0;
    for (const auto& [off, bytes] : free_) largest = std::max(largest, bytes);
    return Status::OutOfSpace(ChunkName(id) + ": needs " + std::to_string(extent) +
                              " bytes, largest free extent " + std::to_string(largest) +
                              " of capacity " + std::to_string(capacity_bytes_) + " in " +
                              data_path_);
  }
  if (bounce_bytes_ < extent) {
    bounce_ = AllocateAligned(extent, kChunkAlign);
    if (!bounce_) {
      bounce_bytes_ = 0;
      FreeExtent(*offset, extent);
      return Status::Internal(ChunkName(id) + ": cannot allocate a " + std::to_string(extent) +
                              "-byte write buffer");
    }
    bounce_bytes_ = extent;
  }
  std::memcpy(bounce_.get(), data.data(), data.size());
  std::memset(bounce_.get() + data.size(), 0, extent - data.size());

  const std::span<const std::byte> bytes(bounce_.get(), extent);
  const int write_err =
      options_.write_hook == nullptr
          ? PwriteAll(write_fd_.get(), bytes.data(), bytes.size(), *offset)
          : options_.write_hook->WriteExtent(id, write_fd_.get(), bytes, *offset);
  if (int err = write_err) {
    FreeExtent(*offset, extent);
    return ErrnoStatus(err, ChunkName(id) + ": write " + std::to_string(extent) +
                                " bytes at offset " + std::to_string(*offset) + " of " +
                                data_path_);
  }
  // The data must be durable before a record can point at it.
  if (options_.sync && ::fdatasync(write_fd_.get()) != 0) {
    const int err = errno;
    FreeExtent(*offset, extent);
    return ErrnoStatus(err, ChunkName(id) + ": fdatasync " + data_path_);
  }
  const ChunkLocation loc{*offset, data.size(), Crc32c(data.data(), data.size())};
  if (Status s = AppendRecord(kRecordPut, id, loc); !s.ok()) {
    FreeExtent(*offset, extent);
    return s;
  }
  auto it = chunks_.find(id);
  if (it != chunks_.end()) {
    FreeExtent(it->second.offset, it->second.extent_bytes());  // old version, now unreferenced
    it->second = loc;
  } else {
    chunks_.emplace(id, loc);
  }
  return Status::OK();
}

Status ChunkStore::Remove(ChunkId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return Status::NotFound(ChunkName(id) + ": not in " + data_path_);
  KVTIER_RETURN_IF_ERROR(AppendRecord(kRecordRemove, id, ChunkLocation{}));
  FreeExtent(it->second.offset, it->second.extent_bytes());
  chunks_.erase(it);
  return Status::OK();
}

Status ChunkStore::Get(ChunkId id, std::span<std::byte> dst) const {
  std::optional<ChunkLocation> loc = Lookup(id);
  if (!loc) return Status::NotFound(ChunkName(id) + ": not in " + data_path_);
  if (dst.size() < loc->length) {
    return Status::InvalidArgument(ChunkName(id) + ": destination holds " +
                                   std::to_string(dst.size()) + " < " +
                                   std::to_string(loc->length) + " bytes");
  }
  AlignedBuffer buf = AllocateAligned(loc->extent_bytes(), kChunkAlign);
  if (!buf) return Status::Internal(ChunkName(id) + ": cannot allocate a read buffer");
  KVTIER_RETURN_IF_ERROR(ReadExtent(id, *loc, buf.get()));
  KVTIER_RETURN_IF_ERROR(CheckChunkCrc(id, *loc, buf.get(), data_path_));
  std::memcpy(dst.data(), buf.get(), loc->length);
  return Status::OK();
}

Status ChunkStore::ReadExtent(ChunkId id, const ChunkLocation& loc, std::byte* buf) const {
  const uint64_t extent = loc.extent_bytes();
  uint64_t got = 0;
  while (got < extent) {
    ssize_t n = ::pread(read_fd_.get(), buf + got, extent - got,
                        static_cast<off_t>(loc.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoStatus(errno, ChunkName(id) + ": read " + std::to_string(extent) +
                                    " bytes at offset " + std::to_string(loc.offset) + " of " +
                                    data_path_);
    }
    if (n == 0) {
      return Status::IoError(ChunkName(id) + ": short read " + std::to_string(got) + " < " +
                             std::to_string(extent) + " bytes at offset " +
                             std::to_string(loc.offset) + " of " + data_path_);
    }
    got += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status CheckChunkCrc(ChunkId id, const ChunkLocation& loc, const std::byte* data,
                     const std::string& path) {
  const uint32_t crc = Crc32c(data, loc.length);
  if (crc == loc.crc32c) return Status::OK();
  char hex[64];
  std::snprintf(hex, sizeof hex, "CRC-32C 0x%08x", crc);
  std::string msg = ChunkName(id) + ": checksum mismatch: " + hex + " of the " +
                    std::to_string(loc.length) + " bytes read at offset " +
                    std::to_string(loc.offset) + " of " + path;
  std::snprintf(hex, sizeof hex, ", 0x%08x recorded", loc.crc32c);
  return Status::IoError(msg + hex);
}

std::optional<ChunkLocation> ChunkStore::Lookup(ChunkId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return std::nullopt;
  return it->second;
}

std::vector<ChunkId> ChunkStore::ChunkIds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ChunkId> ids;
  ids.reserve(chunks_.size());
  for (const auto& [id, loc] : chunks_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

size_t ChunkStore::chunk_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.size();
}

uint64_t ChunkStore::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t used = 0;
  for (const auto& [id, loc] : chunks_) used += loc.extent_bytes();
  return used;
}

uint64_t ChunkStore::largest_free_extent() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t largest = 0;
  for (const auto& [off, bytes] : free_) largest = std::max(largest, bytes);
  return largest;
}

}  // namespace kvtier::hw
