#pragma once
// SimExecutor: core's Executor on SimGrid 3.32. It builds a platform from a HardwareOptions
// profile and turns each operation into one SimGrid activity:
//   SSD read/write  a comm ssd<->cpu over the `ssd_read`/`ssd_write` links, both also through a
//                   shared `ssd_rw` link (reads and writes share the device, like DiskS19);
//   H2D / D2H       a comm cpu<->gpu over the split-duplex `pcie` link;
//   CPU gather      an exec on the `cpu` host (speed = gather bandwidth, flops = bytes);
//   compute         an exec on the `gpu` host (speed 1, flops = seconds from the cost model,
//                   corrected by the measured gpu.layer_table when set: models/layer_table.h).
//                   The host has one core: compute steps of concurrent prefills share its
//                   throughput fairly (k at once each progress at 1/k of the speed).
// Per-I/O costs are charged as equivalent bytes on the same resource, so they also occupy it
// under contention. Alone, an op of b bytes takes exactly b/bw + its per-op cost:
//   SSD read/write  ceil(ios/QD) * ssd.latency (ios = chunks or merged extents, QD ssd.queue_depth)
//   H2D/D2H kDma    ios * pcie.latency (one per DMA call)
//   kBatched        ios * pcie.batch_latency + descriptors * pcie.descriptor_cost
//   kDeviceGather   b / min(pcie.h2d_bw, gpu.gather_bw) + ios * gpu.kernel_overhead, on the
//                   H2D link; while it runs the `gpu` host runs at 1 - gpu.gather_sm_share
//                   (a second pstate), so compute overlapping it for d seconds ends
//                   d * gpu.gather_sm_share later (the kernel shares the SMs)
//   CPU gather      b / cpu.gather_bw + ios * cpu.gather_run_cost (one memcpy per run)
// (docs/transfer-strategies.md gives the strategies' op counts and the cited defaults.)
// Concurrent activities share resources max-min fairly (CM02, no cross-traffic, no TCP gamma:
// notes/simgrid-3.32 P12), which is how prefetch, background writes and demand loads contend.
// Background SSD transfers (stores and repacks) are capped together at ssd.background_share of
// the device, as hw paces them (hw/hw_executor.h "SSD write"). SSD writes run ssd.write_lanes
// at a time (default 1, hw's one write lane), the others waiting in FIFO order (Start,
// Finish); 0 lets every write run at once, sharing the cap max-min fairly. The foreground sees
// the same device either way (the cap binds however many run); what changes is when each write
// ends, and what a backlog costs: every SimGrid event re-shares the device among all running
// transfers and walks the engine's list of them, so thousands of piled-up stores (an
// overloaded replay) made each activity ~100x dearer with no limit (docs/performance.md).
//
// The driving thread's own time (cpu.driver_op_cost, cpu.driver_wake; 0 in every shipped
// profile): hw's driver plans and submits on a CPU, and after a wait that blocked it runs again
// only once woken. The simulator keeps a driver clock per driving body: each Submit charges
// driver_op_cost on it and the op is submitted (stamped, released) at the new time; a wait
// that blocked sets it to the op's end + driver_wake. The clock runs ahead of the engine
// without running it; every call through which the body observes time or completion (Now,
// Done, TakeDone, Wait, WaitAny, IdleUntil, Drain) first runs the engine up to it, so the
// body sees what hw's driver sees after spending that time, while transfers already released
// proceed meanwhile.
//
// Dependencies (`after`) are resolved here, not by SimGrid: an op whose dependencies are
// pending waits in a list and is started at the exact simulated time its last dependency
// completes.
//
// One driving body (Run(body), Run(1, body): every `kvtier sim` run but concurrent prefills)
// runs in SimGrid's *maestro*, not in an actor: activities start without a context switch and
// complete through Activity::on_completion at their finish time, inside Engine::run, where
// their dependents are started; Wait/WaitAny run the engine until the callback finds the wait
// satisfied (it then makes the engine's vetoed-activity set non-empty, which ends
// Engine::run), IdleUntil runs it until a date. This is ~3x cheaper per activity than an actor
// waking for every completion (notes/simgrid-3.32 section 6) and gives the same simulated
// times (sim_bench's timing digest did not change).
//
// Several driving actors (Run(actors, body), the simulator's concurrent prefills): each may
// call every method. Only one runs at a time; an actor yields only inside Wait, WaitAny,
// IdleUntil and Drain, where the executor hands control to the longest-waiting actor whose
// wait is satisfied, or else waits in SimGrid for the next completion (or the earliest
// IdleUntil deadline) on behalf of all of them. Dependencies stay exact.
//
// Operations never fail: every status is OK (a simulated SSD has no I/O errors).
//
// One SimExecutor per process (SimGrid's Engine is a singleton; notes P3). All methods must be
// called from the body (or the actors) that Run started.

#include <functional>
#include <memory>
#include <vector>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/options.h"
#include "models/layer_table.h"

namespace kvtier::sim {

// The latest simulated time an operation may end at: Retire throws ConfigError past it. At
// 1e9 s (31.7 years) a double still resolves ~1e-7 s, inside SimGrid's 1e-5 s tolerance; past
// ~1e10 s simulated times stop being right (an SSD read latency of 1e9 s gave TTFTs 6% short,
// 1e12 s the same TTFTs as 1e9 s).
inline constexpr double kMaxSimulatedSeconds = 1e9;

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
  // Runs body(0) ... body(actors - 1) as `actors` cooperative driving actors, started in that
  // order at time 0, and returns when the simulation has ended. The first exception thrown by
  // a body is rethrown here (the other actors run on). An actor should end with Drain() so
  // that it leaves no activity of its own running. REQUIRES: actors >= 1; called once.
  void Run(int actors, std::function<void(int)> body);

  Seconds Now() override;
  OpId Submit(TransferOp op, std::span<const OpId> after) override;
  OpId Submit(ComputeOp op, std::span<const OpId> after) override;
  Status Wait(OpId op) override;
  std::size_t WaitAny(std::span<const OpId> ops) override;
  bool Done(OpId op) override;
  bool Watch(OpId op) override;
  void TakeDone(std::vector<OpId>* out) override;
  OpTimes Retire(OpId op) override;

  // Simulated time passes until `t` while background work (and the other actors' requests)
  // proceed.
  void IdleUntil(Seconds t) override;
  // With several actors: until nothing is in flight, which may be a pause between other
  // actors' requests.
  void Drain() override;

  std::uint64_t activities_started() const { return activities_; }
  // What times compute ops (the roofline, or the measured table).
  const ComputeTimer& compute_timer() const;

 private:
  struct Impl;
  // Run with one body: runs it in SimGrid's maestro (see sim_executor.cc).
  void RunInMaestro(const std::function<void()>& body);
  std::unique_ptr<Impl> impl_;
  std::uint64_t activities_ = 0;
};

}  // namespace kvtier::sim
