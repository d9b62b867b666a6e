#pragma once
// OpGraph: the dependency graph of an Executor's operations -- ids, pending dependency counts,
// dependents, completion status, and the failure propagation of core/executor.h ("Failure") --
// written once for every executor that resolves dependencies itself (sim/SimExecutor,
// hw/HwExecutor). The executor says what an operation is (`Payload`) and runs it; the graph
// says when it may start and completes what a failure dooms.
//
// Life of an op:
//   Add(payload, after)  numbers it (ids 1, 2, ... in order) and counts the ops of `after` not
//       yet done. kStart: none pending, none failed -- it is running, start it. kWait: a later
//       Complete of its last pending dependency calls on_ready(id) -- start it then. kAbort: a
//       dependency has already failed -- complete it at once with Fail(id, *abort, *abort).
//   Complete(id, on_ready)  it succeeded; each dependent whose last pending dependency it was
//       becomes running and on_ready(dependent) is called, in the order they were added.
//   Fail(id, status, dependents_status, on_aborted)  it failed (or, at admission, was doomed):
//       every op downstream of it not yet done completes at once with `dependents_status`
//       (AbortedAfter(the failed op, status)), dependents before their own dependents, and
//       on_aborted(op) is called for each. An op added later that names a failed op in `after`
//       gets kAbort with that status, until the failed op is retired.
//   Retire(id)  forgets a done op. Each op is retired exactly once.
// Callbacks may call Add, Complete and Fail (a started op can finish at once); not Retire.
//
// Ops live in a deque indexed by id (op `id` is nodes[id - first]); retired ops at the front
// are popped. A deque never moves its elements, so a Node& stays valid while ops are added,
// until that op is retired. (SimExecutor replaced an unordered_map<OpId, Op> by this layout:
// a node allocation and hash lookups per op were visible in sim_bench's spec profile.)
// Failures are rare: their dependents' status is kept in a side map, not in every node.
//
// Thread-compatible: SimExecutor drives it from one actor at a time, HwExecutor under its
// scheduler lock. Plain C++: no platform includes.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/executor.h"
#include "core/status.h"

namespace kvtier {

template <typename Payload>
class OpGraph {
 public:
  enum class State : std::uint8_t { kWaiting, kRunning, kDone };
  enum class Next : std::uint8_t { kStart, kWait, kAbort };

  struct Node {
    Payload payload{};
    Status status;  // once done: OK, its own failure, or kAborted naming the root failure
    State state = State::kWaiting;
    bool retired = false;
    std::int32_t pending = 0;      // dependencies not yet done
    std::vector<OpId> dependents;  // ops waiting for this one (until it is done)
  };

  struct Added {
    OpId id = kNoOp;
    Next next = Next::kWait;
    // kAbort: the status to fail it with (valid until the next call).
    const Status* abort = nullptr;
  };

  // Adds an op that runs once every op of `after` has completed; kNoOp entries are ignored.
  // REQUIRES: every other id in `after` was added and is not retired (checked).
  Added Add(Payload payload, std::span<const OpId> after) {
    const OpId id = next_++;
    nodes_.emplace_back();
    Node& n = nodes_.back();
    n.payload = std::move(payload);
    ++incomplete_;
    const Status* abort = nullptr;
    for (OpId dep : after) {
      if (dep == kNoOp) continue;
      Node* d = Find(dep);
      KVTIER_CHECK(d != nullptr, "OpGraph: a dependency is unknown or already retired");
      if (d->state != State::kDone) {
        d->dependents.push_back(id);
        ++n.pending;
      } else if (abort == nullptr && !d->status.ok()) {
        abort = &failures_.at(dep);
      }
    }
    if (abort != nullptr) return {id, Next::kAbort, abort};
    if (n.pending > 0) return {id, Next::kWait, nullptr};
    n.state = State::kRunning;
    return {id, Next::kStart, nullptr};
  }

  // `id` completed successfully. REQUIRES: `id` is running.
  template <typename OnReady>
  void Complete(OpId id, OnReady&& on_ready) {
    Node& n = At(id);
    KVTIER_DCHECK(n.state == State::kRunning, "OpGraph: completing an op that is not running");
    n.state = State::kDone;
    --incomplete_;
    if (n.dependents.empty()) return;
    const std::vector<OpId> dependents = std::move(n.dependents);
    n.dependents = {};
    for (OpId d : dependents) {
      Node& dn = At(d);
      if (dn.state == State::kDone) continue;  // aborted by another failed dependency
      if (--dn.pending == 0) {
        dn.state = State::kRunning;
        on_ready(d);
      }
    }
  }

  // `id` failed with `status` (or was doomed at admission: kAbort); what depends on it
  // completes with `dependents_status`. REQUIRES: `id` not done.
  template <typename OnAborted>
  void Fail(OpId id, Status status, const Status& dependents_status, OnAborted&& on_aborted) {
    KVTIER_DCHECK(!status.ok(), "OpGraph: Fail with an OK status");
    Node& n = At(id);
    KVTIER_DCHECK(n.state != State::kDone, "OpGraph: failing an op that is done");
    const Status why = dependents_status;  // may refer into failures_, which changes below
    n.state = State::kDone;
    n.status = std::move(status);
    --incomplete_;
    failures_[id] = why;
    // Downstream, breadth first: dependents before their own dependents.
    std::vector<OpId> queue = std::move(n.dependents);
    n.dependents = {};
    for (std::size_t i = 0; i < queue.size(); ++i) {
      const OpId d = queue[i];
      Node& dn = At(d);
      if (dn.state == State::kDone) continue;
      dn.state = State::kDone;
      dn.status = why;
      --incomplete_;
      failures_[d] = why;
      queue.insert(queue.end(), dn.dependents.begin(), dn.dependents.end());
      dn.dependents = {};
      on_aborted(d);
    }
  }

  // Forgets a done op (its payload is released). REQUIRES: Done(id).
  void Retire(OpId id) {
    Node& n = At(id);
    KVTIER_CHECK(n.state == State::kDone, "OpGraph: retiring an op that is not done");
    if (!n.status.ok()) failures_.erase(id);
    n.retired = true;
    n.payload = Payload{};
    while (!nodes_.empty() && nodes_.front().retired) {
      nodes_.pop_front();
      ++first_;
    }
  }

  // The op `id`, or nullptr when it is unknown or retired.
  Node* Find(OpId id) {
    if (id < first_ || id - first_ >= nodes_.size()) return nullptr;
    Node& n = nodes_[id - first_];
    return n.retired ? nullptr : &n;
  }
  // REQUIRES: `id` added and not retired (checked).
  Node& At(OpId id) {
    Node* n = Find(id);
    KVTIER_CHECK(n != nullptr, "OpGraph: unknown or retired op");
    return *n;
  }
  const Node& At(OpId id) const { return const_cast<OpGraph*>(this)->At(id); }
  bool Done(OpId id) const { return At(id).state == State::kDone; }

  // Ops added and not yet done (the executor's Drain waits for 0).
  std::size_t incomplete() const { return incomplete_; }
  // Ops added and not yet retired, done or not.
  std::size_t live() const {
    std::size_t n = 0;
    for (const Node& node : nodes_) n += node.retired ? 0 : 1;
    return n;
  }

 private:
  std::deque<Node> nodes_;
  OpId first_ = 1;  // id of nodes_.front()
  OpId next_ = 1;
  std::size_t incomplete_ = 0;
  std::unordered_map<OpId, Status> failures_;  // failed or aborted op -> its dependents' status
};

}  // namespace kvtier
