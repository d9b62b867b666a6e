#include "tests/testutil/fake_executor.h"

#include <algorithm>

#include "core/check.h"

namespace kvtier::testing {

OpId FakeExecutor::Schedule(FakeResource resource, Seconds duration, std::span<const OpId> after) {
  Seconds start = now_;
  for (OpId dep : after) {
    auto it = live_.find(dep);
    KVTIER_CHECK(it != live_.end(), "FakeExecutor: dependency unknown or already retired");
    start = std::max(start, it->second.end_s);
  }
  int key = static_cast<int>(resource);
  if (options_.ssd_shared && resource == FakeResource::kSsdWrite) {
    key = static_cast<int>(FakeResource::kSsdRead);
  }
  start = std::max(start, free_at_[key]);
  const OpId id = next_++;
  OpTimes t{now_, start, start + duration};
  free_at_[key] = t.end_s;
  live_[id] = t;
  return id;
}

OpId FakeExecutor::Submit(TransferOp op, std::span<const OpId> after) {
  FakeResource r = FakeResource::kCpu;
  double bw = options_.gather_bw;
  Seconds lat = 0;
  switch (op.kind) {
    case TransferKind::kSsdRead:
      r = FakeResource::kSsdRead, bw = options_.ssd_read_bw, lat = options_.ssd_latency;
      break;
    case TransferKind::kSsdWrite:
      r = FakeResource::kSsdWrite, bw = options_.ssd_write_bw, lat = options_.ssd_latency;
      break;
    case TransferKind::kH2D:
      r = FakeResource::kH2D, bw = options_.h2d_bw, lat = options_.pcie_latency;
      break;
    case TransferKind::kD2H:
      r = FakeResource::kD2H, bw = options_.d2h_bw, lat = options_.pcie_latency;
      break;
    case TransferKind::kCpuGather:
      break;
  }
  const Seconds duration = double(op.ios) * lat + double(op.bytes) / bw;
  OpId id = Schedule(r, duration, after);
  history_.push_back({id, true, std::move(op), {}, live_[id]});
  return id;
}

OpId FakeExecutor::Submit(ComputeOp op, std::span<const OpId> after) {
  const Seconds duration = options_.compute ? options_.compute(op) : options_.compute_s;
  OpId id = Schedule(FakeResource::kGpu, duration, after);
  history_.push_back({id, false, {}, op, live_[id]});
  return id;
}

Status FakeExecutor::Wait(OpId op) {
  auto it = live_.find(op);
  KVTIER_CHECK(it != live_.end(), "FakeExecutor: Wait on an unknown op");
  now_ = std::max(now_, it->second.end_s);
  return Status::OK();
}

std::size_t FakeExecutor::WaitAny(std::span<const OpId> ops) {
  KVTIER_CHECK(!ops.empty(), "FakeExecutor: WaitAny on nothing");
  Seconds first = live_.at(ops[0]).end_s;
  for (OpId op : ops) first = std::min(first, live_.at(op).end_s);
  now_ = std::max(now_, first);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (live_.at(ops[i]).end_s <= now_) return i;
  }
  return 0;
}

bool FakeExecutor::Done(OpId op) {
  auto it = live_.find(op);
  KVTIER_CHECK(it != live_.end(), "FakeExecutor: Done on an unknown op");
  return it->second.end_s <= now_;
}

OpTimes FakeExecutor::Retire(OpId op) {
  auto it = live_.find(op);
  KVTIER_CHECK(it != live_.end() && it->second.end_s <= now_, "FakeExecutor: Retire before done");
  OpTimes t = it->second;
  live_.erase(it);
  return t;
}

}  // namespace kvtier::testing
