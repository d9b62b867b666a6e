#pragma once
// Executor: the seam between the policy pipeline (core/pipeline.h) and a platform. The
// Pipeline decides *what* moves and computes; an Executor carries it out and says *when*:
//   - sim/SimExecutor  turns operations into SimGrid activities (simulated time);
//   - hw/HwExecutor    into io_uring reads, memcpy/cudaMemcpyAsync and real kernels;
//   - tests/testutil/FakeExecutor into scripted durations on FIFO resources.
// Policies never see an Executor; only the Pipeline calls it (LevelDB's Env idea).
//
// Operations are asynchronous: Submit returns at once with an OpId; the operation starts when
// every operation in `after` has completed and its resource allows. The Pipeline waits for
// the operations it needs; others (background writes, promotions) complete on their own.
// One operation may aggregate what the hardware does concurrently (all chunk reads of one
// layer from one tier): `bytes` is the total and `ios` the number of discrete I/Os, so an
// executor can charge per-I/O costs without one activity per chunk. `chunks` lists the
// chunks for executors that move real bytes (hw); simulated executors use the totals.
//
// Thread safety: an Executor is driven by one Pipeline from one thread (or one SimGrid actor).

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace kvtier {

using OpId = std::uint64_t;
inline constexpr OpId kNoOp = 0;

// Which resource a transfer uses.
enum class TransferKind : std::uint8_t {
  kSsdRead,    // SSD -> CPU memory (into the CPU cache or a staging buffer)
  kSsdWrite,   // CPU memory -> SSD (new prefix KV, reordered chunks)
  kH2D,        // CPU memory -> GPU over PCIe
  kD2H,        // GPU -> CPU memory over PCIe (demotion from the GPU cache)
  kCpuGather,  // CPU memory -> CPU memory: pick important rows out of loaded chunks
};
std::string_view TransferKindName(TransferKind kind);  // "ssd_read", ...

// Why a transfer happens; logged with every transfer.
enum class Purpose : std::uint8_t {
  kProbe,     // ITF probe-head keys
  kDemand,    // KV the current layer needs now
  kPrefetch,  // KV predicted for a later layer (layer-aware speculative prefetch, AS preload)
  kCakeLoad,  // Cake's back-to-front loading
  kStore,     // new prefix KV written to SSD
  kReorder,   // reorderer repacking a segment
  kPromote,   // CPU -> GPU cache promotion (rest of the chunk)
  kDemote,    // GPU -> CPU cache demotion
};
std::string_view PurposeName(Purpose purpose);  // "probe", "demand", ...

// One chunk inside an aggregated transfer.
struct ChunkIo {
  ChunkId chunk;
  Bytes bytes = 0;              // bytes of this chunk moved by this op
  std::vector<std::uint16_t> rows;  // stored token rows selected (gathers, row copies); empty = all
};

struct TransferOp {
  TransferKind kind = TransferKind::kSsdRead;
  Purpose purpose = Purpose::kDemand;
  RequestId request = 0;
  int layer = -1;               // -1: not tied to one layer
  Bytes bytes = 0;              // total bytes moved
  std::uint32_t ios = 0;        // discrete I/Os or copies aggregated (>= 1 when bytes > 0)
  std::vector<ChunkIo> chunks;  // what moves (hw needs it; sim may ignore)
};

// What a compute step is; the executor turns it into a duration (cost model, measured table,
// real kernels, or a script).
enum class ComputeKind : std::uint8_t {
  kLayerPrefill,  // one layer for `new_tokens` tokens attending to `context_tokens` tokens
  kProbeScores,   // ITF: probe heads' queries x `context_tokens` probe keys, top-k, Jaccard
  kFullScores,    // H2O: all heads' queries x all keys of `context_tokens` tokens
  kChunkPrefill,  // Cake: all layers for `new_tokens` tokens attending to `context_tokens`
  kOutputLayer,   // final norm + LM head for the last position
  kDecodeStep,    // one decode step of all layers (SpeCache; later)
};
std::string_view ComputeKindName(ComputeKind kind);

struct ComputeOp {
  ComputeKind kind = ComputeKind::kLayerPrefill;
  RequestId request = 0;
  int layer = -1;                    // -1 for all-layer steps
  std::int64_t new_tokens = 0;       // tokens whose hidden states are computed
  std::int64_t context_tokens = 0;   // tokens attended to (kept prefix + new tokens)
  int heads = 0;                     // KV heads scored (score steps); 0 = all
};

// Timestamps of a completed operation, in executor time (seconds since the run started).
struct OpTimes {
  Seconds submit_s = 0;
  Seconds start_s = 0;
  Seconds end_s = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Current executor time in seconds since the run started.
  virtual Seconds Now() = 0;

  // Queues `op`; it starts once every operation in `after` has completed. Returns its id.
  // REQUIRES: every id in `after` was returned by this executor and not yet retired.
  virtual OpId Submit(TransferOp op, std::span<const OpId> after) = 0;
  virtual OpId Submit(ComputeOp op, std::span<const OpId> after) = 0;

  // Blocks until `op` has completed. Returns its status (hw: I/O errors name the chunk).
  virtual Status Wait(OpId op) = 0;

  // Blocks until at least one of `ops` has completed; returns the index of the first one
  // (lowest index among those done). REQUIRES: !ops.empty().
  virtual std::size_t WaitAny(std::span<const OpId> ops) = 0;

  // True once `op` has completed. Never blocks.
  virtual bool Done(OpId op) = 0;

  // Returns the timestamps of a completed op and forgets it; each op is retired exactly once.
  // REQUIRES: Done(op).
  virtual OpTimes Retire(OpId op) = 0;

  // Residency changes decided by the caches, so executors that hold real bytes can free or
  // keep buffers. `tier` is kGpu or kCpu. Simulated executors ignore them.
  virtual void OnResident(Tier tier, ChunkId chunk) {}
  virtual void OnEvicted(Tier tier, ChunkId chunk) {}
};

}  // namespace kvtier
