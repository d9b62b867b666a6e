#pragma once
// FakeExecutor: an Executor with scripted durations on FIFO resources, for unit and parity
// tests of the Pipeline. Each resource (SSD, H2D, D2H, CPU, GPU) serves its operations one at
// a time in submission order; an operation starts at max(submission, end of its
// dependencies, its resource's free time) and lasts
//   transfers: ios * latency + bytes / bandwidth (per resource);
//   compute:   options.compute(op) (default: options.compute_s).
// Times are computed at submission, so Wait, WaitAny, IdleUntil and Drain only advance the
// clock. Deterministic.
//
// Failures can be scripted (FakeFailure): the chosen operations run for their duration and
// then fail with the scripted status (a transfer's message names its first chunk, as hw's
// errors do); the bytes they moved before failing are half of theirs. Following the Executor
// contract (core/executor.h, "Failure"), an operation one of whose dependencies failed does
// not run: it completes at that dependency's end, taking no time on its resource, with
// AbortedAfter(the failed op, its status).

#include <algorithm>
#include <functional>
#include <optional>
#include <unordered_map>

#include "core/executor.h"

namespace kvtier::testing {

// Which operations fail. An operation matches when every field that is set matches; the
// `nth` matching operation fails (1 = the first), or every matching one with nth = 0.
// Operations that are aborted (a dependency failed) never run and are not counted.
struct FakeFailure {
  std::optional<TransferKind> transfer;  // a transfer of this kind
  std::optional<ComputeKind> compute;    // a compute step of this kind
  std::optional<Purpose> purpose;        // transfers only
  std::optional<int> layer;
  int nth = 1;
  Status status = Status::IoError("scripted I/O error (EIO)");
};

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
  std::vector<FakeFailure> failures;
};

enum class FakeResource { kSsdRead, kSsdWrite, kH2D, kD2H, kCpu, kGpu };

class FakeExecutor : public Executor {
 public:
  explicit FakeExecutor(FakeExecutorOptions options) : options_(std::move(options)) {
    matched_.assign(options_.failures.size(), 0);
  }

  Seconds Now() override { return now_; }
  OpId Submit(TransferOp op, std::span<const OpId> after) override;
  OpId Submit(ComputeOp op, std::span<const OpId> after) override;
  Status Wait(OpId op) override;
  std::size_t WaitAny(std::span<const OpId> ops) override;
  bool Done(OpId op) override;
  OpTimes Retire(OpId op) override;
  // Moves the clock to `t` (never back).
  void IdleUntil(Seconds t) override { now_ = std::max(now_, t); }
  // Moves the clock to the end of the last op submitted and not retired.
  void Drain() override;

  // Every op ever submitted, in submission order (kept after Retire), for assertions.
  struct Submitted {
    OpId id;
    bool is_transfer;
    TransferOp transfer;
    ComputeOp compute;
    OpTimes times;  // with the status it completed with
  };
  const std::vector<Submitted>& history() const { return history_; }

 private:
  struct Live {
    OpTimes times;
    std::string what;  // DescribeOp, for its dependents' abort status
  };
  // The scripted failure of an op about to run, if one matches (counts the match).
  std::optional<Status> ScriptedFailure(const TransferOp* t, const ComputeOp* c);
  OpId Schedule(FakeResource resource, Seconds duration, std::span<const OpId> after,
                const TransferOp* t, const ComputeOp* c);

  FakeExecutorOptions options_;
  std::vector<int> matched_;  // per scripted failure: matching ops run so far
  Seconds now_ = 0;
  OpId next_ = 1;
  std::unordered_map<OpId, Live> live_;
  std::unordered_map<int, Seconds> free_at_;
  std::vector<Submitted> history_;
};

}  // namespace kvtier::testing
