// Transfer strategies on the hw path (DESIGN-14, docs/hw-mode.md): what HwExecutor asks the
// device backend to do for each kind of op, counted at the DeviceBackend interface with a
// DeviceBackendWrapper -- one piece per DMA call, one descriptor per run in ONE batched call,
// ONE device-gather call over the runs, one memcpy per run in a CPU gather, one SSD read per
// extent -- and that the bytes moved are the selected rows' bytes, from CPU-cache slots or from
// the SSD read buffers. Backend level: the host backend's batched copy and device gather move
// the same bytes to the same places as per-row copies and as the CPU reference, paced as the
// simulator charges them.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "hw/chunk_store.h"
#include "hw/device_backend.h"
#include "hw/hw_executor.h"
#include "kernels/reference.h"
#include "tests/hw/backend_recorder.h"
#include "tests/hw/hw_test_util.h"

namespace kvtier::hw {
namespace {

using testing::ScratchDir;

// A model whose K/V row is 1 KiB, so a 16-token chunk (16 KiB) spans four 4 KiB extents.
ModelSpec WideModel() {
  ModelSpec m;
  m.name = "wide";
  m.family = ModelFamily::kLlama;
  m.layers = 2;
  m.hidden = 512;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 128;
  m.ffn = 1024;
  m.vocab = 100;
  m.dtype_bytes = 2;
  m.max_context = 4096;
  return m;
}
constexpr int kChunkTokens = 16;
constexpr Bytes kRow = 1024;                   // WideModel().KBytesPerTokenLayer()
constexpr Bytes kChunk = kChunkTokens * kRow;  // 16 KiB

// ---- backend level ------------------------------------------------------------------------

TEST(RowRuns, RunsSplitAtGapsAndShareTheBytesExactly) {
  const std::uint16_t rows[] = {0, 1, 2, 5, 6, 9};
  EXPECT_EQ(CountRowRuns(rows), 3u);
  EXPECT_EQ(CountRowRuns(std::span<const std::uint16_t>()), 0u);
  const std::uint16_t one[] = {7};
  EXPECT_EQ(CountRowRuns(one), 1u);
  std::vector<std::byte> src(16 * 100), dst(1000);
  std::vector<CopyPiece> pieces;
  // Whole rows of 100 bytes: runs of 3, 2 and 1 rows.
  Bytes n = AppendRunPieces(src.data(), src.size(), rows, 100, 600, dst.data(), dst.size(),
                            &pieces);
  EXPECT_EQ(n, 600u);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].src, src.data());
  EXPECT_EQ(pieces[0].bytes, 300u);
  EXPECT_EQ(pieces[1].src, src.data() + 500);
  EXPECT_EQ(pieces[1].dst, dst.data() + 300);
  EXPECT_EQ(pieces[1].bytes, 200u);
  EXPECT_EQ(pieces[2].src, src.data() + 900);
  EXPECT_EQ(pieces[2].bytes, 100u);
  // Some heads of each row (7 bytes shared by 6 rows): the runs still cover exactly 7 bytes.
  pieces.clear();
  n = AppendRunPieces(src.data(), src.size(), rows, 100, 7, dst.data(), dst.size(), &pieces);
  EXPECT_EQ(n, 7u);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].bytes + pieces[1].bytes + pieces[2].bytes, 7u);
  // A destination too small for the second run: only the first is appended.
  pieces.clear();
  n = AppendRunPieces(src.data(), src.size(), rows, 100, 600, dst.data(), 400, &pieces);
  EXPECT_EQ(n, 300u);
  EXPECT_EQ(pieces.size(), 1u);
}

DeviceBackendOptions HostOptions(bool pace) {
  DeviceBackendOptions o;
  o.model = WideModel();
  o.hardware.pcie_h2d_bw = 1e9;
  o.hardware.pcie_d2h_bw = 1e9;
  o.hardware.pcie_latency = 1e-3;
  o.hardware.pcie_batch_latency = 2e-3;
  o.hardware.pcie_descriptor_cost = 1e-3;
  o.hardware.gpu_gather_bw = 0.5e9;
  o.hardware.gpu_kernel_overhead = 3e-3;
  o.timer.emplace(o.model, o.hardware);
  o.pace_pcie = pace;
  return o;
}

std::vector<std::byte> Pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + seed * 7 + i / 251) & 0xFF);
  return v;
}

// The runs of `rows` of a 16-row source, as per-row copies would make them.
std::vector<CopyPiece> RunPieces(const std::vector<std::byte>& src, std::vector<std::byte>* dst,
                                 std::span<const std::uint16_t> rows) {
  std::vector<CopyPiece> pieces;
  AppendRunPieces(src.data(), src.size(), rows, kRow, rows.size() * kRow, dst->data(),
                  dst->size(), &pieces);
  return pieces;
}

TEST(HostBackendStrategies, BatchedAndDeviceGatherMoveWhatPerRowCopiesMove) {
  HostClock clock;
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateHostBackend(HostOptions(false), &clock, &b).ok());
  const std::vector<std::byte> src = Pattern(kChunk, 1);
  const std::uint16_t rows[] = {0, 1, 4, 5, 6, 10, 15};
  std::vector<std::byte> per_row(kChunk, std::byte{0xEE}), batched = per_row, gathered = per_row,
                         reference = per_row;
  Interval when;
  const std::vector<CopyPiece> p1 = RunPieces(src, &per_row, rows);
  ASSERT_EQ(p1.size(), 4u);
  ASSERT_TRUE(b->Copy(CopyDirection::kHostToDevice, p1, 4, {}, &when).ok());
  int released = 0;
  ASSERT_TRUE(b->CopyBatched(RunPieces(src, &batched, rows), [&] { ++released; }, &when).ok());
  ASSERT_TRUE(b->DeviceGather(RunPieces(src, &gathered, rows), [&] { ++released; }, &when).ok());
  EXPECT_EQ(released, 2);
  // The CPU reference of the gather kernel over the same runs.
  std::vector<kernels::CopyRun> runs;
  for (const CopyPiece& p : RunPieces(src, &reference, rows)) runs.push_back({p.dst, p.src, p.bytes});
  ASSERT_TRUE(kernels::GatherRunsRef(runs.data(), std::int64_t(runs.size())).ok());
  EXPECT_EQ(batched, per_row);
  EXPECT_EQ(gathered, per_row);
  EXPECT_EQ(reference, per_row);
  // The rows went back to back, in order; the rest is untouched.
  for (std::size_t i = 0; i < std::size(rows); ++i) {
    EXPECT_EQ(std::memcmp(per_row.data() + i * kRow, src.data() + rows[i] * kRow, kRow), 0) << i;
  }
  EXPECT_EQ(per_row[std::size(rows) * kRow], std::byte{0xEE});
}

// Pacing is the simulator's charge for one call (sim/sim_executor.cc): a batched call lasts at
// least bytes / h2d_bw + batch_latency + descriptors x descriptor_cost, a device gather bytes /
// min(h2d_bw, gather_bw) + kernel_overhead (lower bounds: pacing only slows a call down).
TEST(HostBackendStrategies, BatchedAndDeviceGatherArePacedAsTheSimulatorCharges) {
  HostClock clock;
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateHostBackend(HostOptions(true), &clock, &b).ok());
  const std::vector<std::byte> src = Pattern(kChunk, 2);
  std::vector<std::byte> dst(kChunk);
  const std::uint16_t rows[] = {0, 2, 4, 6, 8};  // 5 runs, 5 KiB
  Interval when;
  ASSERT_TRUE(b->CopyBatched(RunPieces(src, &dst, rows), {}, &when).ok());
  EXPECT_GE(when.end_s - when.start_s, 5 * kRow / 1e9 + 2e-3 + 5 * 1e-3);
  ASSERT_TRUE(b->DeviceGather(RunPieces(src, &dst, rows), {}, &when).ok());
  EXPECT_GE(when.end_s - when.start_s, 5 * kRow / 0.5e9 + 3e-3);
}

// A device gather takes SMs: modeled compute that overlaps it lasts its cost-model duration
// plus gpu.gather_sm_share of the overlap (the simulator's slower GPU while a gather runs).
TEST(HostBackendStrategies, ComputeOverlappingADeviceGatherIsSlowedByTheSmShare) {
  HostClock clock;
  DeviceBackendOptions o = HostOptions(true);
  o.hardware.gpu_gather_sm_share = 0.5;
  o.hardware.gpu_gather_bw = 20e3;  // the gather of 2 KiB below lasts >= 100 ms
  o.hardware.gpu_flops = 3e10;      // a compute step of some 20 ms
  o.timer.emplace(o.model, o.hardware);
  ComputeOp op;
  op.kind = ComputeKind::kLayerPrefill;
  op.new_tokens = 64;
  op.context_tokens = 256;
  const double d = o.timer->OpSeconds(op);
  ASSERT_GT(d, 5e-3);
  ASSERT_LT(d, 40e-3);  // stretched by at most half, it ends inside the gather
  std::unique_ptr<DeviceBackend> b;
  ASSERT_TRUE(CreateHostBackend(std::move(o), &clock, &b).ok());
  const std::vector<std::byte> src = Pattern(kChunk, 3);
  std::vector<std::byte> dst(kChunk);
  const std::uint16_t rows[] = {1, 3};
  Interval gather, compute;
  std::thread t([&] { ASSERT_TRUE(b->DeviceGather(RunPieces(src, &dst, rows), {}, &gather).ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the gather is running
  ASSERT_TRUE(b->Compute(op, clock.Now(), &compute).ok());
  t.join();
  const double overlap = std::max(0.0, std::min(gather.end_s, compute.end_s) -
                                           std::max(gather.start_s, compute.start_s));
  EXPECT_GT(overlap, 0.0);
  EXPECT_GE(compute.end_s - compute.start_s, d + 0.5 * overlap - 1e-4);
  // Without a gather running, the same step lasts about d (nothing stretched it).
  ASSERT_TRUE(b->Compute(op, clock.Now(), &compute).ok());
  EXPECT_GE(compute.end_s - compute.start_s, d);
}

// ---- HwExecutor: what each strategy's ops ask the backend to do ------------------------------

class StrategyOps : public ::testing::Test {
 protected:
  void SetUp() override { Open(true); }

  void Open(bool verify) {
    ex_.reset();
    HwExecutorOptions o;
    o.backend = BackendKind::kHost;
    o.store_dir = dir_.path();
    o.store_capacity = 16ull << 20;
    o.max_memory = 16ull << 20;
    o.verify = verify;
    o.chunk_tokens = kChunkTokens;
    o.probe_heads = 0;
    o.cpu_capacity = 8 * kChunk;
    o.gpu_capacity = 0;
    o.pace_pcie = false;
    o.wrap_backend = [this](std::unique_ptr<DeviceBackend> b) -> std::unique_ptr<DeviceBackend> {
      return std::make_unique<Recorder>(std::move(b), &calls_, &mu_);
    };
    const Status s = HwExecutor::Create(WideModel(), HardwareOptions{}, o, &ex_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // Chunk `c` of kind `kind` (layer 0, segment 5) stored on the SSD, and in the CPU tier
  // (content in its arena slot) when `cpu`.
  ChunkId Stored(std::uint32_t c, KvKind kind, bool cpu) {
    const ChunkId id = ChunkId::Make(5, kind, 0, c);
    if (cpu) ex_->OnResident(Tier::kCpu, id);
    EXPECT_TRUE(ex_->Prepopulate(id, kChunk, cpu).ok());
    return id;
  }

  static std::vector<std::byte> Content(ChunkId id) {
    std::vector<std::byte> b(kChunk);
    FillChunkContent(id, kChunk, b.data());
    return b;
  }
  // The bytes of `rows` of chunk `id`, back to back.
  static std::vector<std::byte> Rows(ChunkId id, std::span<const std::uint16_t> rows) {
    const std::vector<std::byte> all = Content(id);
    std::vector<std::byte> out;
    for (std::uint16_t r : rows) out.insert(out.end(), all.begin() + r * kRow, all.begin() + (r + 1) * kRow);
    return out;
  }

  Status Run(TransferOp op, std::vector<OpId> after = {}) {
    const OpId id = ex_->Submit(std::move(op), after);
    const Status s = ex_->Wait(id);
    ex_->Retire(id);
    return s;
  }
  std::vector<Call> TakeCalls() {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(calls_, {});
  }

  static TransferOp H2D(CopyMethod method, std::uint32_t ios, std::uint32_t descriptors) {
    TransferOp op;
    op.kind = TransferKind::kH2D;
    op.method = method;
    op.ios = ios;
    op.descriptors = descriptors;
    return op;
  }

  ScratchDir dir_;
  std::mutex mu_;
  std::vector<Call> calls_;
  std::unique_ptr<HwExecutor> ex_;
};

const std::vector<std::uint16_t> kRowsA = {0, 1, 2, 5, 6, 9};  // 3 runs
const std::vector<std::uint16_t> kRowsB = {3, 4, 15};          // 2 runs

// per_row: one DMA call per run, from the CPU-cache slots, the rows' bytes only.
TEST_F(StrategyOps, PerRowIsOneDmaPerRunFromTheCpuSlots) {
  const ChunkId a = Stored(0, KvKind::kKey, true), b = Stored(1, KvKind::kKey, true);
  TransferOp op = H2D(CopyMethod::kDma, 5, 0);
  op.chunks = {{a, kRowsA.size() * kRow, kRowsA, {}}, {b, kRowsB.size() * kRow, kRowsB, {}}};
  op.bytes = 9 * kRow;
  ASSERT_TRUE(Run(op).ok());
  const std::vector<Call> calls = TakeCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].what, Call::kCopy);
  EXPECT_EQ(calls[0].pieces, 5u);
  EXPECT_EQ(calls[0].copies, 5u);
  EXPECT_EQ(calls[0].bytes, op.bytes);
  std::vector<std::byte> want = Rows(a, kRowsA), rows_b = Rows(b, kRowsB);
  want.insert(want.end(), rows_b.begin(), rows_b.end());
  EXPECT_EQ(calls[0].moved, want);
}

// per_chunk: one DMA call per chunk, the whole stored chunk.
TEST_F(StrategyOps, PerChunkIsOneDmaPerWholeChunk) {
  const ChunkId a = Stored(0, KvKind::kKey, true), b = Stored(1, KvKind::kValue, true);
  TransferOp op = H2D(CopyMethod::kDma, 2, 0);
  op.chunks = {{a, kChunk, {}, {}}, {b, kChunk, {}, {}}};
  op.bytes = 2 * kChunk;
  ASSERT_TRUE(Run(op).ok());
  const std::vector<Call> calls = TakeCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].pieces, 2u);
  EXPECT_EQ(calls[0].bytes, 2 * kChunk);
  std::vector<std::byte> want = Content(a), cb = Content(b);
  want.insert(want.end(), cb.begin(), cb.end());
  EXPECT_EQ(calls[0].moved, want);
}

// batched: ONE batched call with a descriptor per run; device_gather: ONE gather call over the
// runs. Same bytes as per_row.
TEST_F(StrategyOps, BatchedAndDeviceGatherAreOneCallWithADescriptorPerRun) {
  const ChunkId a = Stored(0, KvKind::kKey, true), b = Stored(1, KvKind::kKey, true);
  std::vector<std::byte> want = Rows(a, kRowsA), rows_b = Rows(b, kRowsB);
  want.insert(want.end(), rows_b.begin(), rows_b.end());
  for (CopyMethod m : {CopyMethod::kBatched, CopyMethod::kDeviceGather}) {
    TransferOp op = H2D(m, 1, 5);
    op.chunks = {{a, kRowsA.size() * kRow, kRowsA, {}}, {b, kRowsB.size() * kRow, kRowsB, {}}};
    op.bytes = 9 * kRow;
    ASSERT_TRUE(Run(op).ok());
    const std::vector<Call> calls = TakeCalls();
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].what, m == CopyMethod::kBatched ? Call::kBatched : Call::kDeviceGather);
    EXPECT_EQ(calls[0].pieces, 5u);
    EXPECT_EQ(calls[0].bytes, op.bytes);
    EXPECT_EQ(calls[0].moved, want);
  }
}

// staged_gather: the gather is one memcpy per run, laying out each kind contiguously; the staged
// H2D is then one DMA per kind, of exactly those bytes.
TEST_F(StrategyOps, StagedGatherIsAMemcpyPerRunThenOneDmaPerKind) {
  const ChunkId k0 = Stored(0, KvKind::kKey, true), v0 = Stored(0, KvKind::kValue, true),
                k1 = Stored(1, KvKind::kKey, true);
  TransferOp gather;
  gather.kind = TransferKind::kCpuGather;
  gather.chunks = {{k0, kRowsA.size() * kRow, kRowsA, {}},
                   {v0, kRowsB.size() * kRow, kRowsB, {}},
                   {k1, kRowsB.size() * kRow, kRowsB, {}}};
  gather.ios = 3 + 2 + 2;
  gather.bytes = 12 * kRow;
  TransferOp h2d = H2D(CopyMethod::kDma, 2, 0);
  h2d.staged = true;
  h2d.chunks = gather.chunks;
  h2d.bytes = gather.bytes;
  const OpId g = ex_->Submit(gather, {});
  ASSERT_TRUE(Run(h2d, {g}).ok());
  ex_->Retire(g);
  const std::vector<Call> calls = TakeCalls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].what, Call::kGather);
  EXPECT_EQ(calls[0].pieces, 7u);
  EXPECT_EQ(calls[0].bytes, 12 * kRow);
  EXPECT_EQ(calls[1].what, Call::kCopy);
  EXPECT_EQ(calls[1].pieces, 2u);  // K, then V
  EXPECT_EQ(calls[1].copies, 2u);
  EXPECT_EQ(calls[1].bytes, 12 * kRow);
  // Region K: k0's rows then k1's; region V: v0's rows.
  std::vector<std::byte> want = Rows(k0, kRowsA), more = Rows(k1, kRowsB);
  want.insert(want.end(), more.begin(), more.end());
  more = Rows(v0, kRowsB);
  want.insert(want.end(), more.begin(), more.end());
  EXPECT_EQ(calls[1].moved, want);
  EXPECT_EQ(ex_->stats().staged_misses, 0u);
}

// A staged H2D that does not name its gather in `after` (it was retired before) finds the
// rows by chunk, still laid out back to back per kind: the same one DMA per kind.
TEST_F(StrategyOps, AStagedCopyFindsGatheredRowsByChunk) {
  const ChunkId k0 = Stored(0, KvKind::kKey, true), k1 = Stored(1, KvKind::kKey, true);
  TransferOp gather;
  gather.kind = TransferKind::kCpuGather;
  gather.chunks = {{k0, kRowsA.size() * kRow, kRowsA, {}}, {k1, kRowsB.size() * kRow, kRowsB, {}}};
  gather.ios = 5;
  gather.bytes = 9 * kRow;
  ASSERT_TRUE(Run(gather).ok());
  TransferOp h2d = H2D(CopyMethod::kDma, 1, 0);
  h2d.staged = true;
  h2d.chunks = gather.chunks;
  h2d.bytes = gather.bytes;
  ASSERT_TRUE(Run(h2d).ok());
  const std::vector<Call> calls = TakeCalls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].pieces, 1u);
  std::vector<std::byte> want = Rows(k0, kRowsA), more = Rows(k1, kRowsB);
  want.insert(want.end(), more.begin(), more.end());
  EXPECT_EQ(calls[1].moved, want);
  EXPECT_EQ(ex_->stats().staged_misses, 0u);
  // Rows nobody gathered (chunk 2): still one DMA of the kind's bytes, counted as a miss.
  const ChunkId k2 = Stored(2, KvKind::kKey, true);
  h2d.chunks = {{k2, kRowsA.size() * kRow, kRowsA, {}}};
  h2d.bytes = kRowsA.size() * kRow;
  ASSERT_TRUE(Run(h2d).ok());
  const std::vector<Call> more_calls = TakeCalls();
  ASSERT_EQ(more_calls.size(), 1u);
  EXPECT_EQ(more_calls[0].pieces, 1u);
  EXPECT_EQ(more_calls[0].bytes, h2d.bytes);
  EXPECT_EQ(ex_->stats().staged_misses, 1u);
}

// Rows of a chunk just read from the SSD come from the read buffer (the chunk is not cached).
TEST_F(StrategyOps, RowsOfAChunkReadFromTheSsdComeFromItsReadBuffer) {
  const ChunkId a = Stored(2, KvKind::kValue, false);
  TransferOp read;
  read.kind = TransferKind::kSsdRead;
  read.chunks = {{a, kChunk, {}, {}}};
  read.bytes = kChunk;
  read.ios = 1;
  const OpId r = ex_->Submit(read, {});
  TransferOp op = H2D(CopyMethod::kDma, 3, 0);
  op.chunks = {{a, kRowsA.size() * kRow, kRowsA, {}}};
  op.bytes = kRowsA.size() * kRow;
  ASSERT_TRUE(Run(op, {r}).ok());
  ex_->Retire(r);
  const std::vector<Call> calls = TakeCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].pieces, 3u);
  EXPECT_EQ(calls[0].moved, Rows(a, kRowsA));
  EXPECT_EQ(ex_->stats().ssd_reads, 1u);
  EXPECT_EQ(ex_->stats().chunks_verified, 1u);
}

// ssd_read_unit = extent: one read per extent, each landing at its offset in the chunk's buffer
// and checked there (every byte with verify); the rows then copy from the buffer intact.
TEST_F(StrategyOps, ExtentReadsAreOneIoPerExtentAndCheckTheirBytes) {
  const ChunkId a = Stored(3, KvKind::kKey, false);
  // Rows 0-1 (extent [0, 4K)) and 9-10 (extent [8K, 12K)): two I/Os.
  const std::vector<std::uint16_t> rows = {0, 1, 9, 10};
  TransferOp read;
  read.kind = TransferKind::kSsdRead;
  read.chunks = {{a, 8192, {}, {{0, 4096}, {8192, 4096}}}};
  read.bytes = 8192;
  read.ios = 2;
  const OpId r = ex_->Submit(read, {});
  TransferOp op = H2D(CopyMethod::kDma, 2, 0);
  op.chunks = {{a, rows.size() * kRow, rows, {}}};
  op.bytes = rows.size() * kRow;
  ASSERT_TRUE(Run(op, {r}).ok());
  ex_->Retire(r);
  const HwExecutorStats st = ex_->stats();
  EXPECT_EQ(st.ssd_reads, 2u);
  EXPECT_EQ(st.extents_read, 2u);
  EXPECT_EQ(st.extents_verified, 2u);
  EXPECT_EQ(st.chunks_read, 0u);
  EXPECT_EQ(st.bytes_read, 8192u);
  const std::vector<Call> calls = TakeCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].moved, Rows(a, rows));
}

TEST_F(StrategyOps, AnExtentOutsideTheChunkFailsTheReadNamingIt) {
  const ChunkId a = Stored(4, KvKind::kKey, false);
  TransferOp read;
  read.kind = TransferKind::kSsdRead;
  read.chunks = {{a, 4096, {}, {{16384, 4096}}}};  // past the chunk's 16 KiB
  read.bytes = 4096;
  read.ios = 1;
  const Status s = Run(read);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(DescribeChunk(a)), std::string::npos) << s.message();
}

// With verify, an extent read checks its bytes: a corrupted byte inside the extent read fails
// the op naming the chunk and the byte; one outside the extents read is not seen. (The bytes
// change under the open executor: a store reopened after the change would drop the chunk on
// its CRC-32C, hw/chunk_store.h.)
TEST_F(StrategyOps, VerifyChecksTheExtentsReadNotTheWholeChunk) {
  const ChunkId a = Stored(6, KvKind::kKey, false);
  {  // where the chunk is (a second handle on the intact store), then corrupt byte 9000 of it
     // (inside [8K, 12K))
    ChunkStoreOptions so;
    so.dir = dir_.path();
    so.capacity_bytes = 16ull << 20;
    std::unique_ptr<ChunkStore> store;
    ASSERT_TRUE(ChunkStore::Open(so, &store).ok());
    const std::optional<ChunkLocation> where = store->Lookup(a);
    ASSERT_TRUE(where.has_value());
    store.reset();
    UniqueFd fd(::open((dir_.path() + "/chunks.dat").c_str(), O_RDWR));
    ASSERT_GE(fd.get(), 0);
    std::byte b{};
    ASSERT_EQ(::pread(fd.get(), &b, 1, off_t(where->offset + 9000)), 1);
    b ^= std::byte{0x5A};
    ASSERT_EQ(::pwrite(fd.get(), &b, 1, off_t(where->offset + 9000)), 1);
  }
  auto read = [&](Bytes offset) {
    TransferOp op;
    op.kind = TransferKind::kSsdRead;
    op.chunks = {{a, 4096, {}, {{offset, 4096}}}};
    op.bytes = 4096;
    op.ios = 1;
    return Run(op);
  };
  EXPECT_TRUE(read(0).ok());
  const Status s = read(8192);
  EXPECT_EQ(s.code(), Status::Code::kIoError);
  EXPECT_NE(s.message().find(DescribeChunk(a) + ": content check failed at byte 9000"),
            std::string::npos)
      << s.message();
}

TEST(ChunkContent, RangeCheckMatchesTheContentAndFindsEveryByte) {
  const ChunkId id = ChunkId::Make(1, KvKind::kValue, 5, 6);
  std::vector<std::byte> b(10003);
  FillChunkContent(id, b.size(), b.data());
  EXPECT_TRUE(CheckChunkRange(id, b.size(), b.data(), 0, b.size(), true).ok());
  EXPECT_TRUE(CheckChunkRange(id, b.size(), b.data(), 4096, 20000, true).ok());  // clamped
  for (Bytes at : {Bytes(3), Bytes(9), Bytes(4100), Bytes(10002)}) {
    std::vector<std::byte> c = b;
    c[at] ^= std::byte{1};
    const Status s = CheckChunkRange(id, c.size(), c.data(), 0, c.size(), true);
    EXPECT_FALSE(s.ok()) << at;
    EXPECT_NE(s.message().find("at byte " + std::to_string(at)), std::string::npos) << s.message();
    // A range that does not hold the byte does not see it.
    EXPECT_TRUE(CheckChunkRange(id, c.size(), c.data(), at + 1, c.size(), true).ok()) << at;
  }
  // Without verify, only the range's first 16 bytes are compared.
  std::vector<std::byte> c = b;
  c[4096 + 20] ^= std::byte{1};
  EXPECT_TRUE(CheckChunkRange(id, c.size(), c.data(), 4096, 8192, false).ok());
  c[4096 + 3] ^= std::byte{1};
  EXPECT_FALSE(CheckChunkRange(id, c.size(), c.data(), 4096, 8192, false).ok());
}

}  // namespace
}  // namespace kvtier::hw
