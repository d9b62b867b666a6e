#pragma once
// RunLog: where the Pipeline reports what happened, one record per request, layer, transfer
// and decision, plus named metrics. The SQLite implementation (results schema, see
// analysis/SCHEMA.md) lives outside core; MemoryRunLog below keeps records in vectors for
// tests and parity checks. Record fields carry units in their names (_s seconds, _bytes).
//
// Decisions depend only on policy inputs, so two executors given the same trace and config
// log identical decision rows except where a decision depends on timing; those rows say so
// (`timing_dependent`). Not thread-safe: one Pipeline logs from one thread.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/executor.h"
#include "core/types.h"

namespace kvtier {

struct RequestRecord {
  RequestId request_id = 0;
  Seconds arrival_s = 0;
  Seconds start_s = 0;               // when the GPU began serving it (>= arrival)
  Seconds end_s = 0;                 // first token available
  std::int64_t prefix_tokens = 0;
  std::int64_t reused_tokens = 0;    // |R|: matched in the radix tree
  std::int64_t query_tokens = 0;
  std::int64_t important_tokens = 0; // sum over layers of tokens kept from R (per-layer mean * L)
  Seconds ttft_s = 0;                // end - start (service time)
  Seconds ttft_arrival_s = 0;        // end - arrival (includes queueing)
  Seconds io_stall_s = 0;            // GPU idle waiting for KV (exposed I/O)
  Bytes ssd_read_bytes = 0;
  Bytes ssd_write_bytes = 0;
  Bytes pcie_h2d_bytes = 0;
  Bytes pcie_d2h_bytes = 0;
  std::int64_t gpu_hit_chunks = 0;
  std::int64_t cpu_hit_chunks = 0;
  std::int64_t ssd_read_chunks = 0;
  std::int64_t itf_layers = 0;       // layers where ITF ran
  std::int64_t itf_fallback_layers = 0;
  bool warmup = false;               // excluded from statistics
  // "ok", or the failure that stopped it: the first failed operation of the request, named
  // with its kind, purpose and layer, and the executor's error (chunk, errno or CUDA text).
  std::string status = "ok";
};

struct LayerRecord {
  RequestId request_id = 0;
  int layer = 0;
  double itf_similarity = -1;        // -1: ITF not run
  double itf_threshold = -1;
  bool itf_fallback = false;
  std::int64_t selected_tokens = 0;  // |S_l| (per-head sets: mean size)
  std::int64_t loaded_chunks = 0;    // K/V chunks this layer needed from CPU/SSD
  std::int64_t prefetched_chunks = 0;
  std::int64_t prefetch_used_chunks = 0;
  Seconds start_s = 0;               // layer compute start
  Seconds end_s = 0;                 // layer compute end
  Seconds stall_s = 0;               // time the layer waited for its KV after the GPU was free
};

// How a transfer ended (core/executor.h, "Failure"): transfers.status.
enum class TransferOutcome : std::uint8_t {
  kOk,       // moved every byte
  kFailed,   // failed itself (I/O error, short read, content mismatch, store full, CUDA)
  kAborted,  // never ran: a transfer or compute it depended on failed
};
inline std::string_view TransferOutcomeName(TransferOutcome outcome) {
  switch (outcome) {
    case TransferOutcome::kOk: return "ok";
    case TransferOutcome::kFailed: return "failed";
    case TransferOutcome::kAborted: return "aborted";
  }
  return "?";
}

// One transfer as it happened: `bytes` and `ios` are what moved, so a failed read is not
// logged as data read.
struct TransferRecord {
  RequestId request_id = 0;
  int layer = -1;
  Tier src = Tier::kSsd;
  Tier dst = Tier::kCpu;
  TransferKind kind = TransferKind::kSsdRead;
  Purpose purpose = Purpose::kDemand;
  Bytes bytes = 0;                   // moved (kFailed: before the failure; kAborted: 0)
  std::uint32_t ios = 0;             // I/Os or copies it was made of (kAborted: 0)
  CopyMethod method = CopyMethod::kDma;  // TransferOp::method
  std::uint32_t descriptors = 0;         // TransferOp::descriptors (kAborted: 0)
  Seconds submit_s = 0;
  Seconds start_s = 0;
  Seconds end_s = 0;
  TransferOutcome outcome = TransferOutcome::kOk;
};

// The record of a transfer as planned (request `request`, before it runs): the op's layer,
// kind, purpose, bytes, I/Os, method and descriptors, and the tiers its kind moves between.
TransferRecord PlannedTransfer(const TransferOp& op, RequestId request);
// Fills the outcome of a retired transfer into its record: when it ran, what moved (an aborted
// one moved nothing; a failed one what it moved before failing), how it ended. Returns the
// bytes planned but not moved (0 when it succeeded).
Bytes SettleTransfer(const OpTimes& t, TransferRecord* tr);
// The failure to report for a failed op named `what`: its own failure annotated with it; an
// aborted op's status already names the root.
Status NameFailure(const Status& s, const std::string& what);

// A policy decision: "itf" (detail: pass/fallback), "admit", "evict", "promote", "demote",
// "prefetch", "reorder", "store".
struct DecisionRecord {
  RequestId request_id = 0;
  int layer = -1;
  std::string kind;
  std::uint64_t chunk = 0;           // ChunkId::value, 0 when not about one chunk
  std::string detail;
  bool timing_dependent = false;

  friend bool operator==(const DecisionRecord&, const DecisionRecord&) = default;
};

// One decode step of the continuous batch (core/decode_engine.h): decode_steps.
struct DecodeStepRecord {
  std::int64_t step = 0;           // 0, 1, ... in the run
  Seconds start_s = 0;             // submitted (the batch's previous step or a prefill ended)
  Seconds end_s = 0;               // its output layer ended
  int batch = 0;                   // sequences in the step
  int tokens = 0;                  // output tokens it produced (SpeCache pre-decoding: none)
  std::int64_t rows = 0;           // token rows computed (SpeCache: speculative rows too)
  std::int64_t context_tokens = 0; // cached positions, summed over the batch
  Bytes gpu_bytes = 0;             // GPU memory the batch's sequences hold (their footprints)
  Seconds compute_s = 0;           // GPU busy with the step's computes
  Seconds stall_s = 0;             // (end - start) - compute_s: waiting for KV to arrive
  Bytes h2d_bytes = 0;             // KV fetched or prefetched by the step
  Bytes d2h_bytes = 0;             // new KV offloaded by the step
};

// One request's decode, logged when it produced its last token: decode_requests.
struct DecodeRequestRecord {
  RequestId request_id = 0;
  bool warmup = false;
  std::int64_t prompt_tokens = 0;  // prefix + query
  std::int64_t output_tokens = 0;  // the first token included
  Seconds first_token_s = 0;       // = requests.end_s
  Seconds join_s = 0;              // start of its first decode step
  Seconds end_s = 0;               // its last token
  int steps = 0;                   // decode steps it was in (SpeCache: its pre-decoding too)
  Seconds tpot_s = 0;              // (end - first_token) / (output_tokens - 1)
  Seconds stall_s = 0;             // stalls of the steps it was in, summed
};

class RunLog {
 public:
  virtual ~RunLog() = default;
  virtual void LogRequest(const RequestRecord& record) = 0;
  virtual void LogLayer(const LayerRecord& record) = 0;
  virtual void LogTransfer(const TransferRecord& record) = 0;
  virtual void LogDecision(const DecisionRecord& record) = 0;
  virtual void LogMetric(const std::string& name, double value) = 0;
  // Decode rows (core/decode_engine.h); only runs whose system decodes write them.
  virtual void LogDecodeStep(const DecodeStepRecord& record) {}
  virtual void LogDecodeRequest(const DecodeRequestRecord& record) {}
  // Called after each request's records: a durable implementation may write a batch here
  // (every Flush, or every few, as it sees fit).
  virtual void Flush() {}
  // Called once after the run's last records: writes everything still buffered. Errors throw,
  // so a run whose records did not all reach storage is never marked complete.
  virtual void Close() {}
};

// Keeps every record in memory. For tests, parity checks and small runs.
class MemoryRunLog : public RunLog {
 public:
  void LogRequest(const RequestRecord& r) override { requests.push_back(r); }
  void LogLayer(const LayerRecord& r) override { layers.push_back(r); }
  void LogTransfer(const TransferRecord& r) override { transfers.push_back(r); }
  void LogDecision(const DecisionRecord& r) override { decisions.push_back(r); }
  void LogMetric(const std::string& name, double value) override {
    metrics.emplace_back(name, value);
  }
  void LogDecodeStep(const DecodeStepRecord& r) override { decode_steps.push_back(r); }
  void LogDecodeRequest(const DecodeRequestRecord& r) override { decode_requests.push_back(r); }

  std::vector<RequestRecord> requests;
  std::vector<LayerRecord> layers;
  std::vector<TransferRecord> transfers;
  std::vector<DecisionRecord> decisions;
  std::vector<std::pair<std::string, double>> metrics;
  std::vector<DecodeStepRecord> decode_steps;
  std::vector<DecodeRequestRecord> decode_requests;
};

}  // namespace kvtier
