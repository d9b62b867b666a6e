#include "sim/sim_executor.h"

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <set>
#include <span>
#include <string>

#include "core/check.h"
#include "core/errors.h"
#include "core/op_graph.h"
#include "models/layer_table.h"

namespace sg4 = simgrid::s4u;

namespace kvtier::sim {

struct SimExecutor::Impl {
  ModelSpec model;
  HardwareOptions hw;
  std::optional<ComputeTimer> timer;  // the cost model, with gpu.layer_table when set
  std::unique_ptr<sg4::Engine> engine;
  sg4::Host* ssd = nullptr;
  sg4::Host* ssd_bg = nullptr;  // endpoint of rate-limited background SSD traffic
  // cpu.shared_copy_bw > 0: CPU gathers are comms cpu -> gather_sink over a link of
  // cpu.gather_bw, so that they and the H2D/D2H copies share one host-memory link.
  sg4::Host* gather_sink = nullptr;
  sg4::Host* cpu = nullptr;
  sg4::Host* gpu = nullptr;
  sg4::Host* dispatch = nullptr;  // runs per-op overhead delays; never a bottleneck

  // What an op is; the graph (below) keeps its dependencies and how it ended.
  struct Op {
    bool is_transfer = false;
    bool background = false;  // store/reorder SSD traffic: capped at ssd.background_share
    bool in_overhead = false;  // running the delay that precedes it (release, op_overhead)
    bool device_gather = false;  // an H2D kDeviceGather: slows the GPU while it runs
    bool queued = false;  // an SSD write counted in ssd.write_lanes
    bool watched = false;  // Watch: reported by TakeDone once done
    TransferKind kind = TransferKind::kSsdRead;
    double amount = 0;  // payload bytes (transfers, latency included) or flops (execs)
    Seconds submit_s = 0, start_s = 0, end_s = 0;
    // When the driving thread submitted it on its own clock (DriverClock): it starts no
    // earlier. Equals the engine time at Submit when cpu.driver_op_cost is 0.
    Seconds release_s = 0;
    sg4::ActivityPtr act;  // maestro mode: the running activity (its data is this op's id)
  };
  // The operation graph (core/op_graph.h, shared with HwExecutor): ids, pending dependencies,
  // dependents, completion. Ops live in a deque indexed by id (retired ones at the front are
  // popped), not a hash map: a node allocation and hash lookups per op were visible in
  // sim_bench's spec profile. Nothing fails in the simulator, so nothing is ever aborted.
  OpGraph<Op> graph;
  Op& At(OpId id) { return graph.At(id).payload; }
  bool IsDone(OpId id) const { return graph.Done(id); }
  std::vector<sg4::ActivityPtr> running;  // actor mode: what the pump waits on
  std::vector<OpId> running_ids;
  std::uint64_t* activities = nullptr;
  // Device gathers whose transfer is running. While there is one, the `gpu` host runs at its
  // second pstate, 1 - gpu.gather_sm_share: compute overlapping a gather kernel shares the SMs
  // with it (transfer.strategy = device_gather), for exactly the overlap.
  int gathers_running = 0;
  // ssd.write_lanes > 0: at most that many SSD writes run at once; the others wait here,
  // oldest first (Start, Finish). 0: no limit, as SimGrid shares them all.
  int writes_running = 0;
  std::deque<OpId> writes_waiting;
  // Watched ops done and not yet handed out by TakeDone (Finish appends).
  std::vector<OpId> done_watched;
  void GatherStarted() {
    if (gathers_running++ == 0) gpu->set_pstate(1);
  }
  void GatherEnded() {
    if (--gathers_running == 0) gpu->set_pstate(0);
  }

  // Maestro mode (Run with one driving body, see sim_executor.h). The body runs in maestro;
  // activities started from maestro complete through Activity::on_completion at their finish
  // time, inside Engine::run, where OnCompletion starts dependents at once. A wait runs the
  // engine until the callback finds it satisfied and makes `stop` (the engine's vetoed set)
  // non-empty, which ends Engine::run after the current step.
  bool maestro = false;
  // The executor in maestro mode, for the process-wide completion callback (one SimExecutor
  // per process; signals cannot be disconnected in 3.32, so the callback is connected once).
  static inline Impl* current = nullptr;
  enum class WaitKind { kNone, kOp, kAny } wait_kind = WaitKind::kNone;
  OpId awaited = kNoOp;
  std::span<const OpId> awaited_any;
  std::set<sg4::Activity*> stop;
  std::size_t in_flight = 0;  // maestro mode: activities started and not completed
  // Completed activities, dropped outside the engine: the last reference must not go inside
  // the completion callback (notes P13).
  std::vector<sg4::ActivityPtr> graveyard;
  void OnCompletion(const sg4::Activity& activity);
  bool MaestroWaitSatisfied() const;
  // Runs the engine until the current wait is satisfied. REQUIRES: maestro, wait_kind set.
  void RunEngineForWait();
  // One Engine::run (until < 0) or run_until(until) in maestro mode, then forgets the stop
  // mark and the activities completed meanwhile.
  void RunEngine(double until = -1);
  // Runs the engine until no activity is in flight.
  void RunEngineUntilIdle() {
    while (in_flight > 0) RunEngine();
  }

  // Several driving actors (Run with actors > 1). Exactly one actor holds the *baton* at a
  // time: it runs pipeline code, or it pumps (waits in SimGrid for the next completion, on
  // behalf of every waiting actor). The others are parked on their semaphore. So no actor
  // submits while another is inside wait_any (whose activity set would be stale), simulated
  // time advances only in the pump, and after every completion each actor whose wait is now
  // satisfied runs before time moves on: completions release waiters at their exact times,
  // as with one actor. Among actors satisfied at the same instant, the one registered
  // earliest runs first (FIFO).
  struct Waiter {
    enum class Kind { kStart, kOp, kAny, kTime, kDrain } kind = Kind::kStart;
    OpId op = kNoOp;
    std::span<const OpId> any;
    std::size_t any_index = 0;  // kAny: the first done op, once satisfied
    Seconds deadline = 0;       // kTime
    bool reached = false;       // kTime: the pump timed out at the deadline
    sg4::SemaphorePtr wake;     // released when this actor is handed the baton
    Seconds driver_s = 0;       // this actor's driver clock (DriverClock)
  };
  std::vector<Waiter> actor_waiters;  // one per actor; empty with one actor
  std::vector<Waiter*> waiting;       // registered waits, oldest first
  Waiter* holder = nullptr;           // the actor holding the baton

  bool multi() const { return !actor_waiters.empty(); }

  // The driving thread's clock (cpu.driver_op_cost, cpu.driver_wake): when the body that
  // calls the executor is done with the work charged to it so far. It runs ahead of the
  // engine -- a Submit charges its cost here and releases the op at the new time without
  // running the engine -- and the engine catches up (CatchUp) whenever the body observes
  // anything (Now, Done, TakeDone, the waits, IdleUntil, Drain), so what the body sees is
  // what hw's driver sees after spending that time. One clock per driving actor.
  Seconds single_driver_s = 0;
  Seconds& DriverClock() { return holder != nullptr ? holder->driver_s : single_driver_s; }
  bool driver_timed() const { return hw.cpu_driver_op_cost > 0 || hw.cpu_driver_wake > 0; }
  // Runs the engine (others proceed) until the driver clock. Maestro or the baton holder.
  void CatchUp();
  // A wait that blocked returned: the driver runs cpu.driver_wake after the engine's now.
  void Woke() {
    if (hw.cpu_driver_wake > 0) DriverClock() = sg4::Engine::get_clock() + hw.cpu_driver_wake;
  }
  bool Satisfied(Waiter& w);
  Waiter* FirstSatisfied();
  // Blocks the baton holder until its wait `me` is satisfied (see above).
  void Block(Waiter& me);
  // One step of the pump: the next completion, or the earliest deadline.
  void PumpForWaiters();
  // The holder's actor ends: the baton goes to the first satisfied waiter, else to the oldest
  // waiter (to pump), else nobody.
  void Leave();

  void BuildPlatform();
  // Its dependencies are done: starts it, or queues it behind ssd.write_lanes.
  void Start(OpId id);
  // Starts it now (its issue overhead, then the activity).
  void Begin(OpId id);
  void StartActivity(OpId id);
  void Launch(OpId id, sg4::ActivityPtr act);  // starts it for `id` and tracks it
  // Numbers a submitted op, records its pending dependencies and starts it if it has none.
  OpId Add(Op rec, std::span<const OpId> after);
  void Complete(std::size_t running_index);
  void Finish(OpId id);
  void PumpOne();
  // Actor mode: completes every activity that has finished by now (Done, TakeDone).
  void ObserveFinished();
};

void SimExecutor::Impl::BuildPlatform() {
  engine = std::make_unique<sg4::Engine>("kvtier");
  xbt_log_control_set("root.thres:critical");
  // Notes P12/P5: exact fluid sharing; must be set before the first netzone exists.
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic", false);
  sg4::Engine::set_config("network/TCP-gamma:0");
  auto* zone = sg4::create_full_zone("node");
  ssd = zone->create_host("ssd", 1.0);
  cpu = zone->create_host("cpu", hw.cpu_gather_bw);  // flops = bytes gathered
  // flops = seconds. One core whatever gpu.concurrent_prefills says: concurrent prefills'
  // compute steps share the GPU's throughput fairly (two at once each take twice as long);
  // what concurrency buys is one request's I/O overlapping another's compute.
  // pstate 1: the speed left to compute while a device gather runs (GatherStarted).
  gpu = zone->create_host("gpu", std::vector<double>{1.0, 1.0 - hw.gpu_gather_sm_share});
  dispatch = zone->create_host("dispatch", 1.0);  // flops = seconds
  dispatch->set_core_count(1 << 20);
  auto* ssd_read = zone->create_link("ssd_read", hw.ssd_read_bw);
  auto* ssd_write = zone->create_link("ssd_write", hw.ssd_write_bw);
  auto* ssd_rw = zone->create_link("ssd_rw", std::max(hw.ssd_read_bw, hw.ssd_write_bw));
  sg4::SplitDuplexLink* pcie = zone->create_split_duplex_link("pcie", hw.pcie_h2d_bw);
  pcie->get_link_down()->set_bandwidth(hw.pcie_d2h_bw);
  zone->add_route(ssd->get_netpoint(), cpu->get_netpoint(), nullptr, nullptr,
                  {sg4::LinkInRoute(ssd_read), sg4::LinkInRoute(ssd_rw)}, false);
  zone->add_route(cpu->get_netpoint(), ssd->get_netpoint(), nullptr, nullptr,
                  {sg4::LinkInRoute(ssd_write), sg4::LinkInRoute(ssd_rw)}, false);
  // Background SSD traffic (new prefix KV, reorder repacks) runs through an extra link capped at
  // ssd.background_share of the device: demand and prefetch keep the rest, as io priority
  // classes or a background rate limit give them on hardware.
  ssd_bg = zone->create_host("ssd_bg", 1.0);
  auto* bg_read = zone->create_link("ssd_bg_read", hw.ssd_read_bw * hw.ssd_background_share);
  auto* bg_write = zone->create_link("ssd_bg_write", hw.ssd_write_bw * hw.ssd_background_share);
  zone->add_route(ssd_bg->get_netpoint(), cpu->get_netpoint(), nullptr, nullptr,
                  {sg4::LinkInRoute(bg_read), sg4::LinkInRoute(ssd_read), sg4::LinkInRoute(ssd_rw)},
                  false);
  zone->add_route(cpu->get_netpoint(), ssd_bg->get_netpoint(), nullptr, nullptr,
                  {sg4::LinkInRoute(bg_write), sg4::LinkInRoute(ssd_write),
                   sg4::LinkInRoute(ssd_rw)},
                  false);
  std::vector<sg4::LinkInRoute> to_gpu{{pcie, sg4::LinkInRoute::Direction::UP}};
  if (hw.cpu_shared_copy_bw > 0) {
    // Copies through host memory share its bandwidth: CPU gathers and both PCIe directions
    // cross one `host_mem` link (max-min fair, like every other resource here). On the host
    // backend the PCIe copies are memcpys too, and one copy thread nearly saturates the
    // memory (this VM: two threads together copy 1.05-1.5x what one does).
    auto* host_mem = zone->create_link("host_mem", hw.cpu_shared_copy_bw);
    auto* gather = zone->create_link("cpu_gather", hw.cpu_gather_bw);
    gather_sink = zone->create_host("gather_sink", 1.0);
    zone->add_route(cpu->get_netpoint(), gather_sink->get_netpoint(), nullptr, nullptr,
                    {sg4::LinkInRoute(gather), sg4::LinkInRoute(host_mem)}, false);
    to_gpu.emplace_back(host_mem);
  }
  zone->add_route(cpu->get_netpoint(), gpu->get_netpoint(), nullptr, nullptr, to_gpu, true);
  zone->seal();
}

void SimExecutor::Impl::Start(OpId id) {
  Op& op = At(id);
  if (op.amount <= 0 && op.release_s <= sg4::Engine::get_clock()) {  // nothing to do
    op.start_s = sg4::Engine::get_clock();
    Finish(id);
    return;
  }
  if (op.queued) {
    if (writes_running >= hw.ssd_write_lanes) {
      writes_waiting.push_back(id);  // starts when an earlier one finishes (Finish)
      return;
    }
    ++writes_running;
  }
  Begin(id);
}

void SimExecutor::Impl::Begin(OpId id) {
  Op& op = At(id);
  const Seconds now = sg4::Engine::get_clock();
  op.start_s = now;
  // Not before the driving thread submitted it (its release), and for a transfer a fixed issue
  // cost (thread hand-off, submission) measured by kvtier calibrate: a delay before the op, on
  // a host with unlimited cores so delays never queue.
  const Seconds wait = op.release_s > now ? op.release_s - now : 0;
  const Seconds delay_s = wait + (op.is_transfer ? hw.cpu_op_overhead : 0);
  if (delay_s > 0) {
    op.in_overhead = true;
    sg4::ExecPtr delay = sg4::Exec::init();
    delay->set_flops_amount(delay_s);
    delay->set_host(dispatch);
    Launch(id, delay);
    return;
  }
  StartActivity(id);
}

void SimExecutor::Impl::StartActivity(OpId id) {
  Op& op = At(id);
  // A transfer starts when its resource takes it, after the cpu.op_overhead hand-off, as hw
  // stamps it when its lane starts the copy (so stage busy times mean the same in both).
  op.start_s = sg4::Engine::get_clock();
  if (op.amount <= 0) {  // released after its delay, nothing to do
    Finish(id);
    return;
  }
  sg4::ActivityPtr act;
  if (op.is_transfer && (op.kind != TransferKind::kCpuGather || gather_sink != nullptr)) {
    sg4::Host* from = cpu;
    sg4::Host* to = gpu;
    switch (op.kind) {
      case TransferKind::kSsdRead: from = op.background ? ssd_bg : ssd, to = cpu; break;
      case TransferKind::kSsdWrite: from = cpu, to = op.background ? ssd_bg : ssd; break;
      case TransferKind::kH2D: from = cpu, to = gpu; break;
      case TransferKind::kD2H: from = gpu, to = cpu; break;
      case TransferKind::kCpuGather: to = gather_sink; break;  // shared host memory
    }
    if (op.device_gather) GatherStarted();
    sg4::CommPtr comm = sg4::Comm::sendto_init(from, to);  // notes P2: keep the Ptr
    comm->set_payload_size(static_cast<std::uint64_t>(std::llround(op.amount)));
    act = comm;
  } else {
    sg4::ExecPtr exec = sg4::Exec::init();
    exec->set_flops_amount(op.amount);
    exec->set_host(op.is_transfer ? cpu : gpu);
    act = exec;
  }
  Launch(id, std::move(act));
}

OpId SimExecutor::Impl::Add(Op rec, std::span<const OpId> after) {
  rec.submit_s = sg4::Engine::get_clock();
  if (hw.cpu_driver_op_cost > 0) {
    // The driving thread planned and submitted it: cpu.driver_op_cost on its clock, which
    // runs on from wherever the body's earlier work left it.
    Seconds& driver = DriverClock();
    driver = std::max(driver, rec.submit_s) + hw.cpu_driver_op_cost;
    rec.submit_s = driver;
  }
  rec.release_s = rec.submit_s;
  const auto added = graph.Add(std::move(rec), after);
  KVTIER_DCHECK(added.next != OpGraph<Op>::Next::kAbort, "SimExecutor: an op failed");
  if (added.next == OpGraph<Op>::Next::kStart) Start(added.id);
  return added.id;
}

void SimExecutor::Impl::Launch(OpId id, sg4::ActivityPtr act) {
  ++*activities;
  if (maestro) {
    act->set_data(reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)));
    act->start();
    ++in_flight;
    At(id).act = std::move(act);
    return;
  }
  act->start();
  running.push_back(std::move(act));
  running_ids.push_back(id);
}

void SimExecutor::Impl::OnCompletion(const sg4::Activity& activity) {
  const auto id = static_cast<OpId>(reinterpret_cast<std::uintptr_t>(activity.get_data<void>()));
  Op& op = At(id);
  KVTIER_CHECK(op.act.get() == &activity, "SimExecutor: a completion for another activity");
  graveyard.push_back(std::move(op.act));
  --in_flight;
  if (op.in_overhead) {  // the issue delay is over: now the transfer itself
    op.in_overhead = false;
    StartActivity(id);
  } else {
    Finish(id);
  }
  if (wait_kind != WaitKind::kNone && MaestroWaitSatisfied()) {
    stop.insert(const_cast<sg4::Activity*>(&activity));  // only its non-emptiness is read
  }
}

bool SimExecutor::Impl::MaestroWaitSatisfied() const {
  switch (wait_kind) {
    case WaitKind::kNone: return false;
    case WaitKind::kOp: return IsDone(awaited);
    case WaitKind::kAny:
      for (OpId o : awaited_any) {
        if (IsDone(o)) return true;
      }
      return false;
  }
  return false;
}

void SimExecutor::Impl::RunEngineForWait() {
  while (!MaestroWaitSatisfied()) {
    KVTIER_CHECK(in_flight > 0, "SimExecutor: waiting with nothing in flight");
    RunEngine();
  }
  wait_kind = WaitKind::kNone;
}

void SimExecutor::Impl::CatchUp() {
  if (!driver_timed()) return;
  const Seconds driver = DriverClock();
  if (sg4::Engine::get_clock() >= driver) return;
  if (multi()) {
    Waiter& me = *holder;
    me.kind = Waiter::Kind::kTime;
    me.deadline = driver;
    me.reached = false;
    Block(me);
    return;
  }
  // run_until may stop up to 1e-5 s short (see IdleUntil); it always makes progress.
  while (sg4::Engine::get_clock() < driver) RunEngine(driver);
}

void SimExecutor::Impl::RunEngine(double until) {
  if (until < 0) {
    engine->run();
  } else {
    engine->run_until(until);
  }
  stop.clear();
  graveyard.clear();
}

void SimExecutor::Impl::Finish(OpId id) {
  Op& op = At(id);
  op.end_s = sg4::Engine::get_clock();
  if (op.device_gather && op.amount > 0) GatherEnded();
  if (op.queued && op.amount > 0) {
    // The oldest waiting write takes its place before the dependents start.
    --writes_running;
    if (!writes_waiting.empty()) {
      const OpId next = writes_waiting.front();
      writes_waiting.pop_front();
      ++writes_running;
      Begin(next);
    }
  }
  if (op.watched) done_watched.push_back(id);
  graph.Complete(id, [this](OpId d) { Start(d); });
}

void SimExecutor::Impl::Complete(std::size_t i) {
  const OpId id = running_ids[i];
  running[i] = running.back();
  running.pop_back();
  running_ids[i] = running_ids.back();
  running_ids.pop_back();
  Op& op = At(id);
  if (op.in_overhead) {  // the issue delay is over: now the transfer itself
    op.in_overhead = false;
    StartActivity(id);
    return;
  }
  Finish(id);
}

void SimExecutor::Impl::PumpOne() {
  KVTIER_CHECK(!running.empty(), "SimExecutor: waiting with nothing in flight");
  ssize_t i = sg4::Activity::wait_any(running);
  KVTIER_CHECK(i >= 0, "SimExecutor: wait_any failed");
  Complete(static_cast<std::size_t>(i));
}

bool SimExecutor::Impl::Satisfied(Waiter& w) {
  switch (w.kind) {
    case Waiter::Kind::kStart: return true;
    case Waiter::Kind::kOp: return IsDone(w.op);
    case Waiter::Kind::kAny:
      for (std::size_t i = 0; i < w.any.size(); ++i) {
        if (IsDone(w.any[i])) {
          w.any_index = i;
          return true;
        }
      }
      return false;
    case Waiter::Kind::kTime: return w.reached || sg4::Engine::get_clock() >= w.deadline;
    case Waiter::Kind::kDrain: return running.empty();
  }
  return false;
}

SimExecutor::Impl::Waiter* SimExecutor::Impl::FirstSatisfied() {
  for (Waiter* w : waiting) {
    if (Satisfied(*w)) return w;
  }
  return nullptr;
}

void SimExecutor::Impl::PumpForWaiters() {
  double deadline = -1;  // the earliest pending deadline, if any
  for (Waiter* w : waiting) {
    if (w->kind == Waiter::Kind::kTime && !w->reached && (deadline < 0 || w->deadline < deadline)) {
      deadline = w->deadline;
    }
  }
  auto reach = [&] {
    for (Waiter* w : waiting) {
      if (w->kind == Waiter::Kind::kTime && w->deadline <= deadline) w->reached = true;
    }
  };
  if (running.empty()) {
    KVTIER_CHECK(deadline >= 0, "SimExecutor: every actor waits with nothing in flight");
    sg4::this_actor::sleep_until(deadline);
    reach();
    return;
  }
  if (deadline < 0) {
    PumpOne();
    return;
  }
  const ssize_t i = sg4::Activity::wait_any_for(running, deadline - sg4::Engine::get_clock());
  if (i < 0) {
    reach();  // timed out at the deadline
    return;
  }
  Complete(static_cast<std::size_t>(i));
}

void SimExecutor::Impl::Block(Waiter& me) {
  KVTIER_CHECK(holder == &me, "SimExecutor: a wait from an actor that does not hold the baton");
  waiting.push_back(&me);
  for (;;) {
    Waiter* next = FirstSatisfied();
    if (next == &me) break;
    if (next != nullptr) {  // an earlier waiter runs first; the baton comes back later
      holder = next;
      next->wake->release();
      me.wake->acquire();
      KVTIER_CHECK(holder == &me, "SimExecutor: woken without the baton");
      continue;
    }
    PumpForWaiters();
  }
  waiting.erase(std::find(waiting.begin(), waiting.end(), &me));
}

void SimExecutor::Impl::Leave() {
  Waiter* next = FirstSatisfied();
  if (next == nullptr && !waiting.empty()) next = waiting.front();  // it will pump
  holder = next;
  if (next != nullptr) next->wake->release();
}

SimExecutor::SimExecutor(const ModelSpec& model, const HardwareOptions& hardware)
    : SimExecutor(model, hardware, ComputeTimer::FromOptions(model, hardware)) {}

SimExecutor::SimExecutor(const ModelSpec& model, const HardwareOptions& hardware,
                         ComputeTimer timer)
    : impl_(std::make_unique<Impl>()) {
  impl_->model = model;
  impl_->hw = hardware;
  impl_->timer.emplace(std::move(timer));
  impl_->activities = &activities_;
  impl_->BuildPlatform();
}

SimExecutor::~SimExecutor() = default;

const ComputeTimer& SimExecutor::compute_timer() const { return *impl_->timer; }

void SimExecutor::Run(std::function<void()> body) {
  Run(1, [&body](int) { body(); });
}

void SimExecutor::Run(int actors, std::function<void(int)> body) {
  KVTIER_CHECK(actors >= 1, "SimExecutor::Run needs at least one actor");
  std::exception_ptr error;
  if (actors == 1) {
    RunInMaestro([&body] { body(0); });
    return;
  }
  // Actor 0 starts with the baton; the others wait for it in a start wait, in actor order.
  Impl& im = *impl_;
  im.actor_waiters.assign(std::size_t(actors), Impl::Waiter{});
  for (Impl::Waiter& w : im.actor_waiters) w.wake = sg4::Semaphore::create(0);
  im.holder = &im.actor_waiters[0];
  for (int a = 1; a < actors; ++a) im.waiting.push_back(&im.actor_waiters[std::size_t(a)]);
  for (int a = 0; a < actors; ++a) {
    sg4::Actor::create(a == 0 ? "pipeline" : "pipeline-" + std::to_string(a), im.cpu,
                       [&im, &body, &error, a] {
      Impl::Waiter& me = im.actor_waiters[std::size_t(a)];
      if (a > 0) {
        me.wake->acquire();
        KVTIER_CHECK(im.holder == &me, "SimExecutor: an actor started without the baton");
        im.waiting.erase(std::find(im.waiting.begin(), im.waiting.end(), &me));
      }
      try {
        body(a);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
      im.Leave();
    });
  }
  im.engine->run();
  KVTIER_CHECK(error || im.waiting.empty(), "SimExecutor: the simulation ended with actors waiting");
  im.actor_waiters.clear();
  if (error) std::rethrow_exception(error);
}

// One driving body runs in maestro, not in an actor: in 3.32 every s4u call of an actor is a
// context switch to maestro and back, and an actor must wake for each completion to start its
// dependents, which cost ~2.2 us per activity (notes section 6, "actor" rows) and a quarter of
// sim_bench's spec run; from maestro, activities start without a switch and complete through
// the on_completion callback (~0.7 us, the "callback" rows). Simulated times are the same: a
// dependent starts at its last dependency's completion time either way.
void SimExecutor::RunInMaestro(const std::function<void()>& body) {
  Impl& im = *impl_;
  static const bool connected = [] {
    sg4::Activity::on_completion_cb([](const sg4::Activity& a) {
      if (Impl::current != nullptr) Impl::current->OnCompletion(a);
    });
    return true;
  }();
  (void)connected;
  KVTIER_CHECK(Impl::current == nullptr, "SimExecutor: one simulation per process");
  Impl::current = &im;
  im.maestro = true;
  sg4::Activity::set_vetoed_activities(&im.stop);
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  // The rest of the background work, as the actor version's engine->run() did after its body
  // (also after an error, so no activity is destroyed unfinished; a second error is dropped).
  im.wait_kind = Impl::WaitKind::kNone;
  try {
    im.RunEngineUntilIdle();
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  sg4::Activity::set_vetoed_activities(nullptr);
  Impl::current = nullptr;
  if (error) std::rethrow_exception(error);
}

Seconds SimExecutor::Now() {
  impl_->CatchUp();
  return sg4::Engine::get_clock();
}

OpId SimExecutor::Submit(TransferOp op, std::span<const OpId> after) {
  const HardwareOptions& hw = impl_->hw;
  Impl::Op rec;
  rec.is_transfer = true;
  rec.kind = op.kind;
  rec.background = IsBackground(op.purpose);
  rec.queued = op.kind == TransferKind::kSsdWrite && hw.ssd_write_lanes > 0;
  const double ios = std::max<double>(1, op.ios);
  double bw = 1, latency = 0, payload = double(op.bytes);
  switch (op.kind) {
    case TransferKind::kSsdRead:
      bw = hw.ssd_read_bw;
      latency = std::ceil(ios / hw.ssd_queue_depth) * hw.ssd_latency;
      break;
    case TransferKind::kSsdWrite:
      bw = hw.ssd_write_bw;
      latency = std::ceil(ios / hw.ssd_queue_depth) * hw.ssd_latency;
      break;
    case TransferKind::kH2D:
    case TransferKind::kD2H:
      bw = op.kind == TransferKind::kH2D ? hw.pcie_h2d_bw : hw.pcie_d2h_bw;
      switch (op.method) {
        case CopyMethod::kDma:  // one pcie.latency per DMA call
          latency = ios * hw.pcie_latency;
          break;
        case CopyMethod::kBatched:  // per call, plus per descriptor inside the calls
          latency = ios * hw.pcie_batch_latency + double(op.descriptors) * hw.pcie_descriptor_cost;
          break;
        case CopyMethod::kDeviceGather:
          // A kernel reading mapped host memory: bytes / min(link, kernel read rate) plus one
          // launch per kernel, on the link. The payload is scaled so that, alone, the comm
          // takes exactly that; the `gpu` host slows while it runs (GatherStarted).
          rec.device_gather = true;
          latency = ios * hw.gpu_kernel_overhead;
          payload *= bw / std::min(bw, hw.gpu_gather_bw);
          break;
      }
      break;
    case TransferKind::kCpuGather:
      // bytes / cpu.gather_bw + one memcpy per run: flops on the `cpu` host, or with
      // cpu.shared_copy_bw a comm over the cpu_gather link (and the shared host_mem link).
      bw = hw.cpu_gather_bw;
      latency = double(op.ios) * hw.cpu_gather_run_cost;
      break;
  }
  rec.amount = op.bytes == 0 ? 0 : payload + latency * bw;
  return impl_->Add(std::move(rec), after);
}

OpId SimExecutor::Submit(ComputeOp op, std::span<const OpId> after) {
  Impl::Op rec;
  rec.is_transfer = false;
  rec.amount = impl_->timer->OpSeconds(op);
  return impl_->Add(std::move(rec), after);
}

Status SimExecutor::Wait(OpId op) {
  impl_->CatchUp();
  if (impl_->multi()) {
    // A completed op: no wait, no hand-over (the contract; the Pipeline asks for the status
    // of the op WaitAny found done).
    if (impl_->IsDone(op)) return Status::OK();
    Impl::Waiter& me = *impl_->holder;
    me.kind = Impl::Waiter::Kind::kOp;
    me.op = op;
    impl_->Block(me);
    impl_->Woke();
    return Status::OK();
  }
  KVTIER_CHECK(impl_->maestro, "SimExecutor: Wait outside Run");
  impl_->graveyard.clear();
  if (impl_->IsDone(op)) return Status::OK();
  impl_->wait_kind = Impl::WaitKind::kOp;
  impl_->awaited = op;
  impl_->RunEngineForWait();
  impl_->Woke();
  return Status::OK();
}

std::size_t SimExecutor::WaitAny(std::span<const OpId> ops) {
  KVTIER_CHECK(!ops.empty(), "SimExecutor: WaitAny on nothing");
  impl_->CatchUp();
  if (impl_->multi()) {
    Impl::Waiter& me = *impl_->holder;
    me.kind = Impl::Waiter::Kind::kAny;
    me.any = ops;
    const bool blocked = !impl_->Satisfied(me);
    impl_->Block(me);
    if (blocked) impl_->Woke();
    return me.any_index;
  }
  KVTIER_CHECK(impl_->maestro, "SimExecutor: WaitAny outside Run");
  impl_->graveyard.clear();
  impl_->wait_kind = Impl::WaitKind::kAny;
  impl_->awaited_any = ops;
  const bool blocked = !impl_->MaestroWaitSatisfied();
  impl_->RunEngineForWait();
  if (blocked) impl_->Woke();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (impl_->IsDone(ops[i])) return i;
  }
  KVTIER_CHECK(false, "SimExecutor: WaitAny returned with nothing done");
  return 0;
}

void SimExecutor::Impl::ObserveFinished() {
  // Maestro mode: every completion up to now went through the callback.
  if (maestro) return;
  // Observe every activity that has finished by now, so completions at the current instant
  // release their dependents before we answer.
  for (std::size_t i = 0; i < running.size();) {
    if (running[i]->test()) {
      Complete(i);
    } else {
      ++i;
    }
  }
}

bool SimExecutor::Done(OpId op) {
  impl_->CatchUp();
  impl_->ObserveFinished();
  return impl_->IsDone(op);
}

bool SimExecutor::Watch(OpId op) {
  if (impl_->IsDone(op)) {
    impl_->done_watched.push_back(op);
  } else {
    impl_->At(op).watched = true;
  }
  return true;
}

void SimExecutor::TakeDone(std::vector<OpId>* out) {
  impl_->CatchUp();
  impl_->ObserveFinished();  // as Done does: what it would say true for now
  out->insert(out->end(), impl_->done_watched.begin(), impl_->done_watched.end());
  impl_->done_watched.clear();
}

OpTimes SimExecutor::Retire(OpId op) {
  const Impl::Op& o = impl_->At(op);
  OpTimes t;
  t.submit_s = o.submit_s;
  t.start_s = o.start_s;
  t.end_s = o.end_s;
  // Past ~1e10 s SimGrid's clock no longer resolves an operation of microseconds (its
  // tolerance is 1e-5 s): TTFT stopped growing with ssd.latency past 1e8 s per read, and
  // gpu.efficiency = 1e-300 printed TTFTs of 1e30 ms, exit 0. Every real run is far below.
  if (!(t.end_s <= kMaxSimulatedSeconds)) {
    char when[64];
    std::snprintf(when, sizeof when, "%.3g", t.end_s);
    throw ConfigError(std::string("the simulated clock reached ") + when +
                      " s, past the 1e9 s (31.7 years) the simulator resolves: the hardware "
                      "profile's device times are unphysical (a duration, bandwidth or "
                      "gpu.flops x gpu.efficiency far from any device)");
  }
  impl_->graph.Retire(op);  // checks that it is done; every status is OK
  return t;
}

void SimExecutor::IdleUntil(Seconds t) {
  impl_->CatchUp();
  if (impl_->multi()) {
    if (Now() >= t) return;
    Impl::Waiter& me = *impl_->holder;
    me.kind = Impl::Waiter::Kind::kTime;
    me.deadline = t;
    me.reached = false;
    impl_->Block(me);
    return;
  }
  KVTIER_CHECK(impl_->maestro, "SimExecutor: IdleUntil outside Run");
  // run_until may stop up to 1e-5 s short of t (it compares with a tolerance); it always makes
  // progress, so repeat until t.
  while (Now() < t) impl_->RunEngine(t);
}

void SimExecutor::Drain() {
  impl_->CatchUp();
  if (impl_->multi()) {
    Impl::Waiter& me = *impl_->holder;
    me.kind = Impl::Waiter::Kind::kDrain;
    impl_->Block(me);
    return;
  }
  KVTIER_CHECK(impl_->maestro, "SimExecutor: Drain outside Run");
  impl_->RunEngineUntilIdle();
}

}  // namespace kvtier::sim
