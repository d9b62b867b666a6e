#include "core/request_run.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/reorderer.h"
#include "core/selector.h"

namespace kvtier {

RequestRun::RequestRun(Pipeline& pipeline, const Request& request, bool warmup, int holder)
    : pipeline_(pipeline), request_(&request), warmup_(warmup), holder_(holder), planner_(*this),
      // What Pipeline::Run reads of the schedule's Keep() calls (see Keep()).
      keeps_(pipeline.options_.system.reorder && !pipeline.selector_info_->history) {}

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
    pipeline_.AddBackground(id, tr);
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
        pipeline_.AddBackground(op, it->transfer);
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
      pipeline_.AddBackground(it->op, it->transfer);
      it = ops.erase(it);
    } else {
      ++it;
    }
  }
}

// w added once per head keeping the token, as for the sets: the same float sums, each token's
// adds in the same order. Only the order *across* tokens changes: the c adds of one token form
// a dependent chain (one float add's latency each, up to `heads` per token; this loop was 16%
// of a warm H2O run on the Mooncake trace), so tokens are grouped by count and kLanes tokens
// of one count advance together, their chains independent (one vector add per round for the
// lanes). Each element still sees exactly f = ((f + w) + w) + ... (c times).
void AddCountedShares(const Selection& kept, std::span<float> fraction) {
  const float w = 1.0f / float(std::max(1, kept.heads));
  const std::size_t k = kept.shared.size();
  if (k == 0) return;
  // Tokens by count (a counting sort of their indices into `order`).
  thread_local std::vector<std::uint32_t> start;
  thread_local std::vector<std::uint32_t> order;
  const std::uint16_t max_count = *std::max_element(kept.counts.begin(), kept.counts.end());
  start.assign(std::size_t(max_count) + 2, 0);
  for (std::uint16_t c : kept.counts) ++start[std::size_t(c) + 1];
  for (std::size_t c = 0; c + 1 < start.size(); ++c) start[c + 1] += start[c];
  order.resize(k);
  {
    thread_local std::vector<std::uint32_t> fill;
    fill.assign(start.begin(), start.end() - 1);
    for (std::size_t i = 0; i < k; ++i) {
      order[fill[kept.counts[i]]++] = std::uint32_t(kept.shared[i]);
    }
  }
  // kLanes tokens of count c: c rounds of four independent 8-float vector adds held in
  // registers; the last, partial block of a count pads its unused lanes (never stored).
  using F8 = float __attribute__((vector_size(32)));
  constexpr std::size_t kLanes = 32;
  float* f = fraction.data();
  for (std::size_t c = 1; c <= max_count; ++c) {
    for (std::uint32_t b = start[c]; b < start[c + 1]; b += kLanes) {
      const std::uint32_t* t = order.data() + b;
      const std::size_t m = std::min<std::size_t>(kLanes, start[c + 1] - b);
      float in[kLanes] = {};
      for (std::size_t j = 0; j < m; ++j) in[j] = f[t[j]];
      F8 a0, a1, a2, a3;
      std::memcpy(&a0, in, sizeof a0);
      std::memcpy(&a1, in + 8, sizeof a1);
      std::memcpy(&a2, in + 16, sizeof a2);
      std::memcpy(&a3, in + 24, sizeof a3);
      for (std::size_t r = 0; r < c; ++r) {
        a0 += w;
        a1 += w;
        a2 += w;
        a3 += w;
      }
      std::memcpy(in, &a0, sizeof a0);
      std::memcpy(in + 8, &a1, sizeof a1);
      std::memcpy(in + 16, &a2, sizeof a2);
      std::memcpy(in + 24, &a3, sizeof a3);
      for (std::size_t j = 0; j < m; ++j) f[t[j]] = in[j];
    }
  }
}

void RequestRun::Keep(const Selection& kept) {
  if (!keeps_) return;
  AddKept(kept);
}

void RequestRun::AddKept(const Selection& kept) {
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
    AddCountedShares(kept, kept_fraction);
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
