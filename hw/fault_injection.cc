#include "hw/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

// What a poisoned byte holds: neither zero (a fresh extent) nor any chunk's content pattern.
constexpr std::byte kPoison{0xA5};

// Runs callbacks at their due CLOCK_MONOTONIC time on one thread (slow_read's held completions).
// The destructor delivers everything still queued, each at its due time, then stops.
class Delayer {
 public:
  Delayer() : thread_([this] { Loop(); }) {}
  ~Delayer() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Add(std::int64_t due_ns, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.emplace(due_ns, std::move(fn));
    }
    cv_.notify_all();
  }

 private:
  void Loop() {
    PreciseTimers();
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      if (queue_.empty()) {
        if (stop_) return;
        cv_.wait(l);
        continue;
      }
      const std::int64_t due = queue_.begin()->first;
      const std::int64_t now = MonotonicNowNs();
      if (now < due) {
        cv_.wait_for(l, std::chrono::nanoseconds(due - now));
        continue;
      }
      std::function<void()> fn = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      l.unlock();
      fn();
      l.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<std::int64_t, std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is constructed
};

// The IoEngine decorator (header comment). Requests without a fault go to the real engine
// unchanged; a faulted one gets a completion that rewrites (or holds) the real result.
class FaultyIoEngine final : public IoEngine {
 public:
  FaultyIoEngine(std::unique_ptr<IoEngine> target, FaultInjector* faults)
      : target_(std::move(target)), faults_(faults) {}
  // The real engine completes every request first (into the delayer for held ones), then the
  // delayer delivers what it holds.
  ~FaultyIoEngine() override {
    target_.reset();
    delayer_.reset();
  }

  void Submit(ReadRequest request) override { target_->Submit(Arm(std::move(request))); }
  void SubmitBatch(std::vector<ReadRequest> requests) override {
    for (ReadRequest& r : requests) r = Arm(std::move(r));
    target_->SubmitBatch(std::move(requests));
  }
  void Pause() override { target_->Pause(); }
  void Resume() override { target_->Resume(); }
  IoEngineOptions::Backend backend() const override { return target_->backend(); }
  IoEngineStats stats() const override {
    IoEngineStats s = target_->stats();
    s.failed += failed_.load();
    return s;
  }

 private:
  ReadRequest Arm(ReadRequest r) {
    const FaultRule* rule = faults_->Next(FaultClass::kRead);
    if (rule == nullptr) return r;
    auto done = std::move(r.on_complete);
    auto* dst = static_cast<std::byte*>(r.dst);
    const std::uint64_t length = r.length, offset = r.offset;
    switch (rule->kind) {
      case FaultKind::kReadEio:
        r.on_complete = [this, done, dst, length, offset](const ReadResult& real) {
          ReadResult x = real;
          if (real.status.ok()) {
            std::memset(dst, int(kPoison), length);
            x.bytes = 0;
            x.status = ReadErrnoStatus(real.chunk_id, length, offset, EIO);
            ++failed_;
          }
          if (done) done(x);
        };
        break;
      case FaultKind::kShortRead:
        r.on_complete = [this, done, dst, length, offset](const ReadResult& real) {
          ReadResult x = real;
          if (real.status.ok()) {
            const std::uint64_t got = length / 2 / 512 * 512;
            std::memset(dst + got, int(kPoison), length - got);
            x.bytes = got;
            x.status = ShortReadStatus(real.chunk_id, got, length, offset);
            ++failed_;
          }
          if (done) done(x);
        };
        break;
      case FaultKind::kSlowRead: {
        const auto delay_ns = std::int64_t(rule->delay_s * 1e9);
        r.on_complete = [this, done, delay_ns](const ReadResult& real) {
          delayer_->Add(MonotonicNowNs() + delay_ns, [done, real] {
            ReadResult x = real;
            x.stamps.complete_ns = MonotonicNowNs();
            if (done) done(x);
          });
        };
        break;
      }
      default:
        r.on_complete = std::move(done);  // not a read fault: never returned for kRead
        break;
    }
    return r;
  }

  std::unique_ptr<IoEngine> target_;
  FaultInjector* faults_;
  std::unique_ptr<Delayer> delayer_ = std::make_unique<Delayer>();
  std::atomic<std::uint64_t> failed_{0};
};

// The DeviceBackend decorator: the chosen call fails as a CUDA error would, moving nothing.
class FaultyBackend final : public DeviceBackendWrapper {
 public:
  FaultyBackend(std::unique_ptr<DeviceBackend> target, FaultInjector* faults)
      : DeviceBackendWrapper(std::move(target)), faults_(faults) {}

  Status Copy(CopyDirection direction, std::span<const CopyPiece> pieces, std::uint32_t copies,
              const std::function<void()>& release, Interval* when) override {
    const bool h2d = direction == CopyDirection::kHostToDevice;
    if (const FaultRule* r = faults_->Next(h2d ? FaultClass::kH2D : FaultClass::kD2H)) {
      return Fail(*r, h2d ? "cudaMemcpyAsync (H2D)" : "cudaMemcpyAsync (D2H)", release, when);
    }
    return DeviceBackendWrapper::Copy(direction, pieces, copies, release, when);
  }
  Status CopyBatched(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                     Interval* when) override {
    if (const FaultRule* r = faults_->Next(FaultClass::kH2D)) {
      return Fail(*r, "cudaMemcpyBatchAsync", release, when);
    }
    return DeviceBackendWrapper::CopyBatched(pieces, release, when);
  }
  Status DeviceGather(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                      Interval* when) override {
    if (const FaultRule* r = faults_->Next(FaultClass::kH2D)) {
      return Fail(*r, "gather kernel launch", release, when);
    }
    return DeviceBackendWrapper::DeviceGather(pieces, release, when);
  }
  Status Gather(std::span<const CopyPiece> pieces) override {
    if (const FaultRule* r = faults_->Next(FaultClass::kGather)) {
      return Fail(*r, "gather", nullptr, nullptr);
    }
    return DeviceBackendWrapper::Gather(pieces);
  }
  Status Compute(const ComputeOp& op, Seconds ready_s, Interval* when) override {
    if (const FaultRule* r = faults_->Next(FaultClass::kCompute)) {
      return Fail(*r, "compute kernel", nullptr, when);
    }
    return DeviceBackendWrapper::Compute(op, ready_s, when);
  }

 private:
  // The backend contract for a failed call: buffers handed back, *when filled in, the CUDA text.
  static Status Fail(const FaultRule& rule, const char* call, const std::function<void()>& release,
                     Interval* when) {
    if (release) release();
    if (when != nullptr) *when = {};
    return Status::CudaError(std::string("injected ") + Info(rule.kind).name + ": " + call +
                             ": an illegal memory access was encountered");
  }
  FaultInjector* faults_;
};

}  // namespace

FaultInjector::FaultInjector(FaultPlan plan) : plan_(std::move(plan)) {}
FaultInjector::~FaultInjector() = default;

const FaultRule* FaultInjector::Next(FaultClass cls) {
  const std::uint64_t n = ++events_[static_cast<int>(cls)];
  for (const FaultRule& r : plan_.rules) {
    if (Info(r.kind).event_class != cls || (r.nth != 0 && r.nth != n)) continue;
    ++injected_[static_cast<int>(r.kind)];
    return &r;
  }
  return nullptr;
}

std::uint64_t FaultInjector::events(FaultClass cls) const {
  return events_[static_cast<int>(cls)].load();
}

std::uint64_t FaultInjector::injected(FaultKind kind) const {
  return injected_[static_cast<int>(kind)].load();
}

std::unique_ptr<IoEngine> FaultInjector::WrapIoEngine(std::unique_ptr<IoEngine> engine) {
  return std::make_unique<FaultyIoEngine>(std::move(engine), this);
}

std::unique_ptr<DeviceBackend> FaultInjector::WrapBackend(std::unique_ptr<DeviceBackend> backend) {
  return std::make_unique<FaultyBackend>(std::move(backend), this);
}

int FaultInjector::WriteExtent(ChunkId id, int fd, std::span<const std::byte> extent,
                               std::uint64_t offset) {
  const FaultRule* rule = Next(FaultClass::kWrite);
  if (rule == nullptr) return PwriteAll(fd, extent.data(), extent.size(), offset);
  switch (rule->kind) {
    case FaultKind::kWriteEnospc: return ENOSPC;
    case FaultKind::kWriteEio: return EIO;
    default: break;
  }
  // A torn write: the first half of the extent really lands (4 KiB-aligned for O_DIRECT).
  const std::size_t half = extent.size() / 2 / kChunkAlign * kChunkAlign;
  if (half > 0) {
    if (int err = PwriteAll(fd, extent.data(), half, offset)) return err;
  }
  switch (rule->kind) {
    case FaultKind::kTornWriteKill:
      std::fprintf(stderr,
                   "kvtier: fault injection: torn_write_kill: %s: %zu of %zu bytes written at "
                   "offset %llu; killing process %d\n",
                   DescribeChunk(id).c_str(), half, extent.size(),
                   static_cast<unsigned long long>(offset), int(::getpid()));
      ::fdatasync(fd);  // the torn half is on disk, as a crash mid-write would leave it
      ::kill(::getpid(), SIGKILL);
      ::pause();  // not reached
      return EIO;
    case FaultKind::kTornWriteSilent: return 0;
    default: return EIO;  // kTornWrite
  }
}

}  // namespace kvtier::hw
