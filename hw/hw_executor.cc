#include "hw/hw_executor.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/errors.h"
#include "core/op_graph.h"
#include "hw/arena.h"
#include "hw/chunk_store.h"
#include "hw/decode_home.h"
#include "hw/fault_injection.h"
#include "hw/posix_util.h"
#include "models/layer_table.h"

namespace kvtier::hw {

namespace {

std::uint64_t Mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

IoClass ClassOf(Purpose p) {
  switch (p) {
    case Purpose::kDemand:
    case Purpose::kCakeLoad: return IoClass::kDemand;
    case Purpose::kProbe: return IoClass::kProbe;
    default: return IoClass::kPrefetch;
  }
}

// Which chunks a failed copy or gather was moving, for its error (the device's own text names
// none): "chunk 0x... (segment 1, layer 0, K, index 0)", with "and N more" for several.
// Empty for an op that lists no chunks (a bytes-only copy).
std::string ChunksMoved(const TransferOp& op) {
  if (op.chunks.empty()) return {};
  std::string s = DescribeChunk(op.chunks.front().chunk);
  if (op.chunks.size() > 1) s += " and " + std::to_string(op.chunks.size() - 1) + " more";
  return s;
}

Status NameChunks(Status s, const TransferOp& op) {
  if (s.ok() || op.chunks.empty()) return s;
  return s.Annotate(ChunksMoved(op));
}

// A resource served in FIFO order, one job at a time (a "stream", notes/hw-path.md 6.6): a
// persistent worker thread, which a caller may stand in for. Run(job, inline_ok) runs the job
// on the calling thread when that is allowed and the lane is idle (nothing running, nothing
// queued) -- a completion then starts the next stage without waking another thread -- and
// otherwise queues it for the lane's thread. Jobs queued while a caller runs one inline are
// taken by the lane's thread once it is done, so the order stays FIFO. A lane's own thread,
// and a caller while it runs a job inline, never run another job inline: that would hold up
// the lane it serves (an H2D lane running a D2H would stop the two directions overlapping, a
// gather lane running the copy after it would stop gathers and copies overlapping), so only
// threads outside the lanes -- the I/O engine's, completing a read -- start a stage inline.
class Lane {
 public:
  Lane() : thread_([this] { Loop(); }) {}
  // Returns once the lane's thread and any caller running a job inline are done.
  ~Lane() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();  // it leaves only when nothing runs (busy_ false) and nothing is queued
  }
  void Run(std::function<void()> job, bool inline_ok) {
    std::unique_lock<std::mutex> l(mu_);
    if (inline_ok && !busy_ && jobs_.empty() && !tl_serving) {
      busy_ = true;
      l.unlock();
      tl_serving = true;
      job();
      tl_serving = false;
      l.lock();
      busy_ = false;
    } else {
      jobs_.push_back(std::move(job));
    }
    // Under the lock: once it is released the job may be done and the lane destroyed.
    if (!busy_ && (stop_ || !jobs_.empty())) cv_.notify_one();
  }
  // True on a thread serving a lane (its own thread, or a caller running a job inline).
  static thread_local bool tl_serving;

 private:
  void Loop() {
    PreciseTimers();
    tl_serving = true;
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return !busy_ && (stop_ || !jobs_.empty()); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      l.unlock();
      job();
      l.lock();
      busy_ = false;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false;  // a job is running (on the lane's thread or inline on a caller's)
  bool stop_ = false;
  std::thread thread_;
};
thread_local bool Lane::tl_serving = false;

// A byte ring inside one arena slot: allocations are 4 KiB-aligned and wrap around. A consumer
// can tell whether its bytes were overwritten: a later allocation reached past the piece's first
// byte plus the ring's size. The stamp is the byte count before the piece (its start): compared
// with its end, as before, a later piece overlapping the first `bytes` of it went unseen when
// pieces differ in size (probe-key and K/V chunks), and a read checked bytes another read had
// landed on -- `hw.ring = 400000B` failed spec with "content check failed", exit 3.
struct Ring {
  std::byte* base = nullptr;
  Bytes size = 0;
  Bytes pos = 0;
  std::uint64_t total = 0;  // bytes handed out so far
  std::mutex mu;

  std::pair<std::byte*, std::uint64_t> Allocate(Bytes bytes) {
    bytes = RoundUp(std::max<Bytes>(bytes, 1), kChunkAlign);
    std::lock_guard<std::mutex> l(mu);
    if (bytes > size) bytes = size;  // callers split larger copies into pieces
    if (pos + bytes > size) {
      total += size - pos;
      pos = 0;
    }
    std::byte* p = base + pos;
    const std::uint64_t start = total;
    pos += bytes;
    total += bytes;
    return {p, start};
  }
  bool Overwritten(std::uint64_t start) {
    std::lock_guard<std::mutex> l(mu);
    return total - start > size;
  }
};

}  // namespace

void FillChunkContent(ChunkId id, Bytes length, std::byte* dst) {
  const Bytes words = length / 8;
  std::uint64_t* w = reinterpret_cast<std::uint64_t*>(dst);
  const std::uint64_t seed = Mix(id.value);
  if (words > 0) w[0] = id.value;
  if (words > 1) w[1] = length;
  for (Bytes i = 2; i < words; ++i) w[i] = seed ^ (i * 0xD6E8FEB86659FD93ull);
  for (Bytes i = words * 8; i < length; ++i) dst[i] = std::byte(seed >> (8 * (i % 8)));
}

Status CheckChunkContent(ChunkId id, Bytes length, const std::byte* data, bool full) {
  const std::uint64_t* w = reinterpret_cast<const std::uint64_t*>(data);
  if (length >= 16 && (w[0] != id.value || w[1] != length)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "header holds id 0x%016llx length %llu",
                  (unsigned long long)w[0], (unsigned long long)w[1]);
    return Status::IoError(DescribeChunk(id) + ": content check failed: " + buf);
  }
  if (!full) return Status::OK();
  const std::uint64_t seed = Mix(id.value);
  const Bytes words = length / 8;
  for (Bytes i = 2; i < words; ++i) {
    if (w[i] != (seed ^ (i * 0xD6E8FEB86659FD93ull))) {
      return Status::IoError(DescribeChunk(id) + ": content check failed at byte " +
                             std::to_string(i * 8));
    }
  }
  for (Bytes i = words * 8; i < length; ++i) {
    if (data[i] != std::byte(seed >> (8 * (i % 8)))) {
      return Status::IoError(DescribeChunk(id) + ": content check failed at byte " +
                             std::to_string(i));
    }
  }
  return Status::OK();
}

Status CheckChunkRange(ChunkId id, Bytes length, const std::byte* chunk, Bytes begin, Bytes end,
                       bool full) {
  end = std::min(end, length);
  if (begin >= end) return Status::OK();
  if (!full) end = std::min(end, begin + 16);  // the range's first words: a cheap check
  const std::uint64_t seed = Mix(id.value);
  const Bytes words = length / 8;
  auto expected = [&](Bytes i) {  // byte i of FillChunkContent(id, length)
    if (i >= words * 8) return std::byte(seed >> (8 * (i % 8)));
    const Bytes w = i / 8;
    const std::uint64_t v = w == 0 ? id.value : w == 1 ? length : seed ^ (w * 0xD6E8FEB86659FD93ull);
    return std::byte(v >> (8 * (i % 8)));
  };
  for (Bytes i = begin; i < end; ++i) {
    if (i % 8 == 0 && i + 8 <= end && i / 8 >= 2 && i / 8 < words) {
      // Whole words past the header: compare a word at a time.
      std::uint64_t got;
      std::memcpy(&got, chunk + i, 8);
      if (got == (seed ^ ((i / 8) * 0xD6E8FEB86659FD93ull))) {
        i += 7;
        continue;
      }
    }
    if (chunk[i] != expected(i)) {
      return Status::IoError(DescribeChunk(id) + ": content check failed at byte " +
                             std::to_string(i) + " (extent read)");
    }
  }
  return Status::OK();
}

// ---- implementation ---------------------------------------------------------------------------

struct HwExecutor::Impl {
  // Where a chunk's bytes are in host memory (an arena slot or a ring piece).
  struct Loc {
    std::byte* p = nullptr;
    Bytes length = 0;
    Ring* ring = nullptr;  // null: a CPU-cache slot
    std::uint64_t stamp = 0;
  };

  // What an op is and what its execution keeps; the graph (below) keeps its dependencies and
  // how it ended.
  struct OpState {
    OpId id = kNoOp;
    bool is_transfer = true;
    TransferOp t;
    ComputeOp c;
    bool waited = false;  // the driving thread blocks on it: wake it on completion (under mu)
    OpTimes times;        // submit, start, end (the status is the graph's)
    std::atomic<Bytes> moved{0};  // transfers: bytes moved so far (reported if it fails)
    std::size_t first_unwritten = 0;  // SSD writes: chunks[i >= this] were not stored
    // SSD reads: pieces still in flight, and the first error.
    std::atomic<int> pieces_left{0};
    std::mutex err_mu;
    Status first_error;
    // kCpuGather: the region it laid out per kind (written before it completes). A staged
    // H2D: the kCpuGather in its `after` list, whose regions it copies (set at submission).
    std::vector<std::pair<KvKind, Loc>> regions;
    std::shared_ptr<OpState> staged_from;
  };
  using OpPtr = std::shared_ptr<OpState>;


  ModelSpec model;
  HardwareOptions hardware;
  HwExecutorOptions opt;
  Bytes slot_bytes = 0;
  HostClock clock;
  // Host or CUDA: memory, copies, gathers, compute and their timestamps. Declared before the
  // arenas it allocates, so they are released first.
  std::unique_ptr<DeviceBackend> device;

  std::unique_ptr<ChunkStore> store;
  std::unique_ptr<IoEngine> io;
  std::unique_ptr<HostArena> staging_arena, gather_arena, cpu_arena;
  std::unique_ptr<DeviceArena> gpu_arena, work_arena;
  Ring staging, gather, work;
  std::unique_ptr<DecodeHome> decode_home;  // decode ops' rows (hw/decode_home.h)
  std::uint32_t cpu_usable = 0, gpu_usable = 0;
  std::vector<std::byte> fill_buf;  // writer thread only

  // Scheduler state, under mu: the operation graph (core/op_graph.h: pending dependencies,
  // dependents, the abort propagation of a failure) and the implicit read-after-write order.
  std::mutex mu;
  std::condition_variable cv;
  OpGraph<OpPtr> graph;
  bool draining = false;
  std::unordered_map<ChunkId, OpId> pending_puts;  // chunk -> store op not yet complete
  // chunk -> what a read of it reports, AbortedAfter(the store that failed to write it), until
  // a later store of it is submitted: a read of it is aborted naming that failure, whether it
  // was submitted before or after it.
  std::unordered_map<ChunkId, Status> failed_puts;
  // Residency and locations.
  std::mutex res_mu;
  std::unordered_map<ChunkId, std::uint32_t> cpu_slots, gpu_slots;
  std::unordered_map<ChunkId, Loc> host_loc, gathered_loc;
  // CPU-cache slots being written (an SSD read landing in one, a demotion copying into one),
  // each by one writer at a time: a second writer of the same slot -- the cache may plan a
  // chunk's demotion before the read that brings it has run, and the copy then carries no
  // content (its GPU copy is not there yet) -- writes to staging instead (timing kept, content
  // not), and a slot whose chunk leaves the CPU tier is freed only once its writer is done
  // (`deferred_cpu_frees`). So a read's content check sees what the read brought, never bytes
  // another op put there meanwhile (found by issue 12's checks under load: a demotion copy
  // zeroing a slot between a read's DMA and its check).
  std::unordered_set<std::uint32_t> cpu_slot_busy;
  std::vector<std::uint32_t> deferred_cpu_frees;

  // The CPU slot of `chunk` for a writer, marked busy; nullopt when it has none or it is busy.
  // REQUIRES: res_mu held.
  std::optional<std::uint32_t> AcquireCpuSlot(ChunkId chunk) {
    auto slot = cpu_slots.find(chunk);
    if (slot == cpu_slots.end() || !cpu_slot_busy.insert(slot->second).second) return std::nullopt;
    return slot->second;
  }
  void ReleaseCpuSlot(std::uint32_t slot) {
    std::lock_guard<std::mutex> l(res_mu);
    cpu_slot_busy.erase(slot);
    auto d = std::find(deferred_cpu_frees.begin(), deferred_cpu_frees.end(), slot);
    if (d == deferred_cpu_frees.end()) return;
    deferred_cpu_frees.erase(d);
    cpu_arena->slots().Free(slot);
  }

  std::mutex stats_mu;
  HwExecutorStats st;

  // Copies may run inline on a completing thread (Dispatch): the host backend's copies are a
  // memcpy on the calling thread; a cuda copy waits for its DMA, which would hold that thread.
  bool inline_copies = false;
  // Lanes last: destroyed first, so no job runs against freed state.
  std::unique_ptr<Lane> h2d_lane, d2h_lane, cpu_lane, compute_lane, write_lane;

  Seconds Now() const { return clock.Now(); }

  // ---- completion and dispatch ----

  // Completes `op` with `status` (the Executor contract): on success, the dependents whose last
  // dependency it was are dispatched; on failure, everything downstream of it completes at
  // once, without running, with a status naming this failure.
  void Complete(const OpPtr& op, Status status, Seconds start_s, Seconds end_s) {
    std::vector<OpPtr> ready;
    bool notify = false;
    {
      std::lock_guard<std::mutex> l(mu);
      op->times.start_s = std::max(op->times.submit_s, start_s);
      op->times.end_s = std::max(op->times.start_s, end_s);
      if (status.ok()) {
        Finished(*op, nullptr);
        graph.Complete(op->id, [&](OpId d) { ready.push_back(graph.At(d).payload); });
        notify = op->waited;
      } else {
        const Status why = AbortedAfter(Describe(*op), status);
        notify = FailLocked(*op, std::move(status), why);
      }
      // Waking the driving thread for ops it does not wait on costs a core switch on small
      // machines; only the awaited ones (and a drain) notify.
      notify = notify || draining;
    }
    if (notify) cv.notify_all();
    for (const OpPtr& r : ready) Dispatch(r, /*completing=*/true);
  }

  // Fails `op` (times set) and completes what depends on it with `why`. Returns whether the
  // driving thread waits on one of them. REQUIRES: mu held.
  bool FailLocked(OpState& op, Status status, const Status& why) {
    bool waited = op.waited;
    Finished(op, &why);
    const Seconds now = Now();
    graph.Fail(op.id, std::move(status), why, [&](OpId d) {
      OpState& a = *graph.At(d).payload;
      a.times.start_s = std::max(a.times.submit_s, now);
      a.times.end_s = a.times.start_s;
      Finished(a, &why);
      waited = waited || a.waited;
    });
    return waited;
  }

  // Bookkeeping of a completed op: a store's chunks are no longer pending, and when it failed
  // (`reads_of_unwritten` is what a read of a chunk it did not write reports), those chunks
  // are remembered as not on the SSD. REQUIRES: mu held.
  void Finished(const OpState& op, const Status* reads_of_unwritten) {
    if (!op.is_transfer || op.t.kind != TransferKind::kSsdWrite) return;
    for (std::size_t i = 0; i < op.t.chunks.size(); ++i) {
      const ChunkId c = op.t.chunks[i].chunk;
      auto it = pending_puts.find(c);
      if (it == pending_puts.end() || it->second != op.id) continue;  // stored again since
      pending_puts.erase(it);
      if (reads_of_unwritten != nullptr && i >= op.first_unwritten) {
        failed_puts[c] = *reads_of_unwritten;
      }
    }
  }

  static std::string Describe(const OpState& op) {
    return op.is_transfer ? DescribeOp(op.t) : DescribeOp(op.c);
  }

  // Starts `op` (its dependencies are done). `completing`: called by the thread that completed
  // its last dependency. When that is the I/O engine's thread (a read completed) and the lane
  // is idle, a gather, and on the host backend a copy, runs right there (Lane::Run) instead of
  // waking the lane's thread: the memcpy costs what the hand-off would, and the read's data is
  // used at once. Compute (a sleep on the host backend), stores (blocking writes) and cuda
  // copies (which wait for their DMA) always go to their lanes, lane threads never run another
  // lane's job, and the driving thread never runs an op (it goes on submitting). SSD reads are
  // issued by whoever starts them: the engine's thread does the I/O.
  void Dispatch(const OpPtr& op, bool completing) {
    if (!op->is_transfer) {
      const Seconds ready = Now();  // dependencies done: the hand-off to the lane starts
      compute_lane->Run([this, op, ready] { RunCompute(op, ready); }, false);
      return;
    }
    const bool copy_inline = completing && inline_copies;
    switch (op->t.kind) {
      case TransferKind::kSsdRead: IssueRead(op); break;
      case TransferKind::kSsdWrite: write_lane->Run([this, op] { RunWrite(op); }, false); break;
      case TransferKind::kCpuGather:
        cpu_lane->Run([this, op] { RunGather(op); }, completing);
        break;
      case TransferKind::kH2D: h2d_lane->Run([this, op] { RunCopy(op, true); }, copy_inline); break;
      case TransferKind::kD2H: d2h_lane->Run([this, op] { RunCopy(op, false); }, copy_inline); break;
    }
  }

  // ---- SSD reads ----

  void PieceDone(const OpPtr& op, Status s) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> l(op->err_mu);
      if (op->first_error.ok()) op->first_error = std::move(s);
    }
    if (op->pieces_left.fetch_sub(1) == 1) {
      Status err;
      {
        std::lock_guard<std::mutex> l(op->err_mu);
        err = op->first_error;
      }
      Complete(op, err, op->times.start_s, Now());
    }
  }

  void IssueRead(const OpPtr& op) {
    op->times.start_s = Now();
    // One read request each: a whole chunk, an extent of a chunk (ssd_read_unit = extent), or
    // a slot-sized piece of a bytes-only read.
    struct Piece {
      ChunkId id;
      ChunkLocation loc;
      std::byte* dst;  // where the chunk's byte 0 goes (an extent lands at dst + begin)
      bool have_loc;
      Bytes bytes;  // of the op's bytes: counted as moved once this piece is read intact
      Ring* ring = nullptr;  // a staging destination: overwritten if the ring wrapped past it
      std::uint64_t stamp = 0;
      std::int64_t cpu_slot = -1;  // a CPU-cache slot destination, held until the check
      Bytes begin = 0, length = 0;  // the extent read (length 0: the whole chunk)
      // Extents of one chunk still in flight: the last one releases the CPU slot.
      std::shared_ptr<std::atomic<int>> chunk_left{};
      Status error{};  // a piece that cannot be read (not stored, an extent out of range)
    };
    std::vector<Piece> pieces;
    if (op->t.chunks.empty()) {
      // A bytes-only read (the reorderer's repack reads carry no chunk list): read that many
      // bytes of the data file, in slot-sized pieces, into staging. Honest bandwidth, no content.
      Bytes left = RoundUp(std::max<Bytes>(op->t.bytes, 1), kChunkAlign);
      Bytes off = 0, counted = 0;
      const Bytes cap = store->capacity_bytes();
      while (left > 0) {
        const Bytes n = std::min<Bytes>({left, slot_bytes, Bytes(1) << 20});
        if (off + n > cap) off = 0;
        ChunkLocation loc;
        loc.offset = off;
        loc.length = n;
        const Bytes piece_bytes = std::min<Bytes>(n, op->t.bytes - counted);
        counted += piece_bytes;
        pieces.push_back({ChunkId{0}, loc, staging.Allocate(n).first, true, piece_bytes});
        off += n;
        left -= n;
      }
    } else {
      std::lock_guard<std::mutex> l(res_mu);
      for (const ChunkIo& c : op->t.chunks) {
        Piece p{c.chunk, {}, nullptr, false, c.bytes};
        if (auto loc = store->Lookup(c.chunk)) {
          p.loc = *loc;
          p.have_loc = true;
          Loc dst;
          std::optional<std::uint32_t> slot;
          if (p.loc.extent_bytes() <= slot_bytes) slot = AcquireCpuSlot(c.chunk);
          if (slot) {
            dst.p = cpu_arena->slot(*slot);
            p.cpu_slot = *slot;  // released once the read is checked
          } else {
            auto [ptr, stamp] = staging.Allocate(p.loc.extent_bytes());
            dst.p = ptr;
            dst.ring = &staging;
            dst.stamp = stamp;
          }
          dst.length = p.loc.length;
          p.dst = dst.p;
          p.ring = dst.ring;
          p.stamp = dst.stamp;
          host_loc[c.chunk] = dst;
          gathered_loc.erase(c.chunk);
        } else {
          p.error = Status::NotFound(DescribeChunk(c.chunk) + ": not in the chunk store " +
                                     store->data_path());
        }
        if (c.extents.empty() || !p.have_loc) {
          pieces.push_back(std::move(p));
          continue;
        }
        // One read per extent; the chunk's bytes shared among them (they sum to c.bytes).
        const std::size_t k = c.extents.size();
        p.chunk_left = std::make_shared<std::atomic<int>>(int(k));
        for (std::size_t i = 0; i < k; ++i) {
          const Extent& e = c.extents[i];
          Piece x = p;
          x.begin = e.offset;
          x.length = e.length;
          x.bytes = c.bytes * (i + 1) / k - c.bytes * i / k;
          if (e.length == 0 || e.offset % kChunkAlign != 0 || e.length % kChunkAlign != 0 ||
              e.offset + e.length > p.loc.extent_bytes()) {
            x.error = Status::InvalidArgument(
                DescribeChunk(c.chunk) + ": extent [" + std::to_string(e.offset) + ", +" +
                std::to_string(e.length) + ") is not a 4 KiB-aligned range of its " +
                std::to_string(p.loc.extent_bytes()) + " stored bytes");
          }
          pieces.push_back(std::move(x));
        }
      }
    }
    op->pieces_left.store(int(pieces.size()));
    if (pieces.empty()) {
      Complete(op, Status::OK(), op->times.start_s, Now());
      return;
    }
    const IoClass cls = ClassOf(op->t.purpose);
    const bool full = opt.verify;
    const bool check = !op->t.chunks.empty();
    std::vector<ReadRequest> batch;  // every read of the op, to the engine at once
    batch.reserve(pieces.size());
    for (Piece& p : pieces) {
      // The last piece of a chunk hands its CPU slot on (whole chunks: their only piece).
      auto release_slot = [this, cpu_slot = p.cpu_slot, left = p.chunk_left] {
        if (cpu_slot < 0) return;
        if (left && left->fetch_sub(1) != 1) return;
        ReleaseCpuSlot(std::uint32_t(cpu_slot));
      };
      if (!p.error.ok()) {
        release_slot();
        PieceDone(op, std::move(p.error));
        continue;
      }
      const bool extent = p.length > 0;
      ReadRequest r;
      r.chunk_id = p.id;
      r.tag = op->t.request;
      r.io_class = cls;
      r.offset = p.loc.offset + p.begin;
      r.length = extent ? p.length : p.loc.extent_bytes();
      r.dst = p.dst + p.begin;
      const Bytes length = p.loc.length;
      const ChunkLocation loc = p.loc;
      const std::byte* base = p.dst;
      const Bytes piece_bytes = p.bytes;
      // The chunk's content bytes this read brought ([begin, end) of its stored bytes).
      const Bytes begin = p.begin, end = extent ? std::min(length, p.begin + p.length) : length;
      r.on_complete = [this, op, check, length, loc, base, full, piece_bytes, extent, begin, end,
                       ring = p.ring, stamp = p.stamp, release_slot](const ReadResult& res) {
        Status s = res.status;
        // A staging piece the ring wrapped past while the read was queued holds some later
        // chunk's bytes: nothing to check (timing kept, content not; hw.staging_reused).
        bool reused = ring != nullptr && ring->Overwritten(stamp);
        if (s.ok() && check && !reused) {
          s = extent ? CheckChunkRange(res.chunk_id, length, base, begin, end, full)
                     : CheckChunkContent(res.chunk_id, length, base, full);
        }
        // A whole chunk is also checked against the CRC-32C the store recorded when it wrote
        // it: bytes that never landed whole (a torn write the device acknowledged) fail here,
        // header intact or not. (An extent holds part of a chunk; CheckChunkRange checks it.)
        const bool crc = s.ok() && check && !reused && !extent;
        if (crc) s = CheckChunkCrc(res.chunk_id, loc, base, store->data_path());
        // The ring may wrap past the piece while it is being checked (a later read allocates,
        // then lands its bytes): a mismatch is the read's only if the piece was still its own
        // once the check ended. Allocation precedes the landing, so this sees every such case.
        if (!s.ok() && res.status.ok() && ring != nullptr && ring->Overwritten(stamp)) {
          reused = true;
          s = Status::OK();
        }
        if (s.ok()) op->moved += piece_bytes;
        release_slot();
        {
          std::lock_guard<std::mutex> l(stats_mu);
          st.bytes_read += res.bytes;
          if (check) ++st.ssd_reads;
          if (check && !extent) ++st.chunks_read;
          if (check && extent) ++st.extents_read;
          if (check && full && s.ok() && !reused) ++(extent ? st.extents_verified : st.chunks_verified);
          if (crc) ++st.crc_checked;
          if (reused) ++st.staging_reused;
        }
        PieceDone(op, std::move(s));
      };
      batch.push_back(std::move(r));
    }
    io->SubmitBatch(std::move(batch));  // one wake-up of the engine, one io_uring_submit
  }

  // ---- SSD writes ----

  void RunWrite(const OpPtr& op) {
    const std::int64_t start_ns = MonotonicNowNs();
    const Seconds start = clock.ToSeconds(start_ns);
    Status status;
    Bytes written = 0;
    std::uint64_t chunks = 0;
    // The first put that fails (a full store: OutOfSpace naming the chunk and the capacity;
    // an I/O error) fails the op; the rest is not attempted.
    // Stores and repacks are background traffic: paced to ssd.background_share of the
    // profile's ssd.write_bw, as the simulator caps them (each put ends no earlier than the
    // bytes so far take at that rate). Pacing only slows a write down.
    const bool background = IsBackground(op->t.purpose);
    const double pace_bw = hardware.ssd_write_bw * hardware.ssd_background_share;
    auto put = [&](ChunkId id, Bytes len) {
      if (fill_buf.size() < len) fill_buf.resize(len);
      FillChunkContent(id, len, fill_buf.data());
      status = store->Put(id, std::span<const std::byte>(fill_buf.data(), len));
      if (status.ok()) written += len;
      if (status.ok() && background && pace_bw > 0) {
        SleepUntilNs(start_ns + std::int64_t(double(written) / pace_bw * 1e9));
      }
      return status.ok();
    };
    if (!op->t.chunks.empty()) {
      std::size_t i = 0;
      for (; i < op->t.chunks.size(); ++i) {
        const ChunkIo& c = op->t.chunks[i];
        if (c.bytes == 0) continue;
        if (!put(c.chunk, c.bytes)) break;
        ++chunks;
      }
      op->first_unwritten = i;  // read by Complete, under the scheduler's lock
    } else {
      // Bytes-only writes (repacks): scratch chunk ids in a reserved segment, so the write
      // bandwidth is real and the extents are recycled by the next repack.
      Bytes left = op->t.bytes;
      std::uint32_t i = 0;
      while (left > 0) {
        const Bytes n = std::min<Bytes>(left, slot_bytes);
        if (!put(ChunkId::Make(0xFFFFFFFFu, KvKind::kKey, 0, i++), n)) break;
        left -= n;
      }
    }
    op->moved = written;
    {
      std::lock_guard<std::mutex> l(stats_mu);
      st.bytes_written += written;
      st.chunks_written += chunks;
    }
    Complete(op, status, start, Now());
  }

  // ---- CPU gather ----

  // Where `c`'s bytes are on the host: its CPU slot, its staged copy, or (none known) a
  // staging piece standing in for it (counted as an overflow).
  Loc SourceOf(ChunkId c, Bytes need, bool prefer_gathered) {
    std::lock_guard<std::mutex> l(res_mu);
    if (prefer_gathered) {
      auto g = gathered_loc.find(c);
      if (g != gathered_loc.end()) return g->second;
    }
    auto h = host_loc.find(c);
    if (h != host_loc.end()) return h->second;
    auto s = cpu_slots.find(c);
    if (s != cpu_slots.end()) return Loc{cpu_arena->slot(s->second), slot_bytes, nullptr, 0};
    // Not in host memory: a staging piece of a whole slot stands in (rows sit at their stored
    // offsets, so a row run of the chunk finds room in it; timing kept, content not).
    Loc loc;
    const Bytes n = std::min(std::max(need, slot_bytes), staging.size);
    auto [p, stamp] = staging.Allocate(n);
    loc.p = p;
    loc.length = n;
    loc.ring = &staging;
    loc.stamp = stamp;
    {
      std::lock_guard<std::mutex> g(stats_mu);
      ++st.source_standins;
    }
    return loc;
  }

  void NoteIfOverwritten(const Loc& loc) {
    if (loc.ring != nullptr && loc.ring->Overwritten(loc.stamp)) {
      std::lock_guard<std::mutex> l(stats_mu);
      ++st.staging_reused;
    }
  }

  // Bytes one selected row of `c` occupies in storage (a whole token's K/V or probe keys).
  Bytes TokenBytes(ChunkId c) const {
    return c.kind() == KvKind::kProbeKey ? Bytes(opt.probe_heads) * model.RowBytes()
                                         : model.KBytesPerTokenLayer();
  }

  // A kCpuGather: the selected rows of its chunks, one memcpy per run of rows (a chunk listed
  // without rows is one run), laid out contiguously in the gather ring, one region per kind in
  // the order the kinds first appear, chunk after chunk in the op's order -- the layout a staged
  // H2D (StagedPieces) copies with one DMA per kind. Sources: a chunk's CPU-cache slot, or the
  // buffer its SSD read landed in (rows at their stored offsets either way).
  void RunGather(const OpPtr& op) {
    const Seconds start = Now();
    struct Out {
      ChunkId chunk;
      Loc src;
      std::byte* dst;
      std::uint64_t stamp;
      Bytes bytes;
    };
    std::vector<Out> outs;
    std::vector<CopyPiece> pieces;
    Bytes moved = 0;
    if (DecodeHome::Serves(op->t)) {
      // A decode step's top-k rows, out of the decode home: K rows, then V rows.
      auto [region, stamp] = gather.Allocate(op->t.bytes);
      const Bytes room = std::min(op->t.bytes, gather.size);
      Bytes k = 0;
      decode_home->GatherPieces(op->t, region, room, &pieces, &k);
      op->regions.push_back({KvKind::kKey, Loc{region, k, &gather, stamp}});
      op->regions.push_back({KvKind::kValue, Loc{region + k, room - k, &gather, stamp}});
      moved = room;
    }
    for (const KindGroup& g : GroupByKind(op->t.chunks)) {
      auto [region, stamp] = gather.Allocate(g.bytes);
      const Bytes room = std::min(g.bytes, gather.size);
      op->regions.push_back({g.kind, Loc{region, room, &gather, stamp}});
      Bytes at = 0;
      for (const ChunkIo* c : g.chunks) {
        const Loc src = SourceOf(c->chunk, c->bytes, false);
        std::byte* dst = region + at;
        Bytes out = 0;
        if (c->rows.empty()) {
          out = std::min({c->bytes, src.length, room - at});
          pieces.push_back({dst, src.p, out});
        } else {
          out = AppendRunPieces(src.p, src.length, c->rows, TokenBytes(c->chunk), c->bytes, dst,
                                room - at, &pieces);
        }
        at += out;
        moved += out;
        outs.push_back({c->chunk, src, dst, stamp, out});
      }
    }
    const Status status = NameChunks(device->Gather(pieces), op->t);
    for (const Out& o : outs) NoteIfOverwritten(o.src);
    {
      std::lock_guard<std::mutex> l(res_mu);
      for (const Out& o : outs) gathered_loc[o.chunk] = Loc{o.dst, o.bytes, &gather, o.stamp};
    }
    {
      std::lock_guard<std::mutex> l(stats_mu);
      st.bytes_gathered += moved;
    }
    Complete(op, status, start, Now());
  }

  // The chunks of an op grouped by kind (K, V, probe keys), kinds in order of first appearance,
  // with the bytes of each group; chunks of 0 bytes are left out.
  struct KindGroup {
    KvKind kind;
    Bytes bytes = 0;
    std::vector<const ChunkIo*> chunks;
  };
  static std::vector<KindGroup> GroupByKind(const std::vector<ChunkIo>& chunks) {
    std::vector<KindGroup> groups;
    for (const ChunkIo& c : chunks) {
      if (c.bytes == 0) continue;
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const KindGroup& k) { return k.kind == c.chunk.kind(); });
      if (g == groups.end()) g = groups.insert(groups.end(), KindGroup{c.chunk.kind(), 0, {}});
      g->bytes += c.bytes;
      g->chunks.push_back(&c);
    }
    return groups;
  }

  // ---- PCIe copies ----

  // Device destination of `c` (its GPU-cache slot, else a working-ring piece).
  std::byte* DeviceDst(ChunkId c, Bytes bytes) {
    {
      std::lock_guard<std::mutex> l(res_mu);
      auto s = gpu_slots.find(c);
      if (s != gpu_slots.end() && bytes <= slot_bytes) return gpu_arena->slot(s->second);
    }
    return work.Allocate(bytes).first;
  }

  // A staged H2D (staged_gather): one DMA per kind, from the region the op's kCpuGather laid
  // out (RunGather) to a working region of the device. The gather is the one in the op's
  // `after` list (its regions, by kind); without one, the chunks' gathered rows if they lie back
  // to back. A kind found nowhere -- not gathered, or the gather ring was reused since -- still
  // moves as one piece, from a staging piece standing in for it (content not kept; counted in
  // staged_misses).
  void StagedPieces(OpState& op, std::vector<CopyPiece>* pieces, std::vector<Loc>* sources,
                    Bytes* moved) {
    for (const KindGroup& g : GroupByKind(op.t.chunks)) {
      const Bytes n = std::min({g.bytes, work.size, gather.size});
      std::optional<Loc> region;
      if (op.staged_from) {
        // The gather this op depends on: its region of this kind, if it holds these bytes.
        for (const auto& [kind, loc] : op.staged_from->regions) {
          if (kind == g.kind && loc.length == n) region = loc;
        }
      } else {
        // No gather named in `after`: the chunks' gathered rows, if they lie back to back.
        std::lock_guard<std::mutex> l(res_mu);
        const std::byte* next = nullptr;
        bool contiguous = true;
        for (const ChunkIo* c : g.chunks) {
          auto it = gathered_loc.find(c->chunk);
          if (it == gathered_loc.end() || (next != nullptr && it->second.p != next) ||
              it->second.length != c->bytes) {
            contiguous = false;
            break;
          }
          if (!region) region = it->second;
          next = it->second.p + it->second.length;
        }
        if (!contiguous) region.reset();
      }
      if (!region || (region->ring != nullptr && region->ring->Overwritten(region->stamp))) {
        std::lock_guard<std::mutex> l(stats_mu);
        ++st.staged_misses;
        auto [p, stamp] = staging.Allocate(n);
        region = Loc{p, n, &staging, stamp};
      }
      pieces->push_back({work.Allocate(n).first, region->p, n});
      sources->push_back(*region);
      *moved += n;
    }
  }

  // H2D and D2H copies. Pieces (DESIGN-14): a staged H2D, one per kind (StagedPieces); any
  // other H2D of chunks, one per run of the chunk's rows (per_row, batched, device_gather), or
  // the whole chunk as one piece when it lists no rows (per_chunk, promotions); D2H, one per
  // chunk. kDma ops make one DMA call per piece (Copy), kBatched ONE batched call with a
  // descriptor per piece, kDeviceGather ONE gather kernel over the pieces. An op that lists no
  // chunks (the store's D2H) moves its bytes between the rings in slot-sized pieces, paced as
  // `ios` copies.
  void RunCopy(const OpPtr& op, bool h2d) {
    std::vector<CopyPiece> pieces;
    std::vector<Loc> sources;                // staged sources: checked once copied
    std::vector<std::uint32_t> held_slots;  // CPU slots this demotion writes
    Bytes moved = 0;
    std::uint32_t copies = 0, chunks = 0;
    if (!op->t.chunks.empty()) {
      if (h2d && op->t.staged) {
        StagedPieces(*op, &pieces, &sources, &moved);
        op->staged_from.reset();  // its regions are copied (or counted missing)
      }
      for (const ChunkIo& c : op->t.chunks) {
        if (c.bytes == 0) continue;
        ++chunks;
        if (h2d && op->t.staged) continue;  // pieces made above
        if (h2d) {
          const bool rows_partial = !c.rows.empty();
          const Loc src = SourceOf(c.chunk, c.bytes, rows_partial);
          std::byte* dst = DeviceDst(c.chunk, c.bytes);
          // Rows a kCpuGather already laid out (an op group of a planner that gathers before
          // an unstaged copy) move as one piece, like a whole chunk.
          if (!rows_partial || src.ring == &gather) {
            const Bytes n = std::min({c.bytes, src.length, slot_bytes});
            pieces.push_back({dst, src.p, n});
            moved += n;
          } else {
            moved += AppendRunPieces(src.p, src.length, c.rows, TokenBytes(c.chunk), c.bytes,
                                     dst, slot_bytes, &pieces);
          }
          sources.push_back(src);
        } else {
          // Demotion: the chunk's device slot (or a working piece) into its CPU slot or staging.
          // (A slot another op is writing -- the read bringing this chunk -- is left alone.)
          std::byte* src = DeviceDst(c.chunk, c.bytes);
          std::byte* dst = nullptr;
          {
            std::lock_guard<std::mutex> l(res_mu);
            if (std::optional<std::uint32_t> slot = AcquireCpuSlot(c.chunk)) {
              dst = cpu_arena->slot(*slot);
              held_slots.push_back(*slot);  // released once the copy is complete
            }
          }
          if (dst == nullptr) dst = staging.Allocate(c.bytes).first;
          const Bytes n = std::min(c.bytes, slot_bytes);
          pieces.push_back({dst, src, n});
          moved += n;
        }
      }
      copies = std::uint32_t(pieces.size());
    } else if (DecodeHome::Serves(op->t)) {
      // A decode op: rows of the decode home (hw/decode_home.h).
      const auto alloc = [this](Bytes n) { return work.Allocate(n).first; };
      if (h2d && op->t.staged && op->staged_from) {
        for (const auto& [kind, region] : op->staged_from->regions) {
          if (region.length == 0) continue;
          pieces.push_back({alloc(region.length), region.p, region.length});
          sources.push_back(region);
        }
        op->staged_from.reset();
      } else if (h2d) {
        const bool descriptors = op->t.method != CopyMethod::kDma;
        decode_home->FetchPieces(op->t, descriptors ? op->t.descriptors : op->t.ios, alloc,
                                 &pieces);
      } else {
        decode_home->OffloadPieces(op->t, alloc, &pieces);
      }
      for (const CopyPiece& p : pieces) moved += p.bytes;
      copies = std::max<std::uint32_t>(1, op->t.ios);
    } else {
      // Bytes only (e.g. the store's D2H of new KV): ring-sized pieces between the rings.
      Bytes left = op->t.bytes;
      while (left > 0) {
        const Bytes n = std::min<Bytes>(left, slot_bytes);
        std::byte* dev = work.Allocate(n).first;
        std::byte* host = staging.Allocate(n).first;
        pieces.push_back(h2d ? CopyPiece{dev, host, n} : CopyPiece{host, dev, n});
        moved += n;
        left -= n;
      }
      copies = std::max<std::uint32_t>(1, op->t.ios);
    }
    // Once the bytes are in place (before the host backend's pacing): hand the CPU slots on,
    // note staged sources the ring overwrote before they were copied.
    const std::function<void()> release = [&] {
      for (std::uint32_t slot : held_slots) ReleaseCpuSlot(slot);
      for (const Loc& src : sources) NoteIfOverwritten(src);
    };
    Interval when;
    Status status;
    if (h2d && op->t.method == CopyMethod::kBatched) {
      status = device->CopyBatched(pieces, release, &when);
    } else if (h2d && op->t.method == CopyMethod::kDeviceGather) {
      status = device->DeviceGather(pieces, release, &when);
    } else {
      status = device->Copy(h2d ? CopyDirection::kHostToDevice : CopyDirection::kDeviceToHost,
                            pieces, copies, release, &when);
    }
    status = NameChunks(std::move(status), op->t);
    {
      std::lock_guard<std::mutex> l(stats_mu);
      (h2d ? st.bytes_h2d : st.bytes_d2h) += moved;
      if (h2d && op->t.purpose == Purpose::kPromote) st.promoted_chunks += chunks;
      if (!h2d && op->t.purpose == Purpose::kDemote) st.demoted_chunks += chunks;
    }
    Complete(op, status, when.start_s, when.end_s);
  }

  // ---- the driving thread (HwExecutorStats::driver_*) ----
  std::int64_t driver_awake_since_ns = 0;  // 0: asleep, or not yet seen
  std::uint64_t driver_ops = 0;  // Submit calls; only the driving thread touches it
  void DriverSleeps() {
    if (driver_awake_since_ns == 0) return;
    const std::int64_t now = MonotonicNowNs();
    std::lock_guard<std::mutex> l(stats_mu);
    st.driver_awake_s += double(now - driver_awake_since_ns) * 1e-9;
    driver_awake_since_ns = 0;
  }
  void DriverWakes(bool blocked, Seconds op_end) {
    driver_awake_since_ns = MonotonicNowNs();
    if (!blocked) return;
    std::lock_guard<std::mutex> l(stats_mu);
    ++st.driver_blocked_waits;
    st.driver_wake_s += std::max(0.0, clock.ToSeconds(driver_awake_since_ns) - op_end);
  }

  // ---- compute ----

  void RunCompute(const OpPtr& op, Seconds ready) {
    Interval when;
    const Status status = device->Compute(op->c, ready, &when);
    {
      std::lock_guard<std::mutex> l(stats_mu);
      ++st.compute_ops;
      st.compute_busy_s += when.end_s - when.start_s;
    }
    Complete(op, status, when.start_s, when.end_s);
  }

  // ---- submission ----

  OpId SubmitOp(OpPtr op, std::span<const OpId> after) {
    if (!op->is_transfer && op->c.heads > model.kv_heads) {
      // The Pipeline's H2O step names query heads; the cost model counts KV heads (their query
      // groups included), so clamp as ComputeCost would need (all KV heads).
      op->c.heads = model.kv_heads;
    }
    bool start = false;
    {
      std::lock_guard<std::mutex> l(mu);
      op->times.submit_s = Now();
      std::vector<OpId> deps;  // `after` plus the pending stores of the chunks a read reads
      std::optional<Status> failed_put;
      if (op->is_transfer && op->t.kind == TransferKind::kSsdRead) {
        // Read-after-write: a chunk whose store is still in flight is read once it is durable.
        for (const ChunkIo& c : op->t.chunks) {
          if (auto f = failed_puts.find(c.chunk); f != failed_puts.end() && !failed_put) {
            failed_put = f->second;  // its store failed: the chunk is not on the SSD
          }
          auto it = pending_puts.find(c.chunk);
          if (it == pending_puts.end()) continue;
          if (deps.empty()) deps.assign(after.begin(), after.end());
          deps.push_back(it->second);
          std::lock_guard<std::mutex> s(stats_mu);
          ++st.raw_waits;
        }
      }
      if (op->is_transfer && op->t.kind == TransferKind::kH2D && op->t.staged) {
        // A staged copy copies the regions the gather it waits for laid out.
        for (OpId dep : after) {
          if (dep == kNoOp) continue;
          const OpPtr& d = graph.At(dep).payload;
          if (d->is_transfer && d->t.kind == TransferKind::kCpuGather) {
            op->staged_from = d;
            break;
          }
        }
      }
      const auto added = graph.Add(op, deps.empty() ? after : std::span<const OpId>(deps));
      op->id = added.id;
      if (op->is_transfer && op->t.kind == TransferKind::kSsdWrite) {
        for (const ChunkIo& c : op->t.chunks) {
          pending_puts[c.chunk] = op->id;
          failed_puts.erase(c.chunk);
        }
      }
      // A dependency that already failed (first in `after` order), else a failed store of a
      // chunk it reads: it never runs.
      std::optional<Status> abort;
      if (added.next == OpGraph<OpPtr>::Next::kAbort) {
        abort = *added.abort;
      } else if (failed_put) {
        abort = std::move(failed_put);
      }
      if (abort) {
        op->times.start_s = op->times.end_s = Now();  // never runs: completes at once
        FailLocked(*op, *abort, *abort);
      } else {
        start = added.next == OpGraph<OpPtr>::Next::kStart;
      }
    }
    if (start) Dispatch(op, /*completing=*/false);
    return op->id;
  }
};

// ---- HwExecutor ------------------------------------------------------------------------------

HwExecutor::HwExecutor() : impl_(std::make_unique<Impl>()) {}

HwExecutor::~HwExecutor() {
  if (!impl_) return;
  Drain();
  Impl& m = *impl_;
  m.h2d_lane.reset();
  m.d2h_lane.reset();
  m.cpu_lane.reset();
  m.compute_lane.reset();
  m.write_lane.reset();
  m.io.reset();
}

Status HwExecutor::Create(const ModelSpec& model, const HardwareOptions& hardware,
                          const HwExecutorOptions& options, std::unique_ptr<HwExecutor>* out) {
  std::unique_ptr<HwExecutor> ex(new HwExecutor());
  Impl& m = *ex->impl_;
  m.model = model;
  m.hardware = hardware;
  m.opt = options;
  DeviceBackendOptions device;
  device.model = model;
  device.hardware = hardware;
  device.compute = options.compute;
  device.pace_pcie = options.pace_pcie;
  try {
    device.timer.emplace(ComputeTimer::FromOptions(model, hardware));
  } catch (const ConfigError& e) {
    return Status::InvalidArgument(std::string("gpu.layer_table: ") + e.what());
  }
  if (options.store_dir.empty()) return Status::InvalidArgument("hw: no chunk store directory");
  if (options.chunk_tokens < 1) return Status::InvalidArgument("hw: chunk_tokens must be >= 1");

  // Backend: host or CUDA (Unavailable when cuda is asked for without a device).
  KVTIER_RETURN_IF_ERROR(
      CreateDeviceBackend(options.backend, std::move(device), &m.clock, &m.device));
  if (options.faults) m.device = options.faults->WrapBackend(std::move(m.device));
  if (options.wrap_backend) m.device = options.wrap_backend(std::move(m.device));

  // Slot size: the largest chunk record (a K or V chunk, or a probe-key chunk).
  const Bytes kv_chunk = model.ChunkBytes(options.chunk_tokens);
  const Bytes probe_chunk = model.ProbeChunkBytes(options.chunk_tokens, options.probe_heads);
  m.slot_bytes = RoundUp(std::max(kv_chunk, probe_chunk), kChunkAlign);
  // A store that cannot take even one chunk cannot serve any run: bad input, said before the
  // run. (One that fills up during the run fails the write that does not fit: OutOfSpace.)
  if (RoundUp(options.store_capacity, kChunkAlign) < m.slot_bytes) {
    return Status::InvalidArgument(
        "hw.store_capacity = " + std::to_string(options.store_capacity) +
        " B cannot hold one chunk: a chunk of " + std::to_string(options.chunk_tokens) +
        " tokens of model " + model.name + " takes " + std::to_string(m.slot_bytes) +
        " B on disk (K or V " + std::to_string(kv_chunk) + " B, probe keys " +
        std::to_string(probe_chunk) + " B); the store needs room for every chunk the run stores");
  }

  // A staging ring must give every read in flight bytes of its own: hw.ring = 200000 B (8 pieces
  // at QD 32) failed runs with "content check failed" though nothing was wrong on the disk.
  const Bytes min_ring =
      (Bytes(std::max<std::uint32_t>(1, options.queue_depth)) + 1) * m.slot_bytes;
  if (options.ring_bytes < min_ring) {
    return Status::InvalidArgument(
        "hw.ring = " + std::to_string(options.ring_bytes) +
        " B holds fewer than ssd.queue_depth + 1 = " + std::to_string(options.queue_depth + 1) +
        " chunk pieces of " + std::to_string(m.slot_bytes) +
        " B (the reads in flight must not share staging bytes): give at least " +
        std::to_string(min_ring) + " B");
  }

  // Memory budget: three rings, then the CPU and GPU cache arenas in proportion.
  Bytes ring = std::min(options.ring_bytes, options.max_memory / 8);
  ring = RoundUp(std::max(ring, min_ring), kChunkAlign);  // the cap above must not undo that
  const Bytes rings = 3 * ring;
  if (rings >= options.max_memory) {
    return Status::InvalidArgument("hw.max_memory " + std::to_string(options.max_memory) +
                                   " B is too small for the rings (" + std::to_string(rings) +
                                   " B at this chunk size)");
  }
  // The decode home (decode runs): the decoded sequence's 16-bit KV, in the same budget.
  const Bytes home = DecodeHome::BytesFor(model, options.decode_home_tokens);
  if (rings + home >= options.max_memory) {
    return Status::InvalidArgument(
        "hw.max_memory " + std::to_string(options.max_memory) + " B is too small for the rings (" +
        std::to_string(rings) + " B) and the decode home (" + std::to_string(home) + " B, " +
        std::to_string(std::max<std::int64_t>(1, options.decode_home_tokens)) + " positions)");
  }
  const Bytes rest = options.max_memory - rings - home;
  const double want_cpu = double(options.cpu_capacity), want_gpu = double(options.gpu_capacity);
  const double total = std::max(1.0, want_cpu + want_gpu);
  const Bytes cpu_bytes = std::min<Bytes>(options.cpu_capacity, Bytes(double(rest) * want_cpu / total));
  const Bytes gpu_bytes = std::min<Bytes>(options.gpu_capacity, Bytes(double(rest) * want_gpu / total));
  m.cpu_usable = std::uint32_t(cpu_bytes / m.slot_bytes);
  m.gpu_usable = std::uint32_t(gpu_bytes / m.slot_bytes);

  HostArenaOptions ho;
  ho.slot_bytes = ring;
  ho.slot_count = 1;
  KVTIER_RETURN_IF_ERROR(m.device->AllocateHost(ho, &m.staging_arena));
  KVTIER_RETURN_IF_ERROR(m.device->AllocateHost(ho, &m.gather_arena));
  ho.slot_bytes = m.slot_bytes;
  ho.slot_count = std::max<std::uint32_t>(1, m.cpu_usable);
  KVTIER_RETURN_IF_ERROR(m.device->AllocateHost(ho, &m.cpu_arena));
  KVTIER_RETURN_IF_ERROR(
      m.device->AllocateDevice(m.slot_bytes, std::max<std::uint32_t>(1, m.gpu_usable),
                               &m.gpu_arena));
  KVTIER_RETURN_IF_ERROR(m.device->AllocateDevice(ring, 1, &m.work_arena));
  m.staging.base = m.staging_arena->slot(0);
  m.staging.size = ring;
  m.gather.base = m.gather_arena->slot(0);
  m.gather.size = ring;
  m.work.base = m.work_arena->slot(0);
  m.work.size = ring;
  KVTIER_RETURN_IF_ERROR(DecodeHome::Create(model, options.decode_home_tokens,
                                            std::min<Bytes>(ring, 1ull << 20), m.device.get(),
                                            &m.decode_home));

  // Chunk store and I/O engine.
  ChunkStoreOptions so;
  so.dir = options.store_dir;
  so.capacity_bytes = options.store_capacity;
  so.allow_buffered = options.allow_buffered;
  so.sync = options.store_sync;
  if (options.faults) so.write_hook = options.faults->write_hook();
  KVTIER_RETURN_IF_ERROR(ChunkStore::Open(so, &m.store));
  IoEngineOptions io;
  io.backend = options.io_backend;
  io.max_ops_in_flight = std::max<std::uint32_t>(1, options.queue_depth);
  io.max_bytes_in_flight = std::max<std::uint64_t>(8ull << 20, 2 * m.slot_bytes);
  io.prefetch_max_ops = std::max<std::uint32_t>(1, io.max_ops_in_flight * 3 / 4);
  io.prefetch_max_bytes = io.max_bytes_in_flight * 3 / 4;
  io.pread_threads = std::max<std::uint32_t>(1, std::min<std::uint32_t>(options.queue_depth, 16));
  KVTIER_RETURN_IF_ERROR(IoEngine::Create(m.store->read_fd(), io, &m.io));
  if (options.faults) m.io = options.faults->WrapIoEngine(std::move(m.io));

  m.inline_copies = m.device->kind() == BackendKind::kHost;
  m.h2d_lane = std::make_unique<Lane>();
  m.d2h_lane = std::make_unique<Lane>();
  m.cpu_lane = std::make_unique<Lane>();
  m.compute_lane = std::make_unique<Lane>();
  m.write_lane = std::make_unique<Lane>();
  KVTIER_RETURN_IF_ERROR(ex->ResetClock());
  *out = std::move(ex);
  return Status::OK();
}

Status HwExecutor::ResetClock() {
  impl_->clock.Reset();
  return impl_->device->OnClockReset();  // cuda: a new anchor event
}

Seconds HwExecutor::Now() { return impl_->Now(); }

OpId HwExecutor::Submit(TransferOp op, std::span<const OpId> after) {
  ++impl_->driver_ops;
  auto s = std::make_shared<Impl::OpState>();
  s->is_transfer = true;
  s->t = std::move(op);
  return impl_->SubmitOp(std::move(s), after);
}

OpId HwExecutor::Submit(ComputeOp op, std::span<const OpId> after) {
  ++impl_->driver_ops;
  auto s = std::make_shared<Impl::OpState>();
  s->is_transfer = false;
  s->c = op;
  return impl_->SubmitOp(std::move(s), after);
}

Status HwExecutor::Wait(OpId op) {
  Impl& m = *impl_;
  m.DriverSleeps();
  std::unique_lock<std::mutex> l(m.mu);
  m.graph.At(op).payload->waited = true;
  const bool blocked = !m.graph.Done(op);
  m.cv.wait(l, [&] { return m.graph.Done(op); });
  const Seconds end = m.graph.At(op).payload->times.end_s;
  Status status = m.graph.At(op).status;
  l.unlock();
  m.DriverWakes(blocked, end);
  return status;
}

std::size_t HwExecutor::WaitAny(std::span<const OpId> ops) {
  Impl& m = *impl_;
  KVTIER_CHECK(!ops.empty(), "HwExecutor: WaitAny on nothing");
  m.DriverSleeps();
  std::unique_lock<std::mutex> l(m.mu);
  for (OpId id : ops) m.graph.At(id).payload->waited = true;
  std::size_t found = ops.size();
  bool blocked = false;
  m.cv.wait(l, [&] {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (m.graph.Done(ops[i])) {
        found = i;
        return true;
      }
    }
    blocked = true;
    return false;
  });
  const Seconds end = m.graph.At(ops[found]).payload->times.end_s;
  l.unlock();
  m.DriverWakes(blocked, end);
  return found;
}

bool HwExecutor::Done(OpId op) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> l(m.mu);
  return m.graph.Done(op);
}

OpTimes HwExecutor::Retire(OpId op) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> l(m.mu);
  const auto& node = m.graph.At(op);
  OpTimes t = node.payload->times;
  t.status = node.status;
  if (!t.status.ok()) t.failed_moved_bytes = node.payload->moved.load();
  m.graph.Retire(op);  // checks that it is done
  return t;
}

void HwExecutor::OnResident(Tier tier, ChunkId chunk) {
  Impl& m = *impl_;
  if (tier == Tier::kSsd) return;
  std::lock_guard<std::mutex> l(m.res_mu);
  auto& slots = tier == Tier::kCpu ? m.cpu_slots : m.gpu_slots;
  if (slots.count(chunk)) return;
  const std::uint32_t usable = tier == Tier::kCpu ? m.cpu_usable : m.gpu_usable;
  SlotAllocator& alloc =
      tier == Tier::kCpu ? m.cpu_arena->slots() : m.gpu_arena->slots();
  std::optional<std::uint32_t> s;
  if (slots.size() < usable) s = alloc.Allocate();
  if (!s) {
    std::lock_guard<std::mutex> g(m.stats_mu);
    ++(tier == Tier::kCpu ? m.st.cpu_overflow : m.st.gpu_overflow);
    return;
  }
  slots[chunk] = *s;
}

void HwExecutor::OnEvicted(Tier tier, ChunkId chunk) {
  Impl& m = *impl_;
  if (tier == Tier::kSsd) return;
  std::lock_guard<std::mutex> l(m.res_mu);
  auto& slots = tier == Tier::kCpu ? m.cpu_slots : m.gpu_slots;
  auto it = slots.find(chunk);
  if (it == slots.end()) return;
  if (tier == Tier::kCpu && m.cpu_slot_busy.count(it->second) > 0) {
    m.deferred_cpu_frees.push_back(it->second);  // freed once its writer is done
  } else {
    (tier == Tier::kCpu ? m.cpu_arena->slots() : m.gpu_arena->slots()).Free(it->second);
  }
  slots.erase(it);
  if (tier == Tier::kCpu) {
    auto h = m.host_loc.find(chunk);
    if (h != m.host_loc.end() && h->second.ring == nullptr) m.host_loc.erase(h);
  }
}

Status HwExecutor::Prepopulate(ChunkId id, Bytes bytes, bool fill_tiers) {
  Impl& m = *impl_;
  if (bytes == 0) return Status::OK();
  auto loc = m.store->Lookup(id);
  if (!loc || loc->length != bytes) {
    if (m.fill_buf.size() < bytes) m.fill_buf.resize(bytes);
    FillChunkContent(id, bytes, m.fill_buf.data());
    KVTIER_RETURN_IF_ERROR(m.store->Put(id, std::span<const std::byte>(m.fill_buf.data(), bytes)));
    std::lock_guard<std::mutex> l(m.stats_mu);
    ++m.st.chunks_written;
    m.st.bytes_written += bytes;
  }
  if (!fill_tiers || bytes > m.slot_bytes) return Status::OK();
  std::lock_guard<std::mutex> l(m.res_mu);
  if (auto s = m.cpu_slots.find(id); s != m.cpu_slots.end()) {
    FillChunkContent(id, bytes, m.cpu_arena->slot(s->second));
    m.host_loc[id] = Impl::Loc{m.cpu_arena->slot(s->second), bytes, nullptr, 0};
  }
  if (auto s = m.gpu_slots.find(id); s != m.gpu_slots.end()) {
    std::vector<std::byte> content(bytes);
    FillChunkContent(id, bytes, content.data());
    KVTIER_RETURN_IF_ERROR(
        m.device->WriteDevice(m.gpu_arena->slot(s->second), content.data(), bytes)
            .Annotate(DescribeChunk(id)));
  }
  return Status::OK();
}

void HwExecutor::IdleUntil(Seconds t) {
  PreciseTimers();
  impl_->DriverSleeps();
  SleepUntilNs(impl_->clock.t0_ns() + std::int64_t(t * 1e9));
  impl_->DriverWakes(false, 0);
}

void HwExecutor::Drain() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> l(m.mu);
  m.draining = true;
  m.cv.wait(l, [&] { return m.graph.incomplete() == 0; });
  m.draining = false;
}

HwExecutorStats HwExecutor::stats() const {
  std::lock_guard<std::mutex> l(impl_->stats_mu);
  HwExecutorStats s = impl_->st;
  s.driver_ops = impl_->driver_ops;
  s.decode_home_wraps = impl_->decode_home->wraps();
  return s;
}
BackendKind HwExecutor::backend() const { return impl_->device->kind(); }
std::string HwExecutor::io_backend_name() const { return std::string(impl_->io->backend_name()); }
bool HwExecutor::direct_io() const { return impl_->store->direct_io(); }
std::uint32_t HwExecutor::dio_mem_align() const { return impl_->store->dio_mem_align(); }
std::uint32_t HwExecutor::dio_offset_align() const { return impl_->store->dio_offset_align(); }
std::string HwExecutor::store_path() const { return impl_->store->data_path(); }
Bytes HwExecutor::slot_bytes() const { return impl_->slot_bytes; }
const std::vector<Status>& HwExecutor::store_dropped_on_open() const {
  return impl_->store->dropped_on_open();
}

}  // namespace kvtier::hw
