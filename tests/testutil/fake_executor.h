#pragma once
// FakeExecutor: an Executor with scripted durations on FIFO resources, for unit and parity
// tests of the Pipeline. Each resource (SSD, H2D, D2H, CPU, GPU) serves its operations one at
// a time in submission order; an operation starts at max(submission, end of its
// dependencies, its resource's free time) and lasts
//   transfers: ios * latency + bytes / bandwidth (per resource);
//   compute:   options.compute(op) (default: options.compute_s).
// Times are computed at submission, so Wait/WaitAny only advance the clock. Deterministic.

#include <functional>
#include <unordered_map>

#include "core/executor.h"

namespace kvtier::testing {

struct FakeExecutorOptions {
  double ssd_read_bw = 1e9;      // bytes/s
  double ssd_write_bw = 1e9;
  Seconds ssd_latency = 0;       // per I/O
  double h2d_bw = 1e10;
  double d2h_bw = 1e10;
  Seconds pcie_latency = 0;      // per copy
  double gather_bw = 1e10;
  Seconds compute_s = 1e-3;      // default duration of any compute step
  std::function<Seconds(const ComputeOp&)> compute;  // overrides compute_s when set
  bool ssd_shared = true;        // reads and writes share one SSD queue
};

enum class FakeResource { kSsdRead, kSsdWrite, kH2D, kD2H, kCpu, kGpu };

class FakeExecutor : public Executor {
 public:
  explicit FakeExecutor(FakeExecutorOptions options) : options_(std::move(options)) {}

  Seconds Now() override { return now_; }
  OpId Submit(TransferOp op, std::span<const OpId> after) override;
  OpId Submit(ComputeOp op, std::span<const OpId> after) override;
  Status Wait(OpId op) override;
  std::size_t WaitAny(std::span<const OpId> ops) override;
  bool Done(OpId op) override;
  OpTimes Retire(OpId op) override;

  // Every op ever submitted, in submission order (kept after Retire), for assertions.
  struct Submitted {
    OpId id;
    bool is_transfer;
    TransferOp transfer;
    ComputeOp compute;
    OpTimes times;
  };
  const std::vector<Submitted>& history() const { return history_; }
  // Lets tests move the clock forward (e.g. to a request's arrival).
  void AdvanceTo(Seconds t) { now_ = std::max(now_, t); }

 private:
  OpId Schedule(FakeResource resource, Seconds duration, std::span<const OpId> after);

  FakeExecutorOptions options_;
  Seconds now_ = 0;
  OpId next_ = 1;
  std::unordered_map<OpId, OpTimes> live_;
  std::unordered_map<int, Seconds> free_at_;
  std::vector<Submitted> history_;
};

}  // namespace kvtier::testing
