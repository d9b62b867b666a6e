#include "core/request_run.h"

#include <algorithm>
#include <numeric>

#include "core/reorderer.h"

namespace kvtier {

RequestRun::RequestRun(Pipeline& pipeline, const Request& request, bool warmup, int holder)
    : pipeline_(pipeline), request_(&request), warmup_(warmup), holder_(holder), planner_(*this) {}

std::span<const float> RequestRun::History(std::uint32_t segment) const {
  return pipeline_.reorderer_->MeanImportance(segment);
}

OpId RequestRun::SubmitCompute(ComputeOp op, std::vector<OpId> after) {
  after.erase(std::remove(after.begin(), after.end(), kNoOp), after.end());
  op.request = request_->id;
  OpId id = pipeline_.executor_->Submit(op, after);
  ops.push_back({id, false, {}, true, op.layer, op.kind});
  return id;
}

OpId RequestRun::SubmitTransfer(TransferOp op, std::vector<OpId> after, bool background) {
  after.erase(std::remove(after.begin(), after.end(), kNoOp), after.end());
  if (op.ios == 0) op.ios = std::max<std::uint32_t>(1, std::uint32_t(op.chunks.size()));
  TransferRecord tr = PlannedTransfer(op, request_->id);
  switch (op.kind) {
    case TransferKind::kSsdRead: rec.ssd_read_bytes += op.bytes; break;
    case TransferKind::kSsdWrite: rec.ssd_write_bytes += op.bytes; break;
    case TransferKind::kH2D: rec.pcie_h2d_bytes += op.bytes; break;
    case TransferKind::kD2H: rec.pcie_d2h_bytes += op.bytes; break;
    case TransferKind::kCpuGather: break;
  }
  OpId id = pipeline_.executor_->Submit(std::move(op), after);
  if (background) {
    pipeline_.background_.push_back({id, tr});
  } else {
    ops.push_back({id, true, tr, false, tr.layer, ComputeKind::kLayerPrefill});
  }
  return id;
}

Status RequestRun::Wait(OpId op) {
  Status st = pipeline_.executor_->Wait(op);
  pipeline_.cache_->SetHolder(holder_);
  return st;
}

std::size_t RequestRun::WaitAny(std::span<const OpId> waiting, Status* status) {
  const std::size_t i = pipeline_.executor_->WaitAny(waiting);
  *status = pipeline_.executor_->Wait(waiting[i]);  // done: returns at once (executor contract)
  pipeline_.cache_->SetHolder(holder_);
  return i;
}

void RequestRun::Abandon(const std::vector<OpId>& abandoned) {
  // The request no longer waits for these transfers (and their dependencies): they finish in
  // the background and are logged then.
  for (OpId op : abandoned) {
    for (auto it = ops.begin(); it != ops.end(); ++it) {
      if (it->op == op && it->is_transfer) {
        pipeline_.background_.push_back({op, it->transfer});
        ops.erase(it);
        break;
      }
    }
  }
  // Their upstream reads: any foreground transfer not yet done that only they depended on is
  // moved too, so the request's end does not wait for abandoned work.
  for (auto it = ops.begin(); it != ops.end();) {
    if (it->is_transfer && it->transfer.purpose == Purpose::kCakeLoad &&
        !pipeline_.executor_->Done(it->op)) {
      pipeline_.background_.push_back({it->op, it->transfer});
      it = ops.erase(it);
    } else {
      ++it;
    }
  }
}

void RequestRun::Keep(const Selection& kept) {
  const bool sets = pipeline_.options_.system.reorder;
  if (sets) kept_sets.emplace_back();
  if (kept.kind == Selection::Kind::kShared) {
    for (std::int32_t t : kept.shared) kept_fraction[std::size_t(t)] += 1.0f;
    if (sets) kept_sets.back() = kept.shared;
  } else if (kept.kind == Selection::Kind::kPerHead) {
    const float w = 1.0f / float(std::max<std::size_t>(1, kept.per_head.size()));
    for (const auto& head : kept.per_head) {
      for (std::int32_t t : head) kept_fraction[std::size_t(t)] += w;
    }
    if (sets) {
      TokenSet& u = kept_sets.back();
      for (const auto& head : kept.per_head) u.insert(u.end(), head.begin(), head.end());
      std::sort(u.begin(), u.end());
      u.erase(std::unique(u.begin(), u.end()), u.end());
    }
  } else if (kept.kind == Selection::Kind::kCounted) {
    // w added once per head keeping the token, as for the sets: the same float sums.
    const float w = 1.0f / float(std::max(1, kept.heads));
    for (std::size_t i = 0; i < kept.shared.size(); ++i) {
      float& f = kept_fraction[std::size_t(kept.shared[i])];
      for (std::uint16_t c = 0; c < kept.counts[i]; ++c) f += w;
    }
    if (sets) kept_sets.back() = kept.shared;  // the heads' union
  } else {
    for (auto& f : kept_fraction) f += 1.0f;
    if (sets) {
      TokenSet& u = kept_sets.back();
      u.resize(std::size_t(std::max<std::int64_t>(0, kept.end - kept.begin)));
      std::iota(u.begin(), u.end(), std::int32_t(kept.begin));
    }
  }
}

}  // namespace kvtier
