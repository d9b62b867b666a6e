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
// Ops are found by id in a window (a deque of node pointers: op `id` is window[id - first]);
// retired ops at its front are popped, and an op still unretired when the window has grown
// past kWindow ops is moved to a side map (an op runs long: a background store behind a
// backlog), so the window does not keep every op since the oldest one alive. Nodes come from a
// pool of blocks that never move and reuse retired nodes, so a Node& stays valid while ops
// are added, until that op is retired, and memory follows the ops not yet retired.
// (SimExecutor replaced an unordered_map<OpId, Op> by a deque of nodes: a node allocation and
// hash lookups per op were visible in sim_bench's spec profile. That deque then held every op
// since the oldest running store: 5% of a Mooncake replay's heap after 400 requests, growing
// without bound.) Failures are rare: their dependents' status is kept in a side map, not in
// every node.
//
// Thread-compatible: SimExecutor drives it from one actor at a time, HwExecutor under its
// scheduler lock. Plain C++: no platform includes.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
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
    Node* node = NewNode();
    window_.push_back(node);
    Node& n = *node;
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
    if (id < first_) {
      stragglers_.erase(id);
    } else {
      window_[id - first_] = nullptr;
    }
    n = Node{};
    free_.push_back(&n);
    // Pop what is retired; past kWindow ops, an op still unretired moves aside.
    while (!window_.empty() && (window_.front() == nullptr || window_.size() > kWindow)) {
      if (window_.front() != nullptr) stragglers_.emplace(first_, window_.front());
      window_.pop_front();
      ++first_;
    }
  }

  // The op `id`, or nullptr when it is unknown or retired.
  Node* Find(OpId id) {
    if (id >= first_) return id - first_ < window_.size() ? window_[id - first_] : nullptr;
    auto it = stragglers_.find(id);
    return it == stragglers_.end() ? nullptr : it->second;
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
    std::size_t n = stragglers_.size();
    for (const Node* node : window_) n += node != nullptr;
    return n;
  }
  // Nodes allocated (live, or free for reuse): what the graph's memory follows.
  std::size_t allocated_nodes() const { return blocks_.size() * kBlock - carve_left_; }

 private:
  static constexpr std::size_t kWindow = 4096;
  static constexpr std::size_t kBlock = 1024;

  Node* NewNode() {
    if (!free_.empty()) {
      Node* n = free_.back();
      free_.pop_back();
      return n;
    }
    if (carve_left_ == 0) {
      blocks_.push_back(std::make_unique<Node[]>(kBlock));
      carve_left_ = kBlock;
    }
    return &blocks_.back()[kBlock - carve_left_--];
  }

  std::deque<Node*> window_;  // ops first_, first_ + 1, ...; nullptr once retired
  std::unordered_map<OpId, Node*> stragglers_;  // unretired ops older than the window
  std::vector<std::unique_ptr<Node[]>> blocks_;  // node storage; never moves
  std::vector<Node*> free_;                       // retired nodes, reset, for reuse
  std::size_t carve_left_ = 0;                    // unused nodes at the end of the last block
  OpId first_ = 1;  // id of window_.front()
  OpId next_ = 1;
  std::size_t incomplete_ = 0;
  std::unordered_map<OpId, Status> failures_;  // failed or aborted op -> its dependents' status
};

}  // namespace kvtier
