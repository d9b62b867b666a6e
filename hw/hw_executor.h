#pragma once
// HwExecutor: core's Executor on real storage, real memory and (with CUDA) a real device. The
// Pipeline decides what moves; this executor moves the bytes and says when it happened, in host
// CLOCK_MONOTONIC seconds since the executor's clock was (re)started (notes/hw-path.md 6.2-6.6).
//
//   SSD read   O_DIRECT reads of each ChunkIo::chunk from the ChunkStore through the IoEngine
//              (class from the purpose: demand/cake_load -> demand, probe -> probe, everything
//              else -> prefetch), into the chunk's CPU-cache arena slot when the cache placed it
//              in the CPU tier, else into a staging ring slot. Every chunk read is checked: its
//              header (chunk id, length) and its CRC-32C against the store's record always,
//              every byte against the chunk's content with `verify`. A chunk that lists
//              extents (transfer.ssd_read_unit = extent) is read as one request per extent,
//              each landing at its offset in the chunk's buffer; each extent is checked: its
//              first bytes always (the header when it starts the chunk), every byte with
//              `verify`. A chunk not in the store (NotFound), an extent past the chunk's stored
//              bytes (InvalidArgument), an I/O error or a short read (IoError with the errno
//              text), or a content mismatch fails the op, naming the chunk.
//   SSD write  ChunkStore::Put of each chunk's deterministic content (FillChunkContent), on a
//              writer thread, one op at a time in the order they became ready (the simulator's
//              ssd.write_lanes = 1). Stores and repacks are paced to ssd.background_share of
//              the profile's ssd.write_bw, the simulator's cap on background SSD traffic (each
//              put ends no earlier than the op's bytes so far take at that rate). Reads of a chunk whose store is still pending wait for it (an
//              implicit read-after-write dependency the Pipeline does not need to know about).
//              The first put that fails -- the store is full (OutOfSpace naming the chunk and
//              the capacity), or an I/O error -- fails the op and the rest is not written; a
//              read of a chunk it did not write is aborted naming that failure (core/executor.h
//              "Failure"), until the chunk is stored again.
//   CPU gather the selected rows of the op's chunks, one memcpy per run of consecutive rows,
//              into the gather ring: one contiguous region per kind (what a staged H2D copies).
//   decode     the decode batch's ops (core/decode_engine.h) list no chunks: its offloads,
//              top-k gathers and fetches move rows of the decode home, the CPU memory that
//              holds the decoded sequence's 16-bit KV (hw/decode_home.h: which rows, where).
//   H2D / D2H  the pieces DESIGN-14 fixes per transfer strategy (docs/hw-mode.md): one per
//              run of rows (per_row), per whole chunk (per_chunk, promotions, demotions), per
//              kind of a staged op (staged_gather); a kBatched op is ONE batched call with a
//              descriptor per run, a kDeviceGather op ONE gather kernel over the runs. host
//              backend: memcpy into / out of a separate "device" arena (never one small hot
//              buffer), paced to what the simulator charges for the call when `pace_pcie`
//              (pacing can only slow a copy down). cuda backend: cudaMemcpyAsync /
//              cudaMemcpyBatchAsync / a gather kernel over mapped pinned memory on a dedicated
//              stream, timed with CUDA events.
//   compute    host backend: `modeled` sleeps the cost model's duration (ComputeTimer of
//              models/layer_table.h: the roofline, or the measured gpu.layer_table), `real`
//              runs Eigen GEMMs and attention at the model's shapes (random weights). cuda
//              backend: cuBLAS GEMMs at the model's shapes plus the attention kernel.
// What differs between the host and the CUDA device -- memory, copies, gathers, compute and
// their timestamps -- is a DeviceBackend (hw/device_backend.h); this executor only schedules.
//
// Failures follow the Executor contract: an op whose dependency failed is completed at once,
// without running, with Status::Aborted naming the root failure; Retire reports every op's
// status. `hw.store_capacity` too small for one chunk is rejected by Create (InvalidArgument).
//
// Each resource is a persistent worker thread serving a FIFO (H2D, D2H, CPU, compute, writer);
// the IoEngine has its own thread(s). An op is queued on its resource once every op in `after`
// has completed (a completion releases its dependents from whichever thread completed it; the
// dependency graph is core/op_graph.h, the one SimExecutor uses too). No
// device-wide synchronisation happens inside the pipeline: the cuda lanes wait on their own
// events only.
//
// Residency: OnResident/OnEvicted keep a slot per chunk in the CPU-cache arena and the device
// arena. The arenas are sized from cache.cpu_capacity / cache.gpu_capacity, capped together
// with the rings by `max_memory`; a chunk the cache places beyond an arena's slots is counted
// as an overflow (metric) and its bytes come from a staging slot instead. A CPU slot has one
// writer at a time (the SSD read bringing its chunk, or a demotion copy): a second one writes
// to staging instead, and a slot whose chunk leaves the CPU tier is freed once its writer is
// done, so a read's content check sees what the read brought. A staging piece the ring wrapped
// past while its read was queued is not checked (counted in staging_reused).
//
// Thread safety: the Executor methods are called from the one thread driving the Pipeline;
// internally the executor is multi-threaded.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/options.h"
#include "core/status.h"
#include "hw/device_backend.h"
#include "hw/io_engine.h"

namespace kvtier::hw {

class FaultInjector;

struct HwExecutorOptions {
  BackendKind backend = BackendKind::kAuto;
  ComputeMode compute = ComputeMode::kModeled;
  IoEngineOptions::Backend io_backend = IoEngineOptions::Backend::kAuto;
  std::string store_dir;                // chunk store directory (created); must be a real disk
  Bytes store_capacity = 4ull << 30;    // chunk store data file size
  bool allow_buffered = false;          // accept a file system without O_DIRECT (recorded)
  bool store_sync = false;              // fdatasync every chunk put (ChunkStore sync)
  Bytes max_memory = 1ull << 30;        // cap on all arenas together
  Bytes ring_bytes = 64ull << 20;       // each of the staging, gather and device working rings
  bool pace_pcie = true;                // host backend: pace copies to the configured link
  bool verify = false;                  // check every byte of every chunk read
  std::uint32_t queue_depth = 32;       // I/Os in flight (ssd.queue_depth)
  int chunk_tokens = 64;                // cache.chunk_tokens
  int probe_heads = 3;                  // itf.probe_heads
  Bytes cpu_capacity = 0;               // cache.cpu_capacity
  Bytes gpu_capacity = 0;               // cache.gpu_capacity
  // Decode (decode.policy): positions per layer of the decode home, the CPU memory holding the
  // decoded sequence's 16-bit KV (hw/decode_home.h), counted in max_memory. 0: a home of one
  // position (a run that does not decode moves no decode bytes).
  std::int64_t decode_home_tokens = 0;
  // Tests: wraps the backend Create made (DeviceBackendWrapper), e.g. to fail one copy.
  std::function<std::unique_ptr<DeviceBackend>(std::unique_ptr<DeviceBackend>)> wrap_backend;
  // Fault injection (hw.fault_injection; hw/fault_injection.h): when set, the I/O engine, the
  // chunk store's writes and the device backend go through it. Null in a normal run.
  std::shared_ptr<FaultInjector> faults;
};

// What the executor did, for the run's metrics and the tests.
struct HwExecutorStats {
  std::uint64_t chunks_read = 0;
  std::uint64_t chunks_written = 0;
  std::uint64_t bytes_read = 0;       // bytes the SSD delivered (extent-rounded)
  std::uint64_t bytes_written = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t bytes_gathered = 0;
  // Chunks a promotion copied into the GPU tier, a demotion out of it (H2D with purpose
  // promote, D2H with purpose demote; copies that list no chunks move none).
  std::uint64_t promoted_chunks = 0;
  std::uint64_t demoted_chunks = 0;
  std::uint64_t chunks_verified = 0;  // reads whose content was checked in full
  std::uint64_t crc_checked = 0;      // whole-chunk reads checked against the store's CRC-32C
  std::uint64_t cpu_overflow = 0;     // chunks resident in the CPU tier without an arena slot
  std::uint64_t gpu_overflow = 0;
  std::uint64_t raw_waits = 0;        // reads that waited for a pending store of their chunk
  std::uint64_t staging_reused = 0;   // staged bytes overwritten before a consumer copied them
  // SSD read requests issued for chunks (one io_uring / pread request each): whole chunks, and
  // extents of chunks read in part (transfer.ssd_read_unit = extent; not counted in
  // chunks_read). Bytes-only reads (repacks) are not counted.
  std::uint64_t ssd_reads = 0;
  std::uint64_t extents_read = 0;
  std::uint64_t extents_verified = 0;  // extents whose every byte was checked (verify)
  // Staged H2D kinds whose rows were not laid out contiguously by a gather (a stand-in piece
  // moved the bytes; 0 unless a planner breaks the staged contract).
  std::uint64_t staged_misses = 0;
  // Copies and gathers of a chunk whose bytes were nowhere in host memory (no CPU slot, no read
  // buffer): a staging piece stood in (timing kept, content not).
  std::uint64_t source_standins = 0;
  std::uint64_t compute_ops = 0;
  double compute_busy_s = 0;
  // The driving thread (the one calling Wait, WaitAny and IdleUntil): time between returning
  // from one of them and entering the next (planning, submitting, logging: work the simulator
  // charges no time for), the waits that blocked, and for those the time from the op's end to
  // the thread running again (its wake-up).
  double driver_awake_s = 0;
  std::uint64_t driver_ops = 0;  // ops it submitted (cpu.driver_op_cost = awake / ops)
  std::uint64_t driver_blocked_waits = 0;
  double driver_wake_s = 0;
  // Decode: offloads that wrapped past the end of the decode home (hw/decode_home.h).
  std::uint64_t decode_home_wraps = 0;
};

// Deterministic content of chunk `id` of `length` bytes: word 0 is the id, word 1 the length,
// the rest a function of (id, word index). Used by writes, prewarm and read verification.
void FillChunkContent(ChunkId id, Bytes length, std::byte* dst);
// OK when `data` holds chunk `id`'s content (only the two header words unless `full`);
// otherwise IoError naming the chunk and the first differing byte.
Status CheckChunkContent(ChunkId id, Bytes length, const std::byte* data, bool full);
// OK when bytes [begin, min(end, length)) at `chunk` + begin hold those bytes of chunk `id`'s
// content (`chunk` points at where its byte 0 would be): every byte when `full`, else the
// range's first 16. IoError naming the chunk and the first differing byte otherwise. What an
// extent read (transfer.ssd_read_unit = extent) checks: the rows it brought, not the chunk.
Status CheckChunkRange(ChunkId id, Bytes length, const std::byte* chunk, Bytes begin, Bytes end,
                       bool full);

class HwExecutor : public Executor {
 public:
  // Opens the chunk store, the I/O engine, the arenas and the workers. `hardware` gives the
  // link rates for pacing and the cost model for modeled compute (with its gpu.layer_table;
  // a missing or bad table is InvalidArgument). A store_capacity that cannot hold one chunk
  // of the model at chunk_tokens is InvalidArgument naming hw.store_capacity and the chunk size.
  static Status Create(const ModelSpec& model, const HardwareOptions& hardware,
                       const HwExecutorOptions& options, std::unique_ptr<HwExecutor>* out);
  ~HwExecutor() override;

  Seconds Now() override;
  OpId Submit(TransferOp op, std::span<const OpId> after) override;
  OpId Submit(ComputeOp op, std::span<const OpId> after) override;
  Status Wait(OpId op) override;
  std::size_t WaitAny(std::span<const OpId> ops) override;
  bool Done(OpId op) override;
  OpTimes Retire(OpId op) override;
  void OnResident(Tier tier, ChunkId chunk) override;
  void OnEvicted(Tier tier, ChunkId chunk) override;

  // Writes chunk `id` (length `bytes`) to the store synchronously, unless it is already there
  // with that length: pre-population for run.prewarm. When `fill_tiers`, a chunk the caches
  // hold in the CPU / GPU tier also gets its content copied into its arena slot.
  Status Prepopulate(ChunkId id, Bytes bytes, bool fill_tiers);
  // Restarts the clock at 0 (after setup and prewarm: times are since the run started). A
  // CUDA error re-anchoring the device's events is returned.
  Status ResetClock();
  // Sleeps until Now() >= t (a request's arrival), letting background work proceed.
  void IdleUntil(Seconds t) override;
  void Drain() override;

  HwExecutorStats stats() const;
  BackendKind backend() const;            // kHost or kCuda (auto resolved)
  std::string io_backend_name() const;    // "io_uring" | "pread"
  bool direct_io() const;
  std::uint32_t dio_mem_align() const;
  std::uint32_t dio_offset_align() const;
  std::string store_path() const;
  Bytes slot_bytes() const;
  // Chunks the store listed but dropped at open: their bytes failed the checksum (hw/chunk_store.h).
  const std::vector<Status>& store_dropped_on_open() const;

 private:
  HwExecutor();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::hw
