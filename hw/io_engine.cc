#include "hw/io_engine.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "core/check.h"
#include "hw/chunk_store.h"  // DescribeChunk
#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

std::string ChunkName(ChunkId id) { return DescribeChunk(id); }

// A request being split into sub-IOs and completed.
struct Pending {
  ReadRequest req;
  ReadResult result;
  uint64_t dispatched = 0;   // Bytes handed out as sub-IOs.
  uint32_t outstanding = 0;  // Sub-IOs in flight.
};

struct SubIo {
  Pending* pending = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::byte* dst = nullptr;
};

// Per-class FIFO queues, strict priority, caps on ops and bytes in flight. Not thread-safe:
// each backend guards it with its own mutex.
class Scheduler {
 public:
  explicit Scheduler(const IoEngineOptions& o) : o_(o), paused_(o.start_paused) {}

  void Add(ReadRequest req) {
    auto p = std::make_unique<Pending>();
    p->result.chunk_id = req.chunk_id;
    p->result.tag = req.tag;
    p->result.io_class = req.io_class;
    p->result.stamps.enqueue_ns = MonotonicNowNs();
    p->req = std::move(req);
    queues_[static_cast<int>(p->req.io_class)].push_back(p.get());
    live_.emplace(p.get(), std::move(p));
  }

  // The next sub-IO the caps admit, or nothing (paused, empty, or the head of the highest
  // non-empty class does not fit: lower classes never overtake it).
  std::optional<SubIo> Next() {
    if (paused_) return std::nullopt;
    for (int c = 0; c < kNumIoClasses; ++c) {
      if (queues_[c].empty()) continue;
      Pending* p = queues_[c].front();
      const uint64_t len = std::min(o_.max_io_bytes, p->req.length - p->dispatched);
      const bool prefetch = c == static_cast<int>(IoClass::kPrefetch);
      const uint32_t cap_ops = prefetch ? o_.prefetch_max_ops : o_.max_ops_in_flight;
      const uint64_t cap_bytes = prefetch ? o_.prefetch_max_bytes : o_.max_bytes_in_flight;
      const bool fits = ops_ + 1 <= cap_ops && bytes_ + len <= cap_bytes;
      if (!fits && ops_ > 0) return std::nullopt;
      SubIo s{p, p->req.offset + p->dispatched, len,
              static_cast<std::byte*>(p->req.dst) + p->dispatched};
      p->dispatched += len;
      ++p->outstanding;
      if (p->dispatched == p->req.length) queues_[c].pop_front();
      if (p->result.stamps.submit_ns == 0) p->result.stamps.submit_ns = MonotonicNowNs();
      ++ops_;
      bytes_ += len;
      ++stats_.sub_ios;
      stats_.max_ops_in_flight_seen = std::max(stats_.max_ops_in_flight_seen, ops_);
      stats_.max_bytes_in_flight_seen = std::max(stats_.max_bytes_in_flight_seen, bytes_);
      return s;
    }
    return std::nullopt;
  }

  // Records a finished sub-IO (`res` = bytes read or -errno). Returns the request when this
  // was its last sub-IO; the caller then runs its completion outside the lock.
  std::unique_ptr<Pending> Done(const SubIo& s, int64_t res) {
    Pending* p = s.pending;
    --ops_;
    bytes_ -= s.length;
    --p->outstanding;
    ReadResult& r = p->result;
    if (res < 0) {
      if (r.status.ok()) {
        r.status = ReadErrnoStatus(r.chunk_id, s.length, s.offset, static_cast<int>(-res));
      }
    } else if (static_cast<uint64_t>(res) < s.length) {
      r.bytes += static_cast<uint64_t>(res);
      if (r.status.ok()) {
        r.status = ShortReadStatus(r.chunk_id, static_cast<uint64_t>(res), s.length, s.offset);
      }
    } else {
      r.bytes += s.length;
    }
    if (p->outstanding > 0 || p->dispatched < p->req.length) return nullptr;
    r.stamps.complete_ns = MonotonicNowNs();
    ++stats_.completed[static_cast<int>(r.io_class)];
    if (!r.status.ok()) ++stats_.failed;
    auto it = live_.find(p);
    KVTIER_CHECK(it != live_.end(), "completed request is not live");
    std::unique_ptr<Pending> out = std::move(it->second);
    live_.erase(it);
    return out;
  }

  bool Idle() const { return live_.empty(); }
  void set_paused(bool paused) { paused_ = paused; }
  IoEngineStats& stats() { return stats_; }

 private:
  const IoEngineOptions o_;
  bool paused_;
  std::deque<Pending*> queues_[kNumIoClasses];
  std::unordered_map<Pending*, std::unique_ptr<Pending>> live_;
  uint32_t ops_ = 0;
  uint64_t bytes_ = 0;
  IoEngineStats stats_;
};

void Finish(std::unique_ptr<Pending> p) {
  if (p->req.on_complete) p->req.on_complete(p->result);
}

// Checks a request's contract; a violation completes it with InvalidArgument.
Status Validate(const ReadRequest& r, uint32_t align) {
  const auto addr = reinterpret_cast<uintptr_t>(r.dst);
  if (r.length == 0 || r.dst == nullptr || r.offset % align || r.length % align || addr % align) {
    return Status::InvalidArgument(
        ChunkName(r.chunk_id) + ": misaligned or empty read (offset " + std::to_string(r.offset) +
        ", length " + std::to_string(r.length) + ", buffer " +
        (r.dst ? "0x" + std::to_string(addr % align) + " past alignment" : std::string("null")) +
        "; alignment " + std::to_string(align) + ")");
  }
  return Status::OK();
}

bool RejectInvalid(ReadRequest& req, uint32_t align) {
  Status s = Validate(req, align);
  if (s.ok()) return false;
  ReadResult r;
  r.chunk_id = req.chunk_id;
  r.tag = req.tag;
  r.io_class = req.io_class;
  r.status = std::move(s);
  r.stamps.enqueue_ns = r.stamps.complete_ns = MonotonicNowNs();
  if (req.on_complete) req.on_complete(r);
  return true;
}

// --- io_uring backend ---------------------------------------------------------------------------

constexpr uint64_t kEventfdTag = ~0ull;

class UringEngine final : public IoEngine {
 public:
  UringEngine(int fd, const IoEngineOptions& o) : fd_(fd), o_(o), sched_(o) {}

  // Returns the negative errno of io_uring_queue_init on failure (for the kAuto fallback).
  Status Init(int* setup_errno) {
    *setup_errno = 0;
    unsigned entries = 8;
    while (entries < o_.max_ops_in_flight + 2) entries <<= 1;
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) {
      *setup_errno = -rc;
      return Status::Unavailable("io_uring_queue_init(" + std::to_string(entries) +
                                 "): " + ErrnoText(-rc));
    }
    ring_ok_ = true;
    int efd = ::eventfd(0, EFD_CLOEXEC);
    if (efd < 0) return Status::IoError("io engine: eventfd: " + ErrnoText(errno));
    efd_.reset(efd);
    if (o_.register_file && fd_ >= 0 && io_uring_register_files(&ring_, &fd_, 1) == 0) {
      fixed_file_ = true;
    }
    if (!o_.fixed_buffers.empty()) {
      rc = io_uring_register_buffers(&ring_, o_.fixed_buffers.data(),
                                     static_cast<unsigned>(o_.fixed_buffers.size()));
      if (rc < 0) {
        return Status::IoError("io engine: io_uring_register_buffers (" +
                               std::to_string(o_.fixed_buffers.size()) +
                               " buffers): " + ErrnoText(-rc));
      }
    }
    slots_.resize(o_.max_ops_in_flight);
    for (uint32_t i = 0; i < o_.max_ops_in_flight; ++i) free_slots_.push_back(i);
    thread_ = std::thread([this] { Loop(); });
    return Status::OK();
  }

  ~UringEngine() override {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        sched_.set_paused(false);
      }
      Wake();
      thread_.join();
    }
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }

  void Submit(ReadRequest req) override {
    if (RejectInvalid(req, o_.alignment)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      KVTIER_CHECK(!stop_, "IoEngine::Submit after shutdown began");
      sched_.Add(std::move(req));
    }
    Wake();
  }
  void SubmitBatch(std::vector<ReadRequest> reqs) override {
    std::erase_if(reqs, [&](ReadRequest& r) { return RejectInvalid(r, o_.alignment); });
    if (reqs.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      KVTIER_CHECK(!stop_, "IoEngine::SubmitBatch after shutdown began");
      for (ReadRequest& r : reqs) sched_.Add(std::move(r));
    }
    Wake();
  }
  void Pause() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) sched_.set_paused(true);
  }
  void Resume() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sched_.set_paused(false);
    }
    Wake();
  }
  IoEngineOptions::Backend backend() const override { return IoEngineOptions::Backend::kIoUring; }
  IoEngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return const_cast<Scheduler&>(sched_).stats();
  }

 private:
  void Wake() {
    uint64_t one = 1;
    (void)!::write(efd_.get(), &one, sizeof(one));
  }

  void ArmEventfd() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    KVTIER_CHECK(sqe != nullptr, "io_uring SQ full while arming the eventfd read");
    io_uring_prep_read(sqe, efd_.get(), &efd_value_, sizeof(efd_value_), 0);
    io_uring_sqe_set_data64(sqe, kEventfdTag);
  }

  // Fills SQEs with every admitted sub-IO; returns how many. Called with mu_ held.
  int Dispatch() {
    int n = 0;
    while (!free_slots_.empty()) {
      std::optional<SubIo> s = sched_.Next();
      if (!s) return n;
      ++n;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      KVTIER_CHECK(sqe != nullptr, "io_uring SQ full: ring sized below max_ops_in_flight");
      const uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot] = *s;
      const int fd = fixed_file_ ? 0 : fd_;
      const int buf = FixedBufferIndex(s->dst, s->length);
      if (buf >= 0) {
        io_uring_prep_read_fixed(sqe, fd, s->dst, static_cast<unsigned>(s->length), s->offset, buf);
        ++sched_.stats().fixed_buffer_reads;
      } else {
        io_uring_prep_read(sqe, fd, s->dst, static_cast<unsigned>(s->length), s->offset);
      }
      if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, slot);
    }
    return n;
  }

  int FixedBufferIndex(const std::byte* p, uint64_t len) const {
    for (size_t i = 0; i < o_.fixed_buffers.size(); ++i) {
      const auto* base = static_cast<const std::byte*>(o_.fixed_buffers[i].iov_base);
      if (p >= base && p + len <= base + o_.fixed_buffers[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }

  void Loop() {
    PreciseTimers();  // completions may run a copy here, paced with sleeps (hw_executor.cc)
    ArmEventfd();
    std::vector<std::unique_ptr<Pending>> finished;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (Dispatch() > 0) ++sched_.stats().submit_calls;  // all of them in the one submit below
        if (stop_ && sched_.Idle()) break;
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        KVTIER_CHECK(false, "io_uring_submit_and_wait failed");
      }
      bool rearm = false;
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        io_uring_for_each_cqe(&ring_, head, cqe) {
          ++seen;
          const uint64_t tag = io_uring_cqe_get_data64(cqe);
          if (tag == kEventfdTag) {
            rearm = true;
            continue;
          }
          const SubIo s = slots_[tag];
          free_slots_.push_back(static_cast<uint32_t>(tag));
          if (auto p = sched_.Done(s, cqe->res)) finished.push_back(std::move(p));
        }
        io_uring_cq_advance(&ring_, seen);
      }
      if (rearm) ArmEventfd();
      for (auto& p : finished) Finish(std::move(p));
      finished.clear();
    }
  }

  const int fd_;
  const IoEngineOptions o_;
  io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_file_ = false;
  UniqueFd efd_;
  uint64_t efd_value_ = 0;
  std::thread thread_;
  std::vector<SubIo> slots_;          // Ring thread only.
  std::vector<uint32_t> free_slots_;  // Ring thread only (under mu_).

  mutable std::mutex mu_;
  Scheduler sched_;
  bool stop_ = false;
};

// --- pread thread-pool backend ------------------------------------------------------------------

class PreadEngine final : public IoEngine {
 public:
  PreadEngine(int fd, const IoEngineOptions& o) : fd_(fd), o_(o), sched_(o) {
    for (uint32_t i = 0; i < std::max(1u, o.pread_threads); ++i) {
      workers_.emplace_back([this] { Worker(); });
    }
  }
  ~PreadEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      sched_.set_paused(false);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void Submit(ReadRequest req) override {
    if (RejectInvalid(req, o_.alignment)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      KVTIER_CHECK(!stop_, "IoEngine::Submit after shutdown began");
      sched_.Add(std::move(req));
    }
    cv_.notify_all();
  }
  void SubmitBatch(std::vector<ReadRequest> reqs) override {
    std::erase_if(reqs, [&](ReadRequest& r) { return RejectInvalid(r, o_.alignment); });
    if (reqs.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      KVTIER_CHECK(!stop_, "IoEngine::SubmitBatch after shutdown began");
      for (ReadRequest& r : reqs) sched_.Add(std::move(r));
    }
    cv_.notify_all();
  }
  void Pause() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) sched_.set_paused(true);
  }
  void Resume() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sched_.set_paused(false);
    }
    cv_.notify_all();
  }
  IoEngineOptions::Backend backend() const override { return IoEngineOptions::Backend::kPread; }
  IoEngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return const_cast<Scheduler&>(sched_).stats();
  }

 private:
  void Worker() {
    PreciseTimers();  // completions may run a copy here, paced with sleeps (hw_executor.cc)
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      std::optional<SubIo> s = sched_.Next();
      if (!s) {
        if (stop_ && sched_.Idle()) return;
        cv_.wait(lock);
        continue;
      }
      lock.unlock();
      int64_t res = ReadFully(*s);
      lock.lock();
      std::unique_ptr<Pending> p = sched_.Done(*s, res);
      cv_.notify_all();  // Caps freed; or the last request finished.
      if (p) {
        lock.unlock();
        Finish(std::move(p));
        lock.lock();
      }
    }
  }

  // Bytes read (short at EOF) or -errno.
  int64_t ReadFully(const SubIo& s) const {
    uint64_t got = 0;
    while (got < s.length) {
      ssize_t n = ::pread(fd_, s.dst + got, s.length - got, static_cast<off_t>(s.offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return -errno;
      if (n == 0) break;
      got += static_cast<uint64_t>(n);
    }
    return static_cast<int64_t>(got);
  }

  const int fd_;
  const IoEngineOptions o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Scheduler sched_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

Status ReadErrnoStatus(ChunkId chunk, uint64_t length, uint64_t offset, int err) {
  return Status::IoError(ChunkName(chunk) + ": read " + std::to_string(length) +
                         " bytes at offset " + std::to_string(offset) + ": " + ErrnoText(err));
}

Status ShortReadStatus(ChunkId chunk, uint64_t got, uint64_t length, uint64_t offset) {
  return Status::IoError(ChunkName(chunk) + ": short read " + std::to_string(got) + " < " +
                         std::to_string(length) + " bytes at offset " + std::to_string(offset));
}

std::string_view IoClassName(IoClass c) {
  switch (c) {
    case IoClass::kDemand:
      return "demand";
    case IoClass::kProbe:
      return "probe";
    case IoClass::kPrefetch:
      return "prefetch";
  }
  return "?";
}

std::string_view IoEngine::backend_name() const {
  return backend() == IoEngineOptions::Backend::kIoUring ? "io_uring" : "pread";
}

std::future<ReadResult> IoEngine::SubmitWithFuture(ReadRequest request) {
  auto promise = std::make_shared<std::promise<ReadResult>>();
  std::future<ReadResult> f = promise->get_future();
  request.on_complete = [promise](const ReadResult& r) { promise->set_value(r); };
  Submit(std::move(request));
  return f;
}

Status IoEngine::Create(int fd, const IoEngineOptions& o, std::unique_ptr<IoEngine>* out) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("io engine: " + m); };
  if (o.alignment == 0 || (o.alignment & (o.alignment - 1))) return bad("alignment not 2^k");
  if (o.max_ops_in_flight == 0 || o.max_bytes_in_flight == 0) return bad("zero in-flight cap");
  if (o.prefetch_max_ops > o.max_ops_in_flight || o.prefetch_max_bytes > o.max_bytes_in_flight) {
    return bad("prefetch caps exceed the totals");
  }
  if (o.max_io_bytes == 0 || o.max_io_bytes % o.alignment) {
    return bad("max_io_bytes not a positive multiple of alignment");
  }
  if (o.max_io_bytes > (1u << 30)) return bad("max_io_bytes above 1 GiB");
  using B = IoEngineOptions::Backend;
  if (o.backend != B::kPread) {
    auto engine = std::make_unique<UringEngine>(fd, o);
    int setup_errno = 0;
    Status s = engine->Init(&setup_errno);
    if (s.ok()) {
      *out = std::move(engine);
      return s;
    }
    // Only a ring that cannot be set up falls back; other failures are real errors.
    if (o.backend == B::kIoUring || setup_errno == 0) return s;
  }
  *out = std::make_unique<PreadEngine>(fd, o);
  return Status::OK();
}

}  // namespace kvtier::hw
