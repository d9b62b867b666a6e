// The host backend (hw/device_backend.h): no GPU. "Device memory" is a separate host mapping,
// a copy is a memcpy paced to the configured link, compute is the cost model's duration slept
// or Eigen at the model's shapes (hw/host_compute.h). Developers' machines and CI run this.

#include <cstring>
#include <memory>
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

  Status Gather(std::span<const CopyPiece> pieces) override {
    CopyOnHost(pieces);
    return Status::OK();
  }

  Status Compute(const ComputeOp& op, Interval* when) override {
    const std::int64_t start_ns = MonotonicNowNs();
    when->start_s = clock_->ToSeconds(start_ns);
    if (real_) {
      real_->Run(op);
    } else {
      const Seconds d = options_.timer->OpSeconds(op);
      SleepUntilNs(start_ns + std::int64_t(d * 1e9));
    }
    when->end_s = clock_->Now();
    return Status::OK();
  }

  Status OnClockReset() override { return Status::OK(); }  // host timestamps are the clock's

 private:
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
