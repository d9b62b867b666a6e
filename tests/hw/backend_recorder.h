#pragma once
// A DeviceBackendWrapper that records every copy-like call HwExecutor makes -- Copy (one DMA
// call per piece), CopyBatched, DeviceGather, Gather -- with its pieces, copies and bytes, and
// checks that every piece arrived (its destination equals its source after the call). The
// transfer-strategy tests count what the executor asked for with it.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "hw/device_backend.h"

namespace kvtier::hw {

// One call the executor made to the backend.
struct Call {
  enum What { kCopy, kBatched, kDeviceGather, kGather } what;
  CopyDirection direction = CopyDirection::kHostToDevice;
  std::size_t pieces = 0;
  std::uint32_t copies = 0;
  Bytes bytes = 0;
  std::vector<std::byte> moved;  // the pieces' bytes, in order, as they arrived
};

// Counts every copy-like call; with `check_bytes`, also checks that each piece arrived (dst
// equals src right after the call: only where no other lane can rewrite the source meanwhile,
// i.e. ops run one at a time) and keeps the bytes moved.
class Recorder : public DeviceBackendWrapper {
 public:
  Recorder(std::unique_ptr<DeviceBackend> target, std::vector<Call>* calls, std::mutex* mu,
           bool check_bytes = true)
      : DeviceBackendWrapper(std::move(target)), calls_(calls), mu_(mu),
        check_bytes_(check_bytes) {}
  Status Copy(CopyDirection direction, std::span<const CopyPiece> pieces, std::uint32_t copies,
              const std::function<void()>& release, Interval* when) override {
    Status s = DeviceBackendWrapper::Copy(direction, pieces, copies, release, when);
    Record(Call::kCopy, direction, pieces, copies);
    return s;
  }
  Status CopyBatched(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                     Interval* when) override {
    Status s = DeviceBackendWrapper::CopyBatched(pieces, release, when);
    Record(Call::kBatched, CopyDirection::kHostToDevice, pieces, 1);
    return s;
  }
  Status DeviceGather(std::span<const CopyPiece> pieces, const std::function<void()>& release,
                      Interval* when) override {
    Status s = DeviceBackendWrapper::DeviceGather(pieces, release, when);
    Record(Call::kDeviceGather, CopyDirection::kHostToDevice, pieces, 1);
    return s;
  }
  Status Gather(std::span<const CopyPiece> pieces) override {
    Status s = DeviceBackendWrapper::Gather(pieces);
    Record(Call::kGather, CopyDirection::kHostToDevice, pieces, std::uint32_t(pieces.size()));
    return s;
  }

 private:
  void Record(Call::What what, CopyDirection d, std::span<const CopyPiece> pieces,
              std::uint32_t copies) {
    Call c{what, d, pieces.size(), copies, 0, {}};
    for (const CopyPiece& p : pieces) {
      c.bytes += p.bytes;
      if (!check_bytes_) continue;
      EXPECT_EQ(std::memcmp(p.dst, p.src, p.bytes), 0) << "a piece did not arrive";
      c.moved.insert(c.moved.end(), p.dst, p.dst + p.bytes);
    }
    std::lock_guard<std::mutex> l(*mu_);
    calls_->push_back(std::move(c));
  }
  std::vector<Call>* calls_;
  std::mutex* mu_;
  bool check_bytes_;
};

}  // namespace kvtier::hw
