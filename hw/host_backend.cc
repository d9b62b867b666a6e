// The host backend (hw/device_backend.h): no GPU. "Device memory" is a separate host mapping,
// a copy is a memcpy paced to the configured link, compute is the cost model's duration slept
// or Eigen at the model's shapes (hw/host_compute.h). Developers' machines and CI run this.
// The GPU-only transfer strategies are emulated: a batched copy and a device gather memcpy the
// same descriptors the CUDA calls would get, paced to what the simulator charges for the one
// call (sim/sim_executor.cc), and a device gather slows modeled compute that overlaps it by
// gpu.gather_sm_share of the overlap, as the simulator does.

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

#include "core/check.h"
#include "hw/device_backend.h"
#include "hw/host_compute.h"
#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

void CopyOnHost(std::span<const CopyPiece> pieces) {
  for (const CopyPiece& p : pieces) {
    if (p.bytes > 0) std::memcpy(p.dst, p.src, p.bytes);
  }
}

class HostBackend : public DeviceBackend {
 public:
  HostBackend(DeviceBackendOptions options, const HostClock* clock)
      : options_(std::move(options)), clock_(clock) {
    if (options_.compute == ComputeMode::kReal) {
      real_ = std::make_unique<HostCompute>(options_.model);
    }
  }

  BackendKind kind() const override { return BackendKind::kHost; }

  Status AllocateHost(const HostArenaOptions& options, std::unique_ptr<HostArena>* out) override {
    return HostArena::Create(options, out);  // nothing to pin for: memcpy reads any memory
  }
  Status AllocateDevice(Bytes slot_bytes, std::uint32_t slot_count,
                        std::unique_ptr<DeviceArena>* out) override {
    return DeviceArena::CreateOnHost(slot_bytes, slot_count, out);
  }
  Status WriteDevice(std::byte* dst, const std::byte* src, Bytes bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }

  Status Copy(CopyDirection direction, std::span<const CopyPiece> pieces, std::uint32_t copies,
              const std::function<void()>& release, Interval* when) override {
    const std::int64_t start_ns = MonotonicNowNs();
    when->start_s = clock_->ToSeconds(start_ns);
    Bytes moved = 0;
    for (const CopyPiece& p : pieces) moved += p.bytes;
    CopyOnHost(pieces);
    if (release) release();  // memcpy: every byte is in place
    if (options_.pace_pcie) {
      // The link cannot be faster than configured: bytes / bw + latency per copy, counted from
      // the copy's start on this (serial) lane. Pacing only ever slows a copy down.
      const HardwareOptions& hw = options_.hardware;
      const double bw = direction == CopyDirection::kHostToDevice ? hw.pcie_h2d_bw : hw.pcie_d2h_bw;
      const double min_s = double(moved) / bw + double(copies) * hw.pcie_latency;
      SleepUntilNs(start_ns + std::int64_t(min_s * 1e9));
    }
    when->end_s = clock_->Now();
    return Status::OK();
  }

  // One cudaMemcpyBatchAsync stands for the pieces: charged once per call plus per descriptor.
  Status CopyBatched(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                     Interval* when) override {
    const std::int64_t start_ns = MonotonicNowNs();
    when->start_s = clock_->ToSeconds(start_ns);
    const Bytes moved = CopyOnHostCounted(pieces);
    if (release) release();
    if (options_.pace_pcie) {
      const HardwareOptions& hw = options_.hardware;
      const double min_s = double(moved) / hw.pcie_h2d_bw + hw.pcie_batch_latency +
                           double(pieces.size()) * hw.pcie_descriptor_cost;
      SleepUntilNs(start_ns + std::int64_t(min_s * 1e9));
    }
    when->end_s = clock_->Now();
    return Status::OK();
  }

  // One gather kernel stands for the runs: it reads host memory at min(link, kernel) rate and
  // pays one launch. While it runs, modeled compute is slowed (Compute below).
  Status DeviceGather(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                      Interval* when) override {
    const std::int64_t start_ns = MonotonicNowNs();
    when->start_s = clock_->ToSeconds(start_ns);
    {
      std::lock_guard<std::mutex> l(gather_mu_);
      gather_active_ns_ = start_ns;
    }
    const Bytes moved = CopyOnHostCounted(pieces);
    if (release) release();
    if (options_.pace_pcie) {
      const HardwareOptions& hw = options_.hardware;
      const double bw = std::min(hw.pcie_h2d_bw, hw.gpu_gather_bw);
      const double min_s = double(moved) / bw + hw.gpu_kernel_overhead;
      SleepUntilNs(start_ns + std::int64_t(min_s * 1e9));
    }
    const std::int64_t end_ns = MonotonicNowNs();
    {
      std::lock_guard<std::mutex> l(gather_mu_);
      gather_active_ns_ = -1;
      gathers_.push_back({start_ns, end_ns});
      if (gathers_.size() > kKeptGathers) gathers_.pop_front();
    }
    when->end_s = clock_->ToSeconds(end_ns);
    return Status::OK();
  }

  Status Gather(std::span<const CopyPiece> pieces) override {
    CopyOnHost(pieces);
    return Status::OK();
  }

  Status Compute(const ComputeOp& op, Seconds ready_s, Interval* when) override {
    const std::int64_t start_ns = MonotonicNowNs();
    when->start_s = clock_->ToSeconds(start_ns);
    if (real_) {
      real_->Run(op);
    } else {
      // The modeled duration d, stretched by gpu.gather_sm_share of the time a device gather ran
      // beside it (the kernel takes SMs from the compute): re-checked after each sleep, since
      // the stretch may meet a later gather. d includes the step's launch, gpu.kernel_overhead
      // (on this backend kvtier calibrate measures it as the thread hand-off), and the hand-off
      // into this lane really happened between `ready_s` and now: the step ends d after it
      // became ready, as the simulator's does, but never sooner than its work without that one
      // launch after it started (a hand-off slower than the launch is not hidden).
      const std::int64_t d_ns = std::int64_t(options_.timer->OpSeconds(op) * 1e9);
      const std::int64_t launch_ns = std::min<std::int64_t>(
          d_ns, std::int64_t(options_.hardware.gpu_kernel_overhead * 1e9));
      const std::int64_t ready_ns =
          std::min(start_ns, clock_->t0_ns() + std::int64_t(ready_s * 1e9));
      const double share = options_.hardware.gpu_gather_sm_share;
      const std::int64_t base_end_ns = std::max(ready_ns + d_ns, start_ns + d_ns - launch_ns);
      std::int64_t end_ns = base_end_ns;
      while (true) {
        SleepUntilNs(end_ns);
        if (share <= 0) break;
        const std::int64_t want =
            base_end_ns + std::int64_t(share * double(GatherOverlapNs(start_ns, end_ns)));
        if (want <= end_ns) break;
        end_ns = want;
      }
    }
    when->end_s = clock_->Now();
    return Status::OK();
  }

  Status OnClockReset() override { return Status::OK(); }  // host timestamps are the clock's

 private:
  static Bytes CopyOnHostCounted(std::span<const CopyPiece> pieces) {
    Bytes moved = 0;
    for (const CopyPiece& p : pieces) moved += p.bytes;
    CopyOnHost(pieces);
    return moved;
  }

  // Nanoseconds of [begin, end) during which a device gather ran (one at a time: H2D lane).
  std::int64_t GatherOverlapNs(std::int64_t begin, std::int64_t end) {
    std::lock_guard<std::mutex> l(gather_mu_);
    std::int64_t overlap = 0;
    auto add = [&](std::int64_t b, std::int64_t e) {
      overlap += std::max<std::int64_t>(0, std::min(e, end) - std::max(b, begin));
    };
    for (const auto& [b, e] : gathers_) add(b, e);
    if (gather_active_ns_ >= 0) add(gather_active_ns_, MonotonicNowNs());
    return overlap;
  }

  // Device gathers that ran (monotonic ns), the latest kKeptGathers: a compute step overlaps
  // only the few around it.
  static constexpr std::size_t kKeptGathers = 256;
  std::mutex gather_mu_;
  std::deque<std::pair<std::int64_t, std::int64_t>> gathers_;
  std::int64_t gather_active_ns_ = -1;  // start of the one running, -1: none

  DeviceBackendOptions options_;
  const HostClock* clock_;
  std::unique_ptr<HostCompute> real_;  // compute = real
};

}  // namespace

Status CreateHostBackend(DeviceBackendOptions options, const HostClock* clock,
                         std::unique_ptr<DeviceBackend>* out) {
  if (options.compute == ComputeMode::kModeled && !options.timer) {
    return Status::InvalidArgument("host backend: modeled compute needs the cost model");
  }
  *out = std::make_unique<HostBackend>(std::move(options), clock);
  return Status::OK();
}

}  // namespace kvtier::hw
