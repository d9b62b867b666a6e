#include "tests/testutil/fake_executor.h"

#include <algorithm>

#include "core/check.h"

namespace kvtier::testing {

std::optional<Status> FakeExecutor::ScriptedFailure(const TransferOp* t, const ComputeOp* c) {
  for (std::size_t i = 0; i < options_.failures.size(); ++i) {
    const FakeFailure& f = options_.failures[i];
    if (f.transfer && (t == nullptr || t->kind != *f.transfer)) continue;
    if (f.compute && (c == nullptr || c->kind != *f.compute)) continue;
    if (f.purpose && (t == nullptr || t->purpose != *f.purpose)) continue;
    if (f.layer && (t != nullptr ? t->layer : c->layer) != *f.layer) continue;
    ++matched_[i];
    if (f.nth != 0 && matched_[i] != f.nth) continue;
    // Name the chunk as hw's errors do.
    if (t != nullptr && !t->chunks.empty()) {
      return f.status.Annotate(DescribeChunk(t->chunks.front().chunk));
    }
    return f.status;
  }
  return std::nullopt;
}

OpId FakeExecutor::Schedule(FakeResource resource, Seconds duration, std::span<const OpId> after,
                            const TransferOp* t, const ComputeOp* c) {
  Seconds start = now_;
  const Live* failed_dep = nullptr;  // the failed dependency that completes first
  for (OpId dep : after) {
    auto it = live_.find(dep);
    KVTIER_CHECK(it != live_.end(), "FakeExecutor: dependency unknown or already retired");
    start = std::max(start, it->second.times.end_s);
    if (!it->second.times.status.ok() &&
        (failed_dep == nullptr || it->second.times.end_s < failed_dep->times.end_s)) {
      failed_dep = &it->second;
    }
  }
  const OpId id = next_++;
  Live live;
  live.what = t != nullptr ? DescribeOp(*t) : DescribeOp(*c);
  if (failed_dep != nullptr) {
    // Never runs: completes when the failure is known, off its resource.
    const Seconds at = std::max(now_, failed_dep->times.end_s);
    live.times.submit_s = now_;
    live.times.start_s = at;
    live.times.end_s = at;
    live.times.status = AbortedAfter(failed_dep->what, failed_dep->times.status);
    live_[id] = std::move(live);
    return id;
  }
  int key = static_cast<int>(resource);
  if (options_.ssd_shared && resource == FakeResource::kSsdWrite) {
    key = static_cast<int>(FakeResource::kSsdRead);
  }
  start = std::max(start, free_at_[key]);
  live.times.submit_s = now_;
  live.times.start_s = start;
  live.times.end_s = start + duration;
  free_at_[key] = live.times.end_s;
  if (std::optional<Status> failure = ScriptedFailure(t, c)) {
    live.times.status = *failure;
    if (t != nullptr) live.times.failed_moved_bytes = t->bytes / 2;
  }
  live_[id] = std::move(live);
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
  OpId id = Schedule(r, duration, after, &op, nullptr);
  history_.push_back({id, true, std::move(op), {}, live_[id].times});
  return id;
}

OpId FakeExecutor::Submit(ComputeOp op, std::span<const OpId> after) {
  const Seconds duration = options_.compute ? options_.compute(op) : options_.compute_s;
  OpId id = Schedule(FakeResource::kGpu, duration, after, nullptr, &op);
  history_.push_back({id, false, {}, op, live_[id].times});
  return id;
}

Status FakeExecutor::Wait(OpId op) {
  auto it = live_.find(op);
  KVTIER_CHECK(it != live_.end(), "FakeExecutor: Wait on an unknown op");
  now_ = std::max(now_, it->second.times.end_s);
  return it->second.times.status;
}

std::size_t FakeExecutor::WaitAny(std::span<const OpId> ops) {
  KVTIER_CHECK(!ops.empty(), "FakeExecutor: WaitAny on nothing");
  Seconds first = live_.at(ops[0]).times.end_s;
  for (OpId op : ops) first = std::min(first, live_.at(op).times.end_s);
  now_ = std::max(now_, first);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (live_.at(ops[i]).times.end_s <= now_) return i;
  }
  return 0;
}

bool FakeExecutor::Done(OpId op) {
  auto it = live_.find(op);
  KVTIER_CHECK(it != live_.end(), "FakeExecutor: Done on an unknown op");
  return it->second.times.end_s <= now_;
}

OpTimes FakeExecutor::Retire(OpId op) {
  auto it = live_.find(op);
  KVTIER_CHECK(it != live_.end() && it->second.times.end_s <= now_,
               "FakeExecutor: Retire before done");
  OpTimes t = std::move(it->second.times);
  live_.erase(it);
  return t;
}

void FakeExecutor::Drain() {
  for (const auto& [id, live] : live_) now_ = std::max(now_, live.times.end_s);
}

}  // namespace kvtier::testing
