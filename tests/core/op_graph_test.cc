// OpGraph (core/op_graph.h): dependency counting, release order, the failure propagation of
// core/executor.h ("Failure"), retirement; then random graphs driven like an executor, checked
// against the contract's rules op by op.

#include "core/op_graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace kvtier {
namespace {

using Graph = OpGraph<int>;  // payload: a label
using Next = Graph::Next;
using State = Graph::State;

std::vector<OpId> Ids(std::initializer_list<OpId> ids) { return ids; }

TEST(OpGraph, IdsAreHandedOutInOrderAndAnOpWithoutDependenciesStarts) {
  Graph g;
  const auto a = g.Add(10, {});
  const auto b = g.Add(11, {});
  EXPECT_EQ(a.id, 1u);
  EXPECT_EQ(b.id, 2u);
  EXPECT_EQ(a.next, Next::kStart);
  EXPECT_EQ(g.At(a.id).state, State::kRunning);
  EXPECT_EQ(g.At(b.id).payload, 11);
  EXPECT_EQ(g.incomplete(), 2u);
}

TEST(OpGraph, DependentsStartWhenTheirLastDependencyCompletes) {
  Graph g;
  const OpId a = g.Add(0, {}).id, b = g.Add(0, {}).id;
  const auto c = g.Add(0, Ids({a, b}));
  const auto d = g.Add(0, Ids({a}));
  const auto e = g.Add(0, Ids({kNoOp, c.id}));  // kNoOp is no dependency
  EXPECT_EQ(c.next, Next::kWait);
  EXPECT_EQ(d.next, Next::kWait);
  EXPECT_EQ(e.next, Next::kWait);
  std::vector<OpId> started;
  auto start = [&](OpId id) { started.push_back(id); };
  g.Complete(a, start);
  EXPECT_EQ(started, Ids({d.id}));  // c still waits for b
  g.Complete(b, start);
  EXPECT_EQ(started, Ids({d.id, c.id}));
  EXPECT_FALSE(g.Done(c.id));
  g.Complete(c.id, start);
  EXPECT_EQ(started, Ids({d.id, c.id, e.id}));
  // A dependency that is already done counts for nothing.
  EXPECT_EQ(g.Add(0, Ids({a, b})).next, Next::kStart);
}

TEST(OpGraph, ADependencyListedTwiceReleasesOnce) {
  Graph g;
  const OpId a = g.Add(0, {}).id;
  const OpId b = g.Add(0, Ids({a, a})).id;
  int released = 0;
  g.Complete(a, [&](OpId id) {
    EXPECT_EQ(id, b);
    ++released;
  });
  EXPECT_EQ(released, 1);
}

// A started op that finishes at once (nothing to do) completes inside the callback that started
// it: a chain of them completes in one call.
TEST(OpGraph, CallbacksMayCompleteWhatTheyStart) {
  Graph g;
  const OpId a = g.Add(0, {}).id;
  OpId prev = a;
  for (int i = 0; i < 5; ++i) prev = g.Add(0, Ids({prev})).id;
  std::vector<OpId> order;
  std::function<void(OpId)> start = [&](OpId id) {
    order.push_back(id);
    g.Complete(id, start);
  };
  g.Complete(a, start);
  EXPECT_EQ(order, Ids({2, 3, 4, 5, 6}));
  EXPECT_EQ(g.incomplete(), 0u);
}

// core/executor.h "Failure": what depends on a failed op never runs; it completes at once with
// the status naming the root failure, transitively, dependents before their own dependents.
TEST(OpGraph, AFailureAbortsEverythingDownstreamNamingTheRoot) {
  Graph g;
  const OpId read = g.Add(0, {}).id;
  const OpId other = g.Add(0, {}).id;
  const OpId gather = g.Add(0, Ids({read})).id;
  const OpId h2d = g.Add(0, Ids({gather, other})).id;  // also waits for an unrelated op
  const OpId compute = g.Add(0, Ids({h2d})).id;
  const OpId sibling = g.Add(0, Ids({read})).id;
  const Status error = Status::IoError("chunk 0x1: short read");
  const Status why = AbortedAfter("ssd_read (demand, request 1, layer 0)", error);
  std::vector<OpId> aborted;
  g.Fail(read, error, why, [&](OpId id) { aborted.push_back(id); });
  EXPECT_EQ(aborted, Ids({gather, sibling, h2d, compute}));
  EXPECT_EQ(g.At(read).status.ToString(), error.ToString());
  for (OpId id : aborted) {
    EXPECT_TRUE(g.Done(id));
    EXPECT_EQ(g.At(id).status.code(), Status::Code::kAborted);
    EXPECT_EQ(g.At(id).status.message(), why.message());
  }
  EXPECT_EQ(g.incomplete(), 1u);  // `other` runs on
  // The unrelated dependency completing later releases nothing (h2d is done, aborted).
  g.Complete(other, [&](OpId) { ADD_FAILURE() << "an aborted op was started"; });
  EXPECT_EQ(g.incomplete(), 0u);
  // An op submitted after the failure that names a failed or aborted op is doomed at once.
  const auto late = g.Add(0, Ids({other, compute}));
  EXPECT_EQ(late.next, Next::kAbort);
  ASSERT_NE(late.abort, nullptr);
  EXPECT_EQ(late.abort->message(), why.message());
  g.Fail(late.id, *late.abort, *late.abort, [](OpId) {});
  EXPECT_EQ(g.At(late.id).status.message(), why.message());
}

TEST(OpGraph, RetiredOpsAreForgottenAndTheFrontIsPopped) {
  Graph g;
  const OpId a = g.Add(1, {}).id, b = g.Add(2, {}).id, c = g.Add(3, {}).id;
  g.Complete(b, [](OpId) {});
  g.Retire(b);  // retired behind a live one: kept until a is retired
  EXPECT_EQ(g.Find(b), nullptr);
  EXPECT_EQ(g.live(), 2u);
  g.Complete(a, [](OpId) {});
  g.Retire(a);
  EXPECT_EQ(g.Find(a), nullptr);
  EXPECT_EQ(g.At(c).payload, 3);
  EXPECT_EQ(g.live(), 1u);
  // A retired failure dooms nothing any more (nothing may name it: REQUIRES).
  g.Fail(c, Status::IoError("x"), AbortedAfter("c", Status::IoError("x")), [](OpId) {});
  g.Retire(c);
  EXPECT_EQ(g.Add(4, {}).next, Next::kStart);
  EXPECT_EQ(g.live(), 1u);
}

// An op that runs for a long time (a background store behind a backlog) does not keep every
// later op's node alive: memory follows the ops not yet retired, and the old op is still found,
// completed and retired with its dependents.
TEST(OpGraph, ALongRunningOpDoesNotKeepLaterOpsAlive) {
  Graph g;
  const OpId store = g.Add(-1, {}).id;
  const OpId after_store = g.Add(-2, std::vector<OpId>{store}).id;
  for (int i = 0; i < 100000; ++i) {
    const OpId op = g.Add(i, {}).id;
    g.Complete(op, [](OpId) {});
    g.Retire(op);
  }
  EXPECT_EQ(g.live(), 2u);
  EXPECT_LE(g.allocated_nodes(), 2048u) << "nodes are reused";
  ASSERT_NE(g.Find(store), nullptr);
  EXPECT_EQ(g.At(store).payload, -1);
  std::vector<OpId> ready;
  g.Complete(store, [&](OpId d) { ready.push_back(d); });
  EXPECT_EQ(ready, std::vector<OpId>{after_store});
  g.Retire(store);
  EXPECT_EQ(g.Find(store), nullptr);
  g.Complete(after_store, [](OpId) {});
  g.Retire(after_store);
  EXPECT_EQ(g.live(), 0u);
  EXPECT_EQ(g.Add(7, {}).next, Next::kStart);
}

// Random graphs, driven as an executor drives them: ops are added with random dependencies on
// live ops, running ops complete or fail in random order, done ops are retired at random.
// Checked against the contract: an op starts exactly once, and only after every dependency
// completed OK; an op with a failed dependency never starts and ends kAborted with the
// dependents' status of a failed dependency; an op ends OK only if every dependency did.
TEST(OpGraph, RandomGraphsFollowTheContract) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Graph g;
    struct Ref {
      std::vector<OpId> after;
      bool started = false, done = false, retired = false, ok = false;
      Status dependents_status;
    };
    std::vector<Ref> ref(1);  // ref[id]; id 0 unused
    std::vector<OpId> running;
    auto start = [&](OpId id) {
      ASSERT_FALSE(ref[id].started);
      for (OpId d : ref[id].after) {
        ASSERT_TRUE(ref[d].done && ref[d].ok) << "op " << id << " started before " << d;
      }
      ref[id].started = true;
      running.push_back(id);
    };
    auto aborted = [&](OpId id) {
      ASSERT_FALSE(ref[id].started) << "op " << id << " was started and then aborted";
      ref[id].done = true;
      const Status& s = g.At(id).status;
      ASSERT_EQ(s.code(), Status::Code::kAborted);
      bool names_a_failed_dependency = false;
      for (OpId d : ref[id].after) {
        if (ref[d].done && !ref[d].ok && ref[d].dependents_status.message() == s.message()) {
          names_a_failed_dependency = true;
        }
      }
      ASSERT_TRUE(names_a_failed_dependency) << "op " << id << ": " << s.ToString();
      ref[id].dependents_status = s;
    };
    int failures = 0;
    for (int step = 0; step < 400; ++step) {
      const int what = int(rng() % 10);
      if (what < 4 || running.empty()) {
        // Add an op after up to three live (not retired) ops.
        std::vector<OpId> after;
        for (int k = int(rng() % 4); k > 0; --k) {
          const OpId cand = OpId(1 + rng() % (ref.size() - 1 + (ref.size() == 1)));
          if (cand < ref.size() && !ref[cand].retired) after.push_back(cand);
        }
        if (ref.size() == 1) after.clear();
        const auto added = g.Add(0, after);
        ASSERT_EQ(added.id, ref.size());
        ref.push_back(Ref{.after = after, .dependents_status = {}});
        if (added.next == Next::kStart) {
          start(added.id);
        } else if (added.next == Next::kAbort) {
          const Status why = *added.abort;
          g.Fail(added.id, why, why, aborted);
          aborted(added.id);
        }
      } else if (what < 9) {
        // A running op ends: mostly OK, sometimes with an error.
        const std::size_t i = rng() % running.size();
        const OpId id = running[i];
        running.erase(running.begin() + std::ptrdiff_t(i));
        ref[id].done = true;
        if (rng() % 6 == 0) {
          ++failures;
          const Status err = Status::IoError("op " + std::to_string(id));
          ref[id].dependents_status = AbortedAfter("op " + std::to_string(id), err);
          g.Fail(id, err, ref[id].dependents_status, aborted);
        } else {
          ref[id].ok = true;
          g.Complete(id, start);
        }
      } else {
        // Retire a random done op.
        for (OpId id = 1; id < ref.size(); ++id) {
          if (ref[id].done && !ref[id].retired && rng() % 3 == 0) {
            g.Retire(id);
            ref[id].retired = true;
            break;
          }
        }
      }
      if (HasFatalFailure()) return;
    }
    // Finish everything still running.
    while (!running.empty()) {
      const OpId id = running.back();
      running.pop_back();
      ref[id].done = true;
      ref[id].ok = true;
      g.Complete(id, start);
    }
    EXPECT_EQ(g.incomplete(), 0u);
    EXPECT_GT(failures, 0);
    for (OpId id = 1; id < ref.size(); ++id) {
      ASSERT_TRUE(ref[id].done) << "op " << id << " never completed";
      if (ref[id].retired) continue;
      EXPECT_EQ(g.At(id).status.ok(), ref[id].ok) << "op " << id;
      bool deps_ok = true;
      for (OpId d : ref[id].after) deps_ok &= ref[d].ok;
      if (ref[id].ok) {
        EXPECT_TRUE(deps_ok) << "op " << id;
      }
      if (!deps_ok) {
        EXPECT_FALSE(ref[id].started) << "op " << id;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier
