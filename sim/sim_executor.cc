#include "sim/sim_executor.h"

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>

#include "core/check.h"
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
  sg4::Host* cpu = nullptr;
  sg4::Host* gpu = nullptr;
  sg4::Host* dispatch = nullptr;  // runs per-op overhead delays; never a bottleneck

  enum class State { kPending, kRunning, kDone };
  struct Op {
    State state = State::kPending;
    bool is_transfer = false;
    bool background = false;  // store/reorder SSD traffic: capped at ssd.background_share
    bool in_overhead = false;  // running the cpu.op_overhead delay that precedes the transfer
    TransferKind kind = TransferKind::kSsdRead;
    double amount = 0;  // payload bytes (transfers, latency included) or flops (execs)
    int pending = 0;
    std::vector<OpId> dependents;
    OpTimes times;
  };
  std::unordered_map<OpId, Op> ops;
  std::vector<sg4::ActivityPtr> running;
  std::vector<OpId> running_ids;
  OpId next = 1;
  std::uint64_t* activities = nullptr;

  void BuildPlatform();
  void Start(OpId id);
  void StartActivity(OpId id);
  void Complete(std::size_t running_index);
  void Finish(OpId id);
  void PumpOne();
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
  gpu = zone->create_host("gpu", 1.0);                // flops = seconds
  gpu->set_core_count(hw.gpu_concurrent_prefills);
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
  zone->add_route(cpu->get_netpoint(), gpu->get_netpoint(), nullptr, nullptr,
                  {{pcie, sg4::LinkInRoute::Direction::UP}}, true);
  zone->seal();
}

void SimExecutor::Impl::Start(OpId id) {
  Op& op = ops.at(id);
  op.state = State::kRunning;
  op.times.start_s = sg4::Engine::get_clock();
  if (op.amount <= 0) {  // nothing to do: done at once
    Finish(id);
    return;
  }
  if (op.is_transfer && hw.cpu_op_overhead > 0) {
    // A fixed issue cost per op (thread hand-off, submission), measured by kvtier calibrate:
    // a delay before the transfer, on a host with unlimited cores so delays never queue.
    op.in_overhead = true;
    sg4::ExecPtr delay = sg4::Exec::init();
    delay->set_flops_amount(hw.cpu_op_overhead);
    delay->set_host(dispatch);
    delay->start();
    ++*activities;
    running.push_back(delay);
    running_ids.push_back(id);
    return;
  }
  StartActivity(id);
}

void SimExecutor::Impl::StartActivity(OpId id) {
  Op& op = ops.at(id);
  sg4::ActivityPtr act;
  if (op.is_transfer && op.kind != TransferKind::kCpuGather) {
    sg4::Host* from = cpu;
    sg4::Host* to = gpu;
    switch (op.kind) {
      case TransferKind::kSsdRead: from = op.background ? ssd_bg : ssd, to = cpu; break;
      case TransferKind::kSsdWrite: from = cpu, to = op.background ? ssd_bg : ssd; break;
      case TransferKind::kH2D: from = cpu, to = gpu; break;
      case TransferKind::kD2H: from = gpu, to = cpu; break;
      case TransferKind::kCpuGather: break;
    }
    sg4::CommPtr comm = sg4::Comm::sendto_init(from, to);  // notes P2: keep the Ptr
    comm->set_payload_size(static_cast<std::uint64_t>(std::llround(op.amount)));
    comm->start();
    act = comm;
  } else {
    sg4::ExecPtr exec = sg4::Exec::init();
    exec->set_flops_amount(op.amount);
    exec->set_host(op.is_transfer ? cpu : gpu);
    exec->start();
    act = exec;
  }
  ++*activities;
  running.push_back(act);
  running_ids.push_back(id);
}

void SimExecutor::Impl::Finish(OpId id) {
  Op& op = ops.at(id);
  op.state = State::kDone;
  op.times.end_s = sg4::Engine::get_clock();
  std::vector<OpId> dependents = std::move(op.dependents);
  for (OpId d : dependents) {
    Op& dep = ops.at(d);
    if (--dep.pending == 0) Start(d);
  }
}

void SimExecutor::Impl::Complete(std::size_t i) {
  const OpId id = running_ids[i];
  running[i] = running.back();
  running.pop_back();
  running_ids[i] = running_ids.back();
  running_ids.pop_back();
  Op& op = ops.at(id);
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
  std::exception_ptr error;
  // Notes P6: an exception escaping an actor aborts the process; carry it out instead.
  sg4::Actor::create("pipeline", impl_->cpu, [&body, &error] {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
  });
  impl_->engine->run();
  if (error) std::rethrow_exception(error);
}

Seconds SimExecutor::Now() { return sg4::Engine::get_clock(); }

OpId SimExecutor::Submit(TransferOp op, std::span<const OpId> after) {
  const HardwareOptions& hw = impl_->hw;
  Impl::Op rec;
  rec.is_transfer = true;
  rec.kind = op.kind;
  rec.background = op.purpose == Purpose::kStore || op.purpose == Purpose::kReorder;
  const double ios = std::max<double>(1, op.ios);
  double bw = 1, latency = 0;
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
      bw = hw.pcie_h2d_bw;
      latency = ios * hw.pcie_latency;
      break;
    case TransferKind::kD2H:
      bw = hw.pcie_d2h_bw;
      latency = ios * hw.pcie_latency;
      break;
    case TransferKind::kCpuGather:
      bw = hw.cpu_gather_bw;
      break;
  }
  rec.amount = op.bytes == 0 ? 0 : double(op.bytes) + latency * bw;
  const OpId id = impl_->next++;
  rec.times.submit_s = Now();
  impl_->ops.emplace(id, std::move(rec));
  Impl::Op& r = impl_->ops.at(id);
  for (OpId dep : after) {
    auto it = impl_->ops.find(dep);
    KVTIER_CHECK(it != impl_->ops.end(), "SimExecutor: dependency unknown or retired");
    if (it->second.state != Impl::State::kDone) {
      it->second.dependents.push_back(id);
      ++r.pending;
    }
  }
  if (r.pending == 0) impl_->Start(id);
  return id;
}

OpId SimExecutor::Submit(ComputeOp op, std::span<const OpId> after) {
  Impl::Op rec;
  rec.is_transfer = false;
  rec.amount = impl_->timer->OpSeconds(op);
  const OpId id = impl_->next++;
  rec.times.submit_s = Now();
  impl_->ops.emplace(id, std::move(rec));
  Impl::Op& r = impl_->ops.at(id);
  for (OpId dep : after) {
    auto it = impl_->ops.find(dep);
    KVTIER_CHECK(it != impl_->ops.end(), "SimExecutor: dependency unknown or retired");
    if (it->second.state != Impl::State::kDone) {
      it->second.dependents.push_back(id);
      ++r.pending;
    }
  }
  if (r.pending == 0) impl_->Start(id);
  return id;
}

Status SimExecutor::Wait(OpId op) {
  while (impl_->ops.at(op).state != Impl::State::kDone) impl_->PumpOne();
  return Status::OK();
}

std::size_t SimExecutor::WaitAny(std::span<const OpId> ops) {
  KVTIER_CHECK(!ops.empty(), "SimExecutor: WaitAny on nothing");
  while (true) {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (impl_->ops.at(ops[i]).state == Impl::State::kDone) return i;
    }
    impl_->PumpOne();
  }
}

bool SimExecutor::Done(OpId op) {
  // Observe every activity that has finished by now, so completions at the current instant
  // release their dependents before we answer.
  for (std::size_t i = 0; i < impl_->running.size();) {
    if (impl_->running[i]->test()) {
      impl_->Complete(i);
    } else {
      ++i;
    }
  }
  return impl_->ops.at(op).state == Impl::State::kDone;
}

OpTimes SimExecutor::Retire(OpId op) {
  auto it = impl_->ops.find(op);
  KVTIER_CHECK(it != impl_->ops.end() && it->second.state == Impl::State::kDone,
               "SimExecutor: Retire before done");
  OpTimes t = it->second.times;
  impl_->ops.erase(it);
  return t;
}

void SimExecutor::IdleUntil(Seconds t) {
  while (Now() < t) {
    if (impl_->running.empty()) {
      sg4::this_actor::sleep_until(t);
      return;
    }
    ssize_t i = sg4::Activity::wait_any_for(impl_->running, t - Now());
    if (i < 0) return;  // timed out at t
    impl_->Complete(static_cast<std::size_t>(i));
  }
}

void SimExecutor::Drain() {
  while (!impl_->running.empty()) impl_->PumpOne();
}

}  // namespace kvtier::sim
