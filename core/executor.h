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
// Failure. An operation either succeeds or fails with a Status: hw reports I/O errors and
// short reads with the chunk and the errno text, content mismatches (hw.verify), a store too
// full to take a chunk (OutOfSpace, naming the chunk and the capacity) and CUDA errors; the
// simulator never fails. An executor never retries an operation and never drops a failure:
//   - an operation that fails completes (done) with its error; bytes it moved before the
//     failure are reported in OpTimes::failed_moved_bytes;
//   - an operation one of whose dependencies failed -- an id in `after`, or an ordering the
//     executor adds itself (hw: a read waits for the pending store of its chunk) -- does not
//     run: it completes at once, when the failure is known (start_s = end_s), having moved
//     nothing, with AbortedAfter(<the failed op>, <its status>). Transitively: its own
//     dependents complete the same way with the same status, so every op downstream of a
//     failure names the one root failure ("Aborted: after failed ssd_read (demand, request 7,
//     layer 3): IoError: chunk 0x... (...): short read 4096 < 65536 bytes at offset ...");
//   - Wait returns an op's status, Retire returns it again with the times, so the failure of
//     an op nobody waits for (a background store, promotion, repack) is seen when it is
//     retired.
// A failure does not stop the executor: unrelated operations run on, and later submissions
// are served as usual (one that names a failed op in `after` completes at once, aborted). What
// to do about a failure is the caller's decision (the Pipeline fails the request and the run).
// Retiring after an error: every op is still retired exactly once, failed and aborted ones
// included; an executor keeps a failed op's status until then, and retiring it changes nothing
// for its dependents (they completed, aborted, when it failed). IdleUntil and Drain never
// report failures: what completes meanwhile is seen through Wait and Retire.
//
// Thread safety: an Executor is driven by one Pipeline from one thread (or one SimGrid actor).
// ExecutorWrapper (below) forwards every call to another Executor, so a test can override one
// method: inject a failure, trace the calls. (All but the completion notices, Watch/TakeDone:
// a wrapper may change what Done says, so it keeps none and is polled.)

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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
  // Decode (core/decode_engine.h): KV a decode step reads from CPU memory, fetched once its layer
  // knows what to read (specache_nospec's top-k after its own scores; offload_all's whole KV),
  // or prefetched a step ahead (specache: the speculative token's top-k); and new 16-bit KV
  // copied to CPU memory (the prompt's at join, each step's new token).
  kDecodeFetch,
  kDecodePrefetch,
  kDecodeOffload,
};
std::string_view PurposeName(Purpose purpose);  // "probe", "demand", ...
// Background SSD traffic (stores, repacks): what both executors hold to ssd.background_share of
// the device -- the simulator as a capped link, hw by pacing its writes.
inline bool IsBackground(Purpose purpose) {
  return purpose == Purpose::kStore || purpose == Purpose::kReorder;
}

// How an H2D or D2H crosses PCIe (transfer.strategy, core/transfer_strategy.h).
enum class CopyMethod : std::uint8_t {
  kDma,           // copy-engine copies, one call each (cudaMemcpyAsync): `ios` calls
  kBatched,       // batched copy calls (cudaMemcpyBatchAsync): `ios` calls, `descriptors` in all
  kDeviceGather,  // a GPU kernel reads mapped pinned host memory: `ios` launches copying
                  // `descriptors` row runs
};
std::string_view CopyMethodName(CopyMethod method);  // "dma", "batched", "device_gather"

// A byte range inside a chunk's stored bytes (an SSD extent read): 4 KiB aligned, offset and
// length (core/transfer_strategy.h, AppendExtents).
struct Extent {
  Bytes offset = 0;
  Bytes length = 0;
  friend bool operator==(const Extent&, const Extent&) = default;
};

// One chunk inside an aggregated transfer.
struct ChunkIo {
  ChunkId chunk;
  Bytes bytes = 0;              // bytes of this chunk moved by this op
  std::vector<std::uint16_t> rows;  // stored token rows selected (gathers, row copies); empty = all
  // kSsdRead: the extents read (one I/O each); empty = the whole chunk.
  std::vector<Extent> extents;
};

struct TransferOp {
  TransferKind kind = TransferKind::kSsdRead;
  Purpose purpose = Purpose::kDemand;
  RequestId request = 0;
  int layer = -1;               // -1: not tied to one layer
  Bytes bytes = 0;              // total bytes moved
  // Discrete operations, each paying the per-op cost of its kind (>= 1 when bytes > 0):
  // kSsdRead/kSsdWrite I/Os (chunks, or merged extents); H2D/D2H DMA calls (kDma), batched
  // calls (kBatched) or kernel launches (kDeviceGather); kCpuGather contiguous runs memcpy'd.
  std::uint32_t ios = 0;
  std::vector<ChunkIo> chunks;  // what moves (hw needs it; sim may ignore)
  CopyMethod method = CopyMethod::kDma;  // H2D/D2H: how the bytes cross PCIe
  // kBatched: descriptors in its call(s); kDeviceGather: row runs the kernel copies; else 0.
  std::uint32_t descriptors = 0;
  // H2D: the source is the rows the op's preceding kCpuGather laid out contiguously, one
  // region per kind (staged_gather), not the chunks' own places in host memory.
  bool staged = false;
};

// What a compute step is; the executor turns it into a duration (cost model, measured table,
// real kernels, or a script).
enum class ComputeKind : std::uint8_t {
  kLayerPrefill,  // one layer for `new_tokens` tokens attending to `context_tokens` tokens
  kProbeScores,   // ITF: probe heads' queries x `context_tokens` probe keys, top-k, Jaccard
  kFullScores,    // H2O: all heads' queries x all keys of `context_tokens` tokens
  kChunkPrefill,  // Cake: all layers for `new_tokens` tokens attending to `context_tokens`
  kOutputLayer,   // final norm + LM head for the last position
  kDecodeStep,    // layer -1: one decode step of one sequence, all layers; layer >= 0: one
                  // layer of a batched decode step (core/decode_engine.h; see DecodePart)
};
std::string_view ComputeKindName(ComputeKind kind);

// Which part of a batched decode layer a kDecodeStep op (layer >= 0) computes.
enum class DecodePart : std::uint8_t {
  kWhole,   // the whole layer: QKV, attention, O, FFN
  kScores,  // QKV projections and attention scores with their top-k (specache_nospec's first
            // half: what to fetch)
  kAttend,  // attention over the scores' context with the fetched pairs, O and FFN (its second)
};

struct ComputeOp {
  ComputeKind kind = ComputeKind::kLayerPrefill;
  RequestId request = 0;
  int layer = -1;                    // -1 for all-layer steps
  std::int64_t new_tokens = 0;       // tokens whose hidden states are computed
  std::int64_t context_tokens = 0;   // tokens attended to (kept prefix + new tokens)
  int heads = 0;                     // KV heads scored (score steps); 0 = all
  // A batched decode layer (kDecodeStep, layer >= 0): new_tokens = rows computed (the batch's
  // sequences, twice that with SpeCache's speculative rows); context_tokens = query-key pairs
  // one query head scores, summed over the rows; the KV bytes attention reads and writes, in
  // the system's format (16-bit, KIVI codes with their scales, fetched 16-bit pairs), which
  // only the decode engine knows. kOutputLayer: new_tokens = rows (prefill: 1).
  DecodePart decode_part = DecodePart::kWhole;
  Bytes kv_read_bytes = 0;
  Bytes kv_write_bytes = 0;
};

// What a completed operation reports when it is retired: its timestamps, in executor time
// (seconds since the run started), and how it ended.
struct OpTimes {
  Seconds submit_s = 0;
  Seconds start_s = 0;
  Seconds end_s = 0;
  // OK; the op's own failure; or kAborted: a dependency failed and it never ran.
  Status status;
  // A transfer that failed: the bytes it did move before the failure (0 when aborted).
  // Unused when status is OK (the op moved all of TransferOp::bytes).
  Bytes failed_moved_bytes = 0;
};

// "ssd_read (demand, request 7, layer 3)", "layer_prefill (request 7, layer 3)": how failures
// name an operation (the layer is left out when the op is not tied to one).
std::string DescribeTransfer(TransferKind kind, Purpose purpose, RequestId request, int layer);
std::string DescribeCompute(ComputeKind kind, RequestId request, int layer);
inline std::string DescribeOp(const TransferOp& op) {
  return DescribeTransfer(op.kind, op.purpose, op.request, op.layer);
}
inline std::string DescribeOp(const ComputeOp& op) {
  return DescribeCompute(op.kind, op.request, op.layer);
}
// The status of an op whose dependency `failed_op` (DescribeOp) ended with `failure`: the
// same status if `failure` is itself kAborted (it already names the root), else
// Aborted("after failed <failed_op>: <failure>").
Status AbortedAfter(std::string_view failed_op, const Status& failure);

class Executor {
 public:
  virtual ~Executor() = default;

  // Current executor time in seconds since the run started.
  virtual Seconds Now() = 0;

  // Queues `op`; it starts once every operation in `after` has completed. Returns its id.
  // REQUIRES: every id in `after` was returned by this executor and not yet retired.
  virtual OpId Submit(TransferOp op, std::span<const OpId> after) = 0;
  virtual OpId Submit(ComputeOp op, std::span<const OpId> after) = 0;

  // Blocks until `op` has completed. Returns its status (see "Failure" above). On an op that
  // has completed it returns at once, doing nothing else (the Pipeline asks it for the status
  // of the op WaitAny found done). REQUIRES: `op` not yet retired.
  virtual Status Wait(OpId op) = 0;

  // Blocks until at least one of `ops` has completed (successfully or not); returns the index
  // of the first one (lowest index among those done); Wait(ops[i]) then gives its status.
  // REQUIRES: !ops.empty().
  virtual std::size_t WaitAny(std::span<const OpId> ops) = 0;

  // True once `op` has completed. Never blocks.
  virtual bool Done(OpId op) = 0;

  // Returns the timestamps and status of a completed op and forgets it; each op is retired
  // exactly once, whatever its status. REQUIRES: Done(op).
  virtual OpTimes Retire(OpId op) = 0;

  // Completion notices, for a caller that holds many ops open and must not poll each with Done
  // (the Pipeline's background stores: thousands behind the SSD's write backlog on a long
  // trace, each polled once per request). Watch(op): a later TakeDone reports `op` once it
  // has completed -- once, and exactly when Done(op) would say true then. Returns false when
  // this executor keeps no notices (the default, and ExecutorWrapper's: a wrapper may change
  // what Done says); the caller then polls Done. REQUIRES: `op` not retired.
  virtual bool Watch(OpId op) { return false; }
  // Appends the watched ops completed by now and not reported before, in no particular order
  // (ids of ops retired since they completed included: the caller skips what it retired).
  virtual void TakeDone(std::vector<OpId>* out) {}

  // Lets executor time pass until `t` (a request's arrival) while submitted operations
  // proceed; returns at once when Now() >= t already. On return Now() >= t. Operations that
  // complete meanwhile, failed ones included, stay to be retired.
  virtual void IdleUntil(Seconds t) = 0;

  // Blocks until every operation submitted so far has completed, successfully or not (an op
  // aborted after a failure completes too, so Drain never waits for an op that will not run).
  // Retires nothing and reports nothing: the caller retires each op and sees its status then.
  // (The simulator with several driving actors: until nothing is in flight, which may be a
  // pause between other actors' requests.)
  virtual void Drain() = 0;

  // Residency changes decided by the caches, so executors that hold real bytes can free or
  // keep buffers. `tier` is kGpu or kCpu. Simulated executors ignore them.
  virtual void OnResident(Tier tier, ChunkId chunk) {}
  virtual void OnEvicted(Tier tier, ChunkId chunk) {}
};

// An Executor that forwards every call to `target` (LevelDB's EnvWrapper): derive from it and
// override the one method a test or a decorator changes -- fail a chosen operation (fault
// injection), trace or time the calls -- and everything else behaves as the target does. The
// target is not owned and must outlive the wrapper. A wrapper that changes what an op reports
// keeps the contract above itself (e.g. an op it fails: its dependents report Aborted).
// Completion notices are not forwarded (Watch says false, so callers poll Done, which a
// wrapper may override); a decorator that changes no status may forward them itself.
class ExecutorWrapper : public Executor {
 public:
  explicit ExecutorWrapper(Executor* target) : target_(target) {}
  Executor* target() const { return target_; }

  Seconds Now() override { return target_->Now(); }
  OpId Submit(TransferOp op, std::span<const OpId> after) override {
    return target_->Submit(std::move(op), after);
  }
  OpId Submit(ComputeOp op, std::span<const OpId> after) override {
    return target_->Submit(std::move(op), after);
  }
  Status Wait(OpId op) override { return target_->Wait(op); }
  std::size_t WaitAny(std::span<const OpId> ops) override { return target_->WaitAny(ops); }
  bool Done(OpId op) override { return target_->Done(op); }
  OpTimes Retire(OpId op) override { return target_->Retire(op); }
  void IdleUntil(Seconds t) override { target_->IdleUntil(t); }
  void Drain() override { target_->Drain(); }
  void OnResident(Tier tier, ChunkId chunk) override { target_->OnResident(tier, chunk); }
  void OnEvicted(Tier tier, ChunkId chunk) override { target_->OnEvicted(tier, chunk); }

 private:
  Executor* target_;
};

}  // namespace kvtier
