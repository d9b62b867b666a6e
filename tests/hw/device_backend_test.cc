// DeviceBackend (hw/device_backend.h): the host implementation's memory, copies, gathers and
// compute; the choice of backend; and fault injection at the interface: a backend that fails
// one copy makes that operation fail in HwExecutor, and the Pipeline's run with it.

#include "hw/device_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <ostream>
#include <vector>

#include "core/pipeline.h"
#include "hw/hw_executor.h"
#include "tests/hw/executor_fixture.h"
#include "tests/hw/hw_test_util.h"

namespace kvtier::hw {
namespace {

using namespace kvtier::hw::fixture;  // NOLINT: test helpers
using testing::ScratchDir;

DeviceBackendOptions HostOptions(bool pace) {
  DeviceBackendOptions o;
  o.model = TinyModel();
  o.hardware.pcie_h2d_bw = 1e9;
  o.hardware.pcie_d2h_bw = 1e9;
  o.hardware.pcie_latency = 1e-3;
  o.timer.emplace(o.model, o.hardware);
  o.pace_pcie = pace;
  return o;
}

TEST(DeviceBackend, AutoIsTheHostBackendWithoutADeviceAndCudaIsAnError) {
  if (CudaDevicePresent()) GTEST_SKIP() << "a CUDA device is present";
  HostClock clock;
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateDeviceBackend(BackendKind::kAuto, HostOptions(true), &clock, &b).ok());
  EXPECT_EQ(b->kind(), BackendKind::kHost);
  const Status s = CreateDeviceBackend(BackendKind::kCuda, HostOptions(true), &clock, &b);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("hw.backend = host or auto"), std::string::npos) << s.ToString();
}

TEST(DeviceBackend, HostMemoryIsPlainAndDeviceMemoryIsASeparateMapping) {
  HostClock clock;
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateHostBackend(HostOptions(true), &clock, &b).ok());
  std::unique_ptr<HostArena> host;
  ASSERT_TRUE(b->AllocateHost({8192, 2, false, true}, &host).ok());
  EXPECT_FALSE(host->pinned());  // memcpy needs no pinning
  std::unique_ptr<DeviceArena> dev;
  ASSERT_TRUE(b->AllocateDevice(1000, 3, &dev).ok());
  EXPECT_TRUE(dev->on_host());
  EXPECT_EQ(dev->slot_bytes(), DeviceArena::SlotStride(1000));
  std::vector<std::byte> src(1000, std::byte{0x5A});
  ASSERT_TRUE(b->WriteDevice(dev->slot(2), src.data(), src.size()).ok());
  EXPECT_EQ(dev->slot(2)[999], std::byte{0x5A});
}

// A host copy moves every piece, releases the buffers once, before its pacing wait, and lasts at
// least bytes / bw + copies x latency (pacing only slows a copy down).
TEST(DeviceBackend, HostCopyMovesThePiecesReleasesOnceAndIsPaced) {
  HostClock clock;
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateHostBackend(HostOptions(true), &clock, &b).ok());
  std::vector<std::byte> a(4096), c(4096, std::byte{0});
  std::iota(reinterpret_cast<unsigned char*>(a.data()),
            reinterpret_cast<unsigned char*>(a.data()) + a.size(), 0);
  const CopyPiece pieces[] = {{c.data(), a.data(), 1000}, {c.data() + 2000, a.data() + 100, 0},
                              {c.data() + 3000, a.data() + 3000, 1096}};
  int released = 0;
  Interval when;
  const Status s =
      b->Copy(CopyDirection::kHostToDevice, pieces, 2, [&] { ++released; }, &when);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(released, 1);
  EXPECT_EQ(std::memcmp(c.data(), a.data(), 1000), 0);
  EXPECT_EQ(c[2000], std::byte{0});  // a 0-byte piece copies nothing
  EXPECT_EQ(std::memcmp(c.data() + 3000, a.data() + 3000, 1096), 0);
  EXPECT_GE(when.end_s - when.start_s, 2096 / 1e9 + 2 * 1e-3);
  // Gathers copy host memory the same way.
  std::vector<std::byte> g(8);
  const CopyPiece rows[] = {{g.data(), a.data() + 10, 4}, {g.data() + 4, a.data() + 20, 4}};
  ASSERT_TRUE(b->Gather(rows).ok());
  EXPECT_EQ(g[0], std::byte{10});
  EXPECT_EQ(g[4], std::byte{20});
}

TEST(DeviceBackend, HostModeledComputeLastsTheCostModelsDuration) {
  HostClock clock;
  DeviceBackendOptions o = HostOptions(true);
  const ComputeTimer timer = *o.timer;
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateHostBackend(std::move(o), &clock, &b).ok());
  ComputeOp op;
  op.kind = ComputeKind::kLayerPrefill;
  op.new_tokens = 64;
  op.context_tokens = 256;
  Interval when;
  ASSERT_TRUE(b->Compute(op, clock.Now(), &when).ok());
  EXPECT_GE(when.end_s - when.start_s, timer.OpSeconds(op));
}

// The hand-off into the compute lane stands in for the step's launch (gpu.kernel_overhead, which
// kvtier calibrate measures as that hand-off on this backend). A step of ~0 work and a 20 ms
// launch: ready 10 ms before it started -> it ends 20 ms after it became ready, 10 ms after it
// started; ready 50 ms before (a hand-off longer than the launch) -> it ends at once (its ~0
// work); ready as it starts -> the whole 20 ms. Sleeps end no sooner than asked, so the upper
// bounds leave room.
TEST(DeviceBackend, HostModeledComputeCountsTheHandOffAsTheLaunch) {
  HostClock clock;
  DeviceBackendOptions o = HostOptions(true);
  o.hardware.gpu_flops = 1e18;  // the step's work ~0: d = the launch overhead
  o.hardware.gpu_mem_bw = 1e18;
  o.hardware.gpu_kernel_overhead = 0.020;
  o.timer.emplace(o.model, o.hardware);
  ComputeOp op;
  op.kind = ComputeKind::kLayerPrefill;
  op.new_tokens = 1;
  op.context_tokens = 1;
  const double d = o.timer->OpSeconds(op);
  ASSERT_NEAR(d, 0.020, 1e-6);
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateHostBackend(std::move(o), &clock, &b).ok());
  Interval when;
  // Ready 10 ms ago: ends d after that, 10 ms after it started (the hand-off paid the rest).
  ASSERT_TRUE(b->Compute(op, clock.Now() - 0.010, &when).ok());
  EXPECT_GE(when.end_s - when.start_s, 0.010 - 1e-4);
  EXPECT_LT(when.end_s - when.start_s, 0.019);
  // Ready 50 ms ago: the launch is all hidden, the work (~0) remains.
  ASSERT_TRUE(b->Compute(op, clock.Now() - 0.050, &when).ok());
  EXPECT_LT(when.end_s - when.start_s, 0.009);
  // Ready now: the whole d.
  ASSERT_TRUE(b->Compute(op, clock.Now(), &when).ok());
  EXPECT_GE(when.end_s - when.start_s, d - 1e-4);
}

// Fault injection at the backend: the second call of one kind -- an H2D or D2H copy, a
// gather, a compute step -- fails with a CUDA error, as a failed cudaMemcpyAsync or kernel
// launch would. The op that made the call fails with that error (a failed copy or gather is
// the only failed transfer in the run log), what depends on it is aborted and moved nothing,
// and the Pipeline fails the request (or, for a background copy, the run at Finish) with the
// error annotated with the op: the status a driver records as the failed run and turns into
// exit 3 (issue 12; tests/hw/hw_cli_test.cc checks that path end to end).
enum class Fault { kH2D, kD2H, kGather, kCompute };

struct FaultCase {
  Fault fault;
  const char* system;
  Bytes gpu, cpu;
  const char* op_name;  // how the failure names the op (DescribeOp)
  friend void PrintTo(const FaultCase& c, std::ostream* os) {
    *os << c.op_name << " fails in " << c.system;
  }
};

class FailNth : public DeviceBackendWrapper {
 public:
  FailNth(std::unique_ptr<DeviceBackend> target, Fault fault, int n, int* calls)
      : DeviceBackendWrapper(std::move(target)), fault_(fault), n_(n), calls_(calls) {}

  Status Copy(CopyDirection direction, std::span<const CopyPiece> pieces, std::uint32_t copies,
              const std::function<void()>& release, Interval* when) override {
    const Fault f = direction == CopyDirection::kHostToDevice ? Fault::kH2D : Fault::kD2H;
    if (Hit(f)) {
      if (release) release();  // the contract: buffers are handed back when the copy failed
      *when = {};
      return Injected();
    }
    return DeviceBackendWrapper::Copy(direction, pieces, copies, release, when);
  }
  Status Gather(std::span<const CopyPiece> pieces) override {
    if (Hit(Fault::kGather)) return Injected();
    return DeviceBackendWrapper::Gather(pieces);
  }
  Status Compute(const ComputeOp& op, Seconds ready_s, Interval* when) override {
    if (Hit(Fault::kCompute)) {
      *when = {};
      return Injected();
    }
    return DeviceBackendWrapper::Compute(op, ready_s, when);
  }

 private:
  bool Hit(Fault f) { return f == fault_ && ++*calls_ == n_; }
  static Status Injected() {
    return Status::CudaError("injected: an illegal memory access was encountered");
  }
  Fault fault_;
  int n_;
  int* calls_;  // calls of the faulted kind so far (lanes are serial per kind)
};

class BackendFault : public ::testing::TestWithParam<FaultCase> {};

TEST_P(BackendFault, FailsItsOperationAndTheRun) {
  const FaultCase& fc = GetParam();
  ScratchDir dir;
  const SystemOptions sys = System(fc.system, fc.gpu, fc.cpu);
  HwExecutorOptions o = Options(dir.path(), sys);
  int calls = 0;
  o.wrap_backend = [&](std::unique_ptr<DeviceBackend> b) -> std::unique_ptr<DeviceBackend> {
    return std::make_unique<FailNth>(std::move(b), fc.fault, 2, &calls);
  };
  std::unique_ptr<HwExecutor> ex;
  ASSERT_TRUE(HwExecutor::Create(TinyModel(), HardwareOptions{}, o, &ex).ok());
  MemoryRunLog log;
  ScriptedScores scores(Agreeing);
  PipelineOptions po;
  po.system = sys;
  Pipeline pipeline(TinyModel(), po, ex.get(), &scores, &log);
  Status failure;
  for (const Request& r : Requests()) {
    failure = pipeline.Run(r);
    if (!failure.ok()) break;
  }
  const Status finish = pipeline.Finish();
  if (failure.ok()) failure = finish;
  ex->Drain();
  ASSERT_GE(calls, 2) << "the scenario must make the faulted call twice";
  ASSERT_FALSE(failure.ok()) << "the run must fail";
  EXPECT_EQ(failure.code(), Status::Code::kCudaError) << failure.ToString();
  EXPECT_NE(failure.ToString().find(std::string(fc.op_name) + " ("), std::string::npos)
      << failure.ToString();
  EXPECT_NE(failure.ToString().find("injected: an illegal memory access"), std::string::npos);
  // A copy or gather of chunks names them (the device's own text does not); the store's D2H
  // moves bytes that are no chunk yet.
  if (fc.fault == Fault::kH2D || fc.fault == Fault::kGather) {
    EXPECT_NE(failure.ToString().find(": chunk 0x"), std::string::npos) << failure.ToString();
  }
  int failed = 0;
  for (const TransferRecord& t : log.transfers) {
    if (t.outcome == TransferOutcome::kFailed) {
      ++failed;
      EXPECT_EQ(TransferKindName(t.kind), fc.op_name);
    }
    if (t.outcome == TransferOutcome::kAborted) {
      EXPECT_EQ(t.bytes, 0u);
    }
  }
  // The log holds transfers only: a failed compute step shows in the failure alone.
  EXPECT_EQ(failed, fc.fault == Fault::kCompute ? 0 : 1);
}

INSTANTIATE_TEST_SUITE_P(
    AtTheInterface, BackendFault,
    ::testing::Values(FaultCase{Fault::kH2D, "as", 0, 0, "h2d"},
                      FaultCase{Fault::kD2H, "as", 1024, 4096, "d2h"},
                      FaultCase{Fault::kGather, "spec", 0, 0, "cpu_gather"},
                      FaultCase{Fault::kCompute, "as", 0, 0, "layer_prefill"}),
    [](const ::testing::TestParamInfo<FaultCase>& info) {
      switch (info.param.fault) {
        case Fault::kH2D: return std::string("H2D");
        case Fault::kD2H: return std::string("D2H");
        case Fault::kGather: return std::string("Gather");
        case Fault::kCompute: return std::string("Compute");
      }
      return std::string("?");
    });

}  // namespace
}  // namespace kvtier::hw
