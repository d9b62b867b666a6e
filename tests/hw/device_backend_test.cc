// DeviceBackend (hw/device_backend.h): the host implementation's memory, copies, gathers and
// compute, and the choice of backend.

#include "hw/device_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
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

// Row r of a chunk is `row_bytes` at r * stride; the pieces stop at the first row that does not
// fit in the source or the destination.
TEST(DeviceBackend, RowPiecesStopAtTheFirstRowThatDoesNotFit) {
  std::vector<std::byte> src(64), dst(24);
  std::vector<CopyPiece> pieces;
  const std::uint16_t rows[] = {1, 3, 7, 2};
  // 16-byte rows, 8 bytes each taken: rows 1 and 3 fit, row 7 (offset 112) is past the source.
  Bytes n = AppendRowPieces(src.data(), src.size(), rows, 16, 8, dst.data(), dst.size(), &pieces);
  EXPECT_EQ(n, 16u);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].src, src.data() + 16);
  EXPECT_EQ(pieces[1].src, src.data() + 48);
  EXPECT_EQ(pieces[1].dst, dst.data() + 8);
  // The destination holds only two rows of 12.
  pieces.clear();
  const std::uint16_t two_fit[] = {0, 1, 2};
  n = AppendRowPieces(src.data(), src.size(), two_fit, 16, 12, dst.data(), dst.size(), &pieces);
  EXPECT_EQ(n, 24u);
  EXPECT_EQ(pieces.size(), 2u);
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
  ASSERT_TRUE(b->Compute(op, &when).ok());
  EXPECT_GE(when.end_s - when.start_s, timer.OpSeconds(op));
}

}  // namespace
}  // namespace kvtier::hw
