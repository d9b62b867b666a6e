// Golden tests of the SimGrid executor: simulated times derived by hand. Each TEST runs in its
// own process (gtest_discover_tests), because SimGrid's Engine is one per process.

#include "sim/sim_executor.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/transfer_strategy.h"
#include "models/cost_model.h"

namespace kvtier::sim {
namespace {

ModelSpec Model() {
  ModelSpec m;
  m.name = "tiny";
  m.layers = 1;
  m.hidden = 64;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 16;
  m.ffn = 128;
  m.vocab = 100;
  m.max_context = 1024;
  return m;
}

HardwareOptions Hw() {
  HardwareOptions h;
  h.ssd_read_bw = 5e9;
  h.ssd_write_bw = 2e9;
  h.ssd_latency = 80e-6;
  h.ssd_queue_depth = 32;
  h.pcie_h2d_bw = 25e9;
  h.pcie_d2h_bw = 25e9;
  h.pcie_latency = 0;
  h.cpu_gather_bw = 8e9;
  h.cpu_gather_run_cost = 0;  // gathers cost bytes only here (StrategyHw below sets it)
  return h;
}

TransferOp Xfer(TransferKind kind, Bytes bytes, std::uint32_t ios = 1) {
  TransferOp op;
  op.kind = kind;
  op.bytes = bytes;
  op.ios = ios;
  return op;
}

TEST(SimExecutorGolden, OneSsdReadPaysLatencyAndBandwidth) {
  SimExecutor ex(Model(), Hw());
  OpTimes t;
  ex.Run([&] {
    OpId id = ex.Submit(Xfer(TransferKind::kSsdRead, 65536), {});
    ASSERT_TRUE(ex.Wait(id).ok());
    t = ex.Retire(id);
  });
  EXPECT_DOUBLE_EQ(t.start_s, 0.0);
  EXPECT_DOUBLE_EQ(t.end_s, 80e-6 + 65536 / 5e9);  // 93.1072 us
}

TEST(SimExecutorGolden, QueueDepthBatchesLatency) {
  SimExecutor ex(Model(), Hw());
  OpTimes t;
  ex.Run([&] {
    // 70 I/Os at queue depth 32: three waves of latency.
    OpId id = ex.Submit(Xfer(TransferKind::kSsdRead, 70 * 65536, 70), {});
    ex.Wait(id);
    t = ex.Retire(id);
  });
  EXPECT_NEAR(t.end_s, 3 * 80e-6 + 70 * 65536 / 5e9, 1e-12);
}

TEST(SimExecutorGolden, ConcurrentCopiesShareThePcieLink) {
  SimExecutor ex(Model(), Hw());
  OpTimes a, b, c;
  ex.Run([&] {
    OpId x = ex.Submit(Xfer(TransferKind::kH2D, 1000000000), {});
    OpId y = ex.Submit(Xfer(TransferKind::kH2D, 1000000000), {});
    OpId z = ex.Submit(Xfer(TransferKind::kD2H, 1000000000), {});  // other direction
    ex.Wait(x);
    ex.Wait(y);
    ex.Wait(z);
    a = ex.Retire(x), b = ex.Retire(y), c = ex.Retire(z);
  });
  EXPECT_NEAR(a.end_s, 0.08, 1e-12);
  EXPECT_NEAR(b.end_s, 0.08, 1e-12);
  EXPECT_NEAR(c.end_s, 0.04, 1e-12) << "split duplex: D2H does not share H2D's bandwidth";
}

TEST(SimExecutorGolden, DependenciesStartAtTheExactCompletionTime) {
  SimExecutor ex(Model(), Hw());
  OpTimes r, g, h;
  ex.Run([&] {
    OpId read = ex.Submit(Xfer(TransferKind::kSsdRead, 5000000), {});       // 80us + 1ms
    OpId gather = ex.Submit(Xfer(TransferKind::kCpuGather, 800000), std::vector<OpId>{read});
    OpId h2d = ex.Submit(Xfer(TransferKind::kH2D, 2500000), std::vector<OpId>{gather});
    ex.Wait(h2d);
    r = ex.Retire(read), g = ex.Retire(gather), h = ex.Retire(h2d);
  });
  EXPECT_NEAR(r.end_s, 80e-6 + 1e-3, 1e-12);
  EXPECT_NEAR(g.start_s, r.end_s, 1e-15);
  EXPECT_NEAR(g.end_s, r.end_s + 1e-4, 1e-12);
  EXPECT_NEAR(h.start_s, g.end_s, 1e-15);
  EXPECT_NEAR(h.end_s, g.end_s + 1e-4, 1e-12);
}

TEST(SimExecutorGolden, ReadsAndWritesShareTheSsd) {
  SimExecutor ex(Model(), Hw());
  OpTimes r, w;
  HardwareOptions hw = Hw();
  ex.Run([&] {
    OpId read = ex.Submit(Xfer(TransferKind::kSsdRead, 5000000000ull - 400000), {});
    OpId write = ex.Submit(Xfer(TransferKind::kSsdWrite, 2000000000ull - 160000), {});
    ex.Wait(read);
    ex.Wait(write);
    r = ex.Retire(read), w = ex.Retire(write);
  });
  // Alone: read 1 s, write 1 s. Together the shared 5 GB/s constraint binds: max-min gives the
  // write its 2 GB/s cap, the read the remaining 3 GB/s until the write ends at 1 s, then 5 GB/s:
  // read done at 1 + (5e9 - 3e9) / 5e9 = 1.4 s (notes/simgrid-3.32 §4, DiskS19 shape).
  EXPECT_NEAR(w.end_s, 1.0, 1e-9);
  EXPECT_NEAR(r.end_s, 1.4, 1e-9);
}

TEST(SimExecutorGolden, BackgroundWritesGetAtMostTheirShareOfTheSsd) {
  HardwareOptions hw = Hw();
  hw.ssd_background_share = 0.25;  // background writes capped at 0.25 * 2 GB/s = 0.5 GB/s
  SimExecutor ex(Model(), hw);
  OpTimes r, w;
  ex.Run([&] {
    OpId read = ex.Submit(Xfer(TransferKind::kSsdRead, 5000000000ull - 400000), {});
    TransferOp store = Xfer(TransferKind::kSsdWrite, 500000000ull - 160000);
    store.purpose = Purpose::kStore;
    OpId write = ex.Submit(store, {});
    ex.Wait(read);
    ex.Wait(write);
    r = ex.Retire(read), w = ex.Retire(write);
  });
  // The write runs at its 0.5 GB/s cap and ends at 1 s; the demand read gets the other
  // 4.5 GB/s of the shared 5 GB/s until then, and the whole 5 GB/s after: 1 + 0.5e9/5e9 s.
  EXPECT_NEAR(w.end_s, 1.0, 1e-9);
  EXPECT_NEAR(r.end_s, 1.1, 1e-9);
}

// ssd.write_lanes: three 0.5 GB stores (1 s each alone at the 0.5 GB/s background cap).
// No limit (0): they share the cap and all end at 3 s. A limit of 1 runs them one after the
// other in submission order (1, 2, 3 s; the third starts at 2 s); a limit of 2 shares the cap
// between the first two (both end at 2 s), then the third runs alone (3 s). The demand read
// beside them gets the other 4.5 GB/s of the device while any store runs, however many.
// A store (background) that takes 1 s at the 0.5 GB/s cap, its SSD latency included.
TransferOp HalfGbStore() {
  TransferOp store = Xfer(TransferKind::kSsdWrite, 500000000ull - 160000);
  store.purpose = Purpose::kStore;
  return store;
}

void ThreeStoresAndARead(int limit, OpTimes* stores, OpTimes* read) {
  HardwareOptions hw = Hw();
  hw.ssd_background_share = 0.25;  // 0.25 * 2 GB/s = 0.5 GB/s for background writes
  hw.ssd_write_lanes = limit;
  SimExecutor ex(Model(), hw);
  ex.Run([&] {
    OpId ids[3];
    for (OpId& id : ids) id = ex.Submit(HalfGbStore(), {});
    const OpId r = ex.Submit(Xfer(TransferKind::kSsdRead, 4500000000ull - 400000), {});
    for (OpId id : ids) ex.Wait(id);
    ex.Wait(r);
    for (int i = 0; i < 3; ++i) stores[i] = ex.Retire(ids[i]);
    *read = ex.Retire(r);
  });
}

TEST(SimExecutorGolden, BackgroundStoresShareTheCapWithoutALimit) {
  OpTimes s[3], r;
  ThreeStoresAndARead(0, s, &r);
  for (const OpTimes& t : s) {
    EXPECT_NEAR(t.start_s, 0.0, 1e-15);
    EXPECT_NEAR(t.end_s, 3.0, 1e-9);
  }
  EXPECT_NEAR(r.end_s, 1.0, 1e-9);
}

TEST(SimExecutorGolden, OneWriteLaneRunsStoresInFifoOrder) {
  OpTimes s[3], r;
  ThreeStoresAndARead(1, s, &r);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(s[i].submit_s, 0.0, 1e-15);
    EXPECT_NEAR(s[i].start_s, double(i), 1e-9);
    EXPECT_NEAR(s[i].end_s, double(i + 1), 1e-9);
  }
  EXPECT_NEAR(r.end_s, 1.0, 1e-9) << "the read sees the same 4.5 GB/s";
}

// Completion notices (Executor::Watch/TakeDone): with one write lane the three stores above
// end at 1, 2 and 3 s. A watched op is reported once, by the first TakeDone after it ended
// (exactly when Done says true); one already done when watched is reported at once; an op not
// watched never is.
TEST(SimExecutorNotices, WatchedOpsAreReportedOnceWhenDone) {
  HardwareOptions hw = Hw();
  hw.ssd_background_share = 0.25;
  hw.ssd_write_lanes = 1;
  SimExecutor ex(Model(), hw);
  ex.Run([&] {
    OpId ids[3];
    for (OpId& id : ids) id = ex.Submit(HalfGbStore(), {});
    const OpId read = ex.Submit(Xfer(TransferKind::kSsdRead, 1000), {});
    EXPECT_TRUE(ex.Watch(ids[1]));
    EXPECT_TRUE(ex.Watch(ids[2]));
    std::vector<OpId> done;
    ex.TakeDone(&done);
    EXPECT_TRUE(done.empty());
    ex.IdleUntil(1.5);  // the first store (not watched) and the read are done
    EXPECT_TRUE(ex.Done(ids[0]));
    EXPECT_TRUE(ex.Done(read));
    ex.TakeDone(&done);
    EXPECT_TRUE(done.empty());
    EXPECT_TRUE(ex.Watch(read));  // already done: reported by the next TakeDone
    ex.TakeDone(&done);
    EXPECT_EQ(done, std::vector<OpId>{read});
    ex.IdleUntil(2.5);
    EXPECT_TRUE(ex.Done(ids[1]));
    EXPECT_FALSE(ex.Done(ids[2]));
    done.clear();
    ex.TakeDone(&done);
    EXPECT_EQ(done, std::vector<OpId>{ids[1]});
    done.clear();
    ex.TakeDone(&done);
    EXPECT_TRUE(done.empty()) << "reported once";
    ex.Wait(ids[2]);
    EXPECT_NEAR(ex.Now(), 3.0, 1e-9);
    ex.TakeDone(&done);
    EXPECT_EQ(done, std::vector<OpId>{ids[2]});
    for (OpId id : ids) ex.Retire(id);
    ex.Retire(read);
  });
}

TEST(SimExecutorGolden, TwoWriteLanesShareBetweenTheFirstTwo) {
  OpTimes s[3], r;
  ThreeStoresAndARead(2, s, &r);
  EXPECT_NEAR(s[0].end_s, 2.0, 1e-9);
  EXPECT_NEAR(s[1].end_s, 2.0, 1e-9);
  EXPECT_NEAR(s[2].start_s, 2.0, 1e-9);
  EXPECT_NEAR(s[2].end_s, 3.0, 1e-9);
  EXPECT_NEAR(r.end_s, 1.0, 1e-9);
}

// cpu.shared_copy_bw: a gather, an H2D and a D2H started together share one 10 GB/s host-memory
// link max-min fairly (each below its own link's cap): 10/3 GB/s each until the 5 MB D2H ends
// at 1.5 ms; then the gather (3 MB left) and the H2D (5 MB left) 5 GB/s each, the gather ending
// at 1.5 + 0.6 = 2.1 ms; the H2D's last 2 MB alone at min(25, 10) GB/s: 2.3 ms (23 MB / 10 GB/s).
TEST(SimExecutorGolden, SharedCopyBandwidthIsSharedByGathersAndBothPcieDirections) {
  HardwareOptions hw = Hw();
  hw.cpu_shared_copy_bw = 10e9;
  SimExecutor ex(Model(), hw);
  OpTimes g, h, d;
  ex.Run([&] {
    OpId a = ex.Submit(Xfer(TransferKind::kCpuGather, 8000000), {});
    OpId b = ex.Submit(Xfer(TransferKind::kH2D, 10000000), {});
    OpId c = ex.Submit(Xfer(TransferKind::kD2H, 5000000), {});
    ex.Wait(a), ex.Wait(b), ex.Wait(c);
    g = ex.Retire(a), h = ex.Retire(b), d = ex.Retire(c);
  });
  EXPECT_NEAR(d.end_s, 1.5e-3, 1e-9);
  EXPECT_NEAR(g.end_s, 2.1e-3, 1e-9);
  EXPECT_NEAR(h.end_s, 2.3e-3, 1e-9);
}

// Alone, an op runs at the lower of its own rate and the shared one; together a gather and an
// H2D share it (5 GB/s each until the gather's 8 MB end at 1.6 ms, then the H2D's last 2 MB at
// 10 GB/s: 1.8 ms); with the default 0 they do not slow each other (10 MB at 25 GB/s). One
// simulation per process: SimGrid's engine is a singleton.
void GatherThenGatherWithH2d(double shared, OpTimes* alone, OpTimes* h2d) {
  HardwareOptions hw = Hw();
  hw.cpu_shared_copy_bw = shared;
  SimExecutor ex(Model(), hw);
  ex.Run([&] {
    OpId a = ex.Submit(Xfer(TransferKind::kCpuGather, 8000000), {});
    ASSERT_TRUE(ex.Wait(a).ok());
    *alone = ex.Retire(a);
    OpId b = ex.Submit(Xfer(TransferKind::kH2D, 10000000), {});
    OpId c = ex.Submit(Xfer(TransferKind::kCpuGather, 8000000), {});
    ex.Wait(b), ex.Wait(c);
    *h2d = ex.Retire(b);
    ex.Retire(c);
  });
}

TEST(SimExecutorGolden, SharedCopyBandwidthCapsAnOpAloneAndSharesTwo) {
  OpTimes g, h;
  GatherThenGatherWithH2d(10e9, &g, &h);
  EXPECT_NEAR(g.end_s - g.start_s, 1e-3, 1e-9) << "8 MB at min(8, 10) GB/s";
  EXPECT_NEAR(h.end_s - h.start_s, 1.8e-3, 1e-9);
}

TEST(SimExecutorGolden, SharedCopyBandwidthIsOffByDefault) {
  OpTimes g, h;
  GatherThenGatherWithH2d(0, &g, &h);
  EXPECT_NEAR(g.end_s - g.start_s, 1e-3, 1e-9);
  EXPECT_NEAR(h.end_s - h.start_s, 0.4e-3, 1e-9);
}

TEST(SimExecutorGolden, OpOverheadDelaysEveryTransferOnce) {
  HardwareOptions hw = Hw();
  hw.cpu_op_overhead = 50e-6;
  SimExecutor ex(Model(), hw);
  OpTimes a, b, c;
  ex.Run([&] {
    OpId x = ex.Submit(Xfer(TransferKind::kH2D, 25000000), {});          // 1 ms of PCIe
    OpId y = ex.Submit(Xfer(TransferKind::kH2D, 25000000), std::vector<OpId>{x});
    ComputeOp op;
    op.kind = ComputeKind::kOutputLayer;
    OpId z = ex.Submit(op, std::vector<OpId>{y});  // compute ops pay gpu.kernel_overhead only
    ex.Wait(z);
    a = ex.Retire(x), b = ex.Retire(y), c = ex.Retire(z);
  });
  EXPECT_NEAR(a.start_s, 50e-6, 1e-12);  // stamped when the link takes it, after the hand-off
  EXPECT_NEAR(a.end_s, 50e-6 + 1e-3, 1e-12);
  EXPECT_NEAR(b.start_s, a.end_s + 50e-6, 1e-12);
  EXPECT_NEAR(b.end_s, 2 * (50e-6 + 1e-3), 1e-12);
  EXPECT_NEAR(c.start_s, b.end_s, 1e-15);
}

// cpu.driver_op_cost: each Submit costs the driving thread 20 us on its own clock, which runs
// ahead of the engine; an op is submitted (and released) at the driver's time, so a burst of
// submissions releases its ops 20 us apart, and Now() after them is the driver's time.
TEST(SimExecutorGolden, DriverOpCostReleasesEachSubmissionOnTheDriversClock) {
  HardwareOptions hw = Hw();
  hw.cpu_driver_op_cost = 20e-6;
  SimExecutor ex(Model(), hw);
  OpTimes a, b, c;
  Seconds after_submits = -1, after_wait = -1;
  ex.Run([&] {
    OpId x = ex.Submit(Xfer(TransferKind::kH2D, 25000000), {});          // 1 ms of PCIe
    OpId y = ex.Submit(Xfer(TransferKind::kH2D, 25000000), std::vector<OpId>{x});
    OpId z = ex.Submit(Xfer(TransferKind::kD2H, 25000000), {});   // 1 ms the other way
    after_submits = ex.Now();
    ASSERT_TRUE(ex.Wait(y).ok());
    after_wait = ex.Now();
    ex.Wait(z);
    a = ex.Retire(x), b = ex.Retire(y), c = ex.Retire(z);
  });
  EXPECT_NEAR(a.submit_s, 20e-6, 1e-12);
  EXPECT_NEAR(a.start_s, 20e-6, 1e-12);
  EXPECT_NEAR(a.end_s, 20e-6 + 1e-3, 1e-12);
  EXPECT_NEAR(b.submit_s, 40e-6, 1e-12);
  EXPECT_NEAR(b.start_s, a.end_s, 1e-12);  // its dependency ends after its release
  EXPECT_NEAR(b.end_s, a.end_s + 1e-3, 1e-12);
  EXPECT_NEAR(c.start_s, 60e-6, 1e-12);   // independent: released third
  EXPECT_NEAR(c.end_s, 60e-6 + 1e-3, 1e-12);
  EXPECT_NEAR(after_submits, 60e-6, 1e-12);
  EXPECT_NEAR(after_wait, b.end_s, 1e-12);  // no wake-up cost set
}

// cpu.driver_wake: a wait that blocked returns to a driver that runs 30 us after the op's end
// (later submissions start from there); a wait on an op already done costs nothing.
TEST(SimExecutorGolden, DriverWakeFollowsOnlyAWaitThatBlocked) {
  HardwareOptions hw = Hw();
  hw.cpu_driver_wake = 30e-6;
  SimExecutor ex(Model(), hw);
  OpTimes a, b;
  Seconds woke = -1, idle = -1, no_wake = -1;
  ex.Run([&] {
    OpId x = ex.Submit(Xfer(TransferKind::kH2D, 25000000), {});  // 1 ms
    ex.Wait(x);
    woke = ex.Now();
    OpId y = ex.Submit(Xfer(TransferKind::kH2D, 25000000), {});
    ex.IdleUntil(5e-3);
    idle = ex.Now();
    ex.Wait(y);  // done at 2.03 ms: did not block
    no_wake = ex.Now();
    a = ex.Retire(x), b = ex.Retire(y);
  });
  EXPECT_NEAR(a.end_s, 1e-3, 1e-12);
  EXPECT_NEAR(woke, 1e-3 + 30e-6, 1e-12);
  EXPECT_NEAR(b.start_s, 1e-3 + 30e-6, 1e-12);
  EXPECT_NEAR(b.end_s, 2e-3 + 30e-6, 1e-12);
  EXPECT_NEAR(idle, 5e-3, 1e-12);
  EXPECT_NEAR(no_wake, 5e-3, 1e-12);
}

// With several driving actors each has its own driver clock: both first submissions are
// released at 20 us, and actor 1's second one at 40 us although actor 0 submitted in between.
TEST(SimExecutorGolden, EachDrivingActorHasItsOwnDriverClock) {
  HardwareOptions hw = Hw();
  hw.cpu_driver_op_cost = 20e-6;
  SimExecutor ex(Model(), hw);
  std::vector<OpTimes> first(2), second(2);
  ex.Run(2, [&](int actor) {
    // Two 1-us gathers each (both actors' share the CPU, which changes their ends only).
    OpId x = ex.Submit(Xfer(TransferKind::kCpuGather, 8000, 0), {});  // 1 us of gather
    OpId y = ex.Submit(Xfer(TransferKind::kCpuGather, 8000, 0), {});
    ex.Wait(x);
    ex.Wait(y);
    first[std::size_t(actor)] = ex.Retire(x);
    second[std::size_t(actor)] = ex.Retire(y);
    ex.Drain();
  });
  for (int actor = 0; actor < 2; ++actor) {
    EXPECT_NEAR(first[std::size_t(actor)].submit_s, 20e-6, 1e-12) << actor;
    EXPECT_NEAR(first[std::size_t(actor)].start_s, 20e-6, 1e-12) << actor;
    EXPECT_NEAR(second[std::size_t(actor)].submit_s, 40e-6, 1e-12) << actor;
    EXPECT_NEAR(second[std::size_t(actor)].start_s, 40e-6, 1e-12) << actor;
  }
}

TEST(SimExecutorGolden, ComputeTakesTheCostModelsTime) {
  ModelSpec m = Model();
  HardwareOptions hw = Hw();
  SimExecutor ex(m, hw);
  ComputeOp op;
  op.kind = ComputeKind::kLayerPrefill;
  op.layer = 0;
  op.new_tokens = 100;
  op.context_tokens = 300;
  OpTimes t;
  ex.Run([&] {
    OpId id = ex.Submit(op, {});
    ex.Wait(id);
    t = ex.Retire(id);
  });
  EXPECT_NEAR(t.end_s, ComputeSeconds(m, hw, op), 1e-15);
}

TEST(SimExecutorGolden, IdleUntilLetsBackgroundWorkFinish) {
  SimExecutor ex(Model(), Hw());
  bool done_before = true, done_after = false;
  Seconds now = 0;
  ex.Run([&] {
    OpId w = ex.Submit(Xfer(TransferKind::kSsdWrite, 2000000 - 160), {});  // 80us + ~1ms
    OpId h = ex.Submit(Xfer(TransferKind::kH2D, 25000), std::vector<OpId>{w});
    done_before = ex.Done(h);
    ex.IdleUntil(0.5);
    now = ex.Now();
    done_after = ex.Done(h);
  });
  EXPECT_FALSE(done_before);
  EXPECT_TRUE(done_after);
  EXPECT_DOUBLE_EQ(now, 0.5);
}

// ---- transfer strategies (core/transfer_strategy.h): one op each, times by hand ------------
//
// The load: rows {0,1,2,5,6} of a K chunk and {3,4} of a V chunk, 8 rows of 1 KiB per chunk:
// 3 runs, 7168 B needed, 16384 B of whole chunks. Costs: pcie 25 GB/s, 2 us per DMA call,
// 2.3 us per batched call + 1.1 us per descriptor, CPU gather 8 GB/s + 100 ns per run, a gather
// kernel reading host memory at 20 GB/s with a 20 us launch, 6% of the SMs.
HardwareOptions StrategyHw() {
  HardwareOptions h = Hw();
  h.pcie_latency = 2e-6;
  h.pcie_batch_latency = 2.3e-6;
  h.pcie_descriptor_cost = 1.1e-6;
  h.cpu_gather_bw = 8e9;
  h.cpu_gather_run_cost = 100e-9;
  h.gpu_gather_bw = 20e9;
  h.gpu_kernel_overhead = 20e-6;
  h.gpu_gather_sm_share = 0.06;
  return h;
}

RowOps StrategyOps(TransferStrategy s) {
  static const std::vector<std::uint16_t> a = {0, 1, 2, 5, 6}, b = {3, 4};
  RowOps o;
  AddRows(s, {ChunkId::Make(1, KvKind::kKey, 0, 0), KvKind::kKey, a, 2, 5 * 1024, 8192, false},
          false, &o);
  AddRows(s, {ChunkId::Make(1, KvKind::kValue, 0, 0), KvKind::kValue, b, 1, 2 * 1024, 8192,
              false},
          false, &o);
  FinishOps(s, &o);
  o.gather.kind = TransferKind::kCpuGather;
  o.h2d.kind = TransferKind::kH2D;
  return o;
}

// The end of the strategy's ops for the load above, submitted alone at time 0.
Seconds StrategyEnd(TransferStrategy s) {
  SimExecutor ex(Model(), StrategyHw());
  RowOps o = StrategyOps(s);
  Seconds end = -1;
  ex.Run([&] {
    std::vector<OpId> after;
    if (o.gather.bytes > 0) after.push_back(ex.Submit(o.gather, {}));
    const OpId h2d = ex.Submit(o.h2d, after);
    ex.Wait(h2d);
    for (OpId id : after) ex.Retire(id);
    end = ex.Retire(h2d).end_s;
  });
  return end;
}

TEST(SimExecutorGolden, PerRowPaysOneDmaCallPerRun) {
  // 7168 B / 25 GB/s = 0.28672 us, + 3 runs * 2 us.
  EXPECT_NEAR(StrategyEnd(TransferStrategy::kPerRow), 0.28672e-6 + 6e-6, 1e-12);
}

TEST(SimExecutorGolden, PerChunkMovesWholeChunksOneDmaEach) {
  // 16384 B / 25 GB/s = 0.65536 us, + 2 chunks * 2 us.
  EXPECT_NEAR(StrategyEnd(TransferStrategy::kPerChunk), 0.65536e-6 + 4e-6, 1e-12);
}

TEST(SimExecutorGolden, StagedGatherGathersRunsThenOneDmaPerKind) {
  // Gather: 7168 B / 8 GB/s = 0.896 us + 3 runs * 100 ns = 1.196 us; then the copy:
  // 0.28672 us + 2 regions (K, V) * 2 us = 4.28672 us.
  EXPECT_NEAR(StrategyEnd(TransferStrategy::kStagedGather), 1.196e-6 + 4.28672e-6, 1e-12);
}

TEST(SimExecutorGolden, BatchedPaysOneCallAndEachDescriptor) {
  // 0.28672 us + 1 call * 2.3 us + 3 descriptors * 1.1 us.
  EXPECT_NEAR(StrategyEnd(TransferStrategy::kBatched), 0.28672e-6 + 2.3e-6 + 3.3e-6, 1e-12);
}

TEST(SimExecutorGolden, DeviceGatherReadsAtTheSlowerOfLinkAndKernel) {
  // 7168 B / min(25, 20) GB/s = 0.3584 us, + one 20 us launch.
  EXPECT_NEAR(StrategyEnd(TransferStrategy::kDeviceGather), 0.3584e-6 + 20e-6, 1e-12);
}

TEST(SimExecutorGolden, ExtentReadPaysOneIoPerMergedExtent) {
  // Rows {0-3, 10, 12, 40} of a 64 KiB chunk of 1 KiB rows: extents [0, 4K), [8K, 16K),
  // [40K, 44K) (core/transfer_strategy_test), 16384 B in 3 I/Os: one wave at QD 32.
  std::vector<Extent> extents;
  const std::vector<std::uint16_t> rows = {0, 1, 2, 3, 10, 12, 40};
  const Bytes bytes = AppendExtents(rows, 1024, 65536, &extents);
  ASSERT_EQ(extents.size(), 3u);
  SimExecutor ex(Model(), Hw());
  OpTimes t;
  ex.Run([&] {
    OpId id = ex.Submit(Xfer(TransferKind::kSsdRead, bytes, std::uint32_t(extents.size())), {});
    ex.Wait(id);
    t = ex.Retire(id);
  });
  EXPECT_NEAR(t.end_s, 80e-6 + 16384 / 5e9, 1e-12);  // 83.2768 us
}

TEST(SimExecutorGolden, DeviceGatherSlowsOverlappingComputeByItsSmShare) {
  // A compute step of C seconds and the device gather above (G = 20.3584 us) start together:
  // for G the compute runs at 1 - 0.06, then at full speed, so it ends at
  // G + (C - 0.94 G) = C + 0.06 G. The gather itself is not slowed, and compute that starts
  // after it ends is not slowed either.
  ModelSpec m = Model();
  const HardwareOptions hw = StrategyHw();
  SimExecutor ex(m, hw);
  ComputeOp op;
  op.kind = ComputeKind::kLayerPrefill;
  op.layer = 0;
  op.new_tokens = 1000;
  op.context_tokens = 3000;
  const Seconds c = ComputeSeconds(m, hw, op);  // ~0.3 ms
  const Seconds g = 0.3584e-6 + 20e-6;
  ASSERT_GT(c, g);
  OpTimes gather, overlapped, after;
  ex.Run([&] {
    const RowOps o = StrategyOps(TransferStrategy::kDeviceGather);
    OpId x = ex.Submit(o.h2d, {});
    OpId y = ex.Submit(op, {});
    OpId z = ex.Submit(op, std::vector<OpId>{y});
    ex.Wait(z);
    gather = ex.Retire(x), overlapped = ex.Retire(y), after = ex.Retire(z);
  });
  EXPECT_NEAR(gather.end_s, g, 1e-12);
  EXPECT_NEAR(overlapped.end_s, c + 0.06 * g, 1e-12);
  EXPECT_NEAR(after.end_s - after.start_s, c, 1e-12);
}

}  // namespace
}  // namespace kvtier::sim
