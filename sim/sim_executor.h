#pragma once
// SimExecutor: core's Executor on SimGrid 3.32. It builds a platform from a HardwareOptions
// profile and turns each operation into one SimGrid activity:
//   SSD read/write  a comm ssd<->cpu over the `ssd_read`/`ssd_write` links, both also through a
//                   shared `ssd_rw` link (reads and writes share the device, like DiskS19);
//   H2D / D2H       a comm cpu<->gpu over the split-duplex `pcie` link;
//   CPU gather      an exec on the `cpu` host (speed = gather bandwidth, flops = bytes);
//   compute         an exec on the `gpu` host (speed 1, flops = seconds from the cost model,
//                   corrected by the measured gpu.layer_table when set: models/layer_table.h).
// Per-I/O costs are charged as equivalent bytes on the same resource, so they also occupy it
// under contention: an SSD op of `ios` I/Os at queue depth QD costs ceil(ios/QD) * ssd.latency,
// a PCIe op `ios` * pcie.latency. Alone, an op of b bytes takes exactly b/bw + that latency.
// Concurrent activities share resources max-min fairly (CM02, no cross-traffic, no TCP gamma:
// notes/simgrid-3.32 P12), which is how prefetch, background writes and demand loads contend.
//
// Dependencies (`after`) are resolved here, not by SimGrid: in 3.32 an actor-started activity
// releases its successors only when the actor observes its completion. An op whose
// dependencies are pending waits in a list and is started from inside Wait/WaitAny/IdleUntil
// at the exact simulated time its last dependency completes — simulated time only advances
// while the driving actor waits, so this is exact.
//
// One SimExecutor per process (SimGrid's Engine is a singleton; notes P3). All methods must be
// called from the one actor that drives the Pipeline.

#include <memory>
#include <unordered_map>
#include <vector>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/options.h"
#include "models/layer_table.h"

namespace kvtier::sim {

class SimExecutor : public Executor {
 public:
  // Creates the SimGrid engine and platform. REQUIRES: no other SimExecutor in this process.
  // Reads hardware.gpu_layer_table when set; throws ConfigError (before creating the engine)
  // when that table is missing or bad.
  SimExecutor(const ModelSpec& model, const HardwareOptions& hardware);
  // Same, with compute timed by `timer` (built from the same model and hardware).
  SimExecutor(const ModelSpec& model, const HardwareOptions& hardware, ComputeTimer timer);
  ~SimExecutor() override;

  // Runs `body` as the one driving actor and returns when the simulation has ended (every
  // activity finished). Exceptions thrown by `body` are rethrown here.
  void Run(std::function<void()> body);

  Seconds Now() override;
  OpId Submit(TransferOp op, std::span<const OpId> after) override;
  OpId Submit(ComputeOp op, std::span<const OpId> after) override;
  Status Wait(OpId op) override;
  std::size_t WaitAny(std::span<const OpId> ops) override;
  bool Done(OpId op) override;
  OpTimes Retire(OpId op) override;

  // Lets simulated time pass until `t` (a request's arrival) while background work proceeds.
  void IdleUntil(Seconds t);
  // Waits until every submitted op has completed.
  void Drain();

  std::uint64_t activities_started() const { return activities_; }
  // What times compute ops (the roofline, or the measured table).
  const ComputeTimer& compute_timer() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint64_t activities_ = 0;
};

}  // namespace kvtier::sim
