#pragma once
// RequestRun: one request inside Pipeline::Run -- its records, its chunk map and loads (a
// LoadPlanner), and the primitives a Schedule (core/schedule.h) uses to submit operations and
// wait for them. Selectors see a narrower view of it, a LayerStep (core/selector.h). Neither
// reaches the Executor except through these primitives, which keep the request's bookkeeping:
// every foreground op is remembered so that Run can retire it, check its status and log it;
// every transfer's bytes are added to the request's record.
//
// Pipeline::Run creates one per request; it lives until Run returns. Several may exist at once
// (PipelineOptions::max_in_flight > 1: cooperative SimGrid actors); another request's code may
// run only inside Wait and WaitAny, which restore this request's cache pin holder afterwards.
// Not thread-safe.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/executor.h"
#include "core/load_planner.h"
#include "core/pipeline.h"
#include "core/radix_tree.h"
#include "core/request.h"
#include "core/run_log.h"
#include "core/selection.h"
#include "core/status.h"

namespace kvtier {

// A transfer of `kind` for `purpose`, of `request` at `layer` (-1: not one layer), no bytes yet.
inline TransferOp MakeTransfer(TransferKind kind, Purpose purpose, RequestId request, int layer) {
  TransferOp op;
  op.kind = kind;
  op.purpose = purpose;
  op.request = request;
  op.layer = layer;
  return op;
}

class RequestRun {
 public:
  // `pipeline` and `request` outlive the RequestRun. `holder`: the request's pin slot in the
  // cache (max_in_flight > 1), else -1.
  RequestRun(Pipeline& pipeline, const Request& request, bool warmup, int holder);
  RequestRun(const RequestRun&) = delete;
  RequestRun& operator=(const RequestRun&) = delete;

  // ---- the request ----------------------------------------------------------------------
  const Request& request() const { return *request_; }
  RequestId id() const { return request_->id; }
  bool warmup() const { return warmup_; }
  int holder() const { return holder_; }

  const ModelSpec& model() const { return pipeline_.model_; }
  const SystemOptions& system() const { return pipeline_.options_.system; }
  const PipelineOptions& options() const { return pipeline_.options_; }
  const StoredLayout& layout() const { return pipeline_.layout_; }
  ScoreSource& scores() const { return *pipeline_.scores_; }
  TieredCache& cache() const { return *pipeline_.cache_; }
  Executor& executor() const { return *pipeline_.executor_; }
  RunLog& log() const { return *pipeline_.log_; }
  // Mean importance per offset of stored segment `segment` (the reorderer's moving average of
  // past requests' observed importance), empty if it has none yet.
  std::span<const float> History(std::uint32_t segment) const;

  LoadPlanner& planner() { return planner_; }
  const LoadPlanner& planner() const { return planner_; }

  // ---- submit and wait ------------------------------------------------------------------
  // Submits a GPU compute step of this request (kNoOp entries of `after` are dropped).
  OpId SubmitCompute(ComputeOp op, std::vector<OpId> after);
  // Submits a transfer (kNoOp entries of `after` are dropped; ios defaults to the number of
  // chunks, at least 1) and adds its bytes to the request's record. background: the request
  // does not wait for it; it is retired, checked and logged by the pipeline later.
  OpId SubmitTransfer(TransferOp op, std::vector<OpId> after, bool background);
  // Executor waits: other requests may run inside them.
  Status Wait(OpId op);
  // Index of the first of `ops` done, its status in *status.
  std::size_t WaitAny(std::span<const OpId> ops, Status* status);
  // The request no longer waits for these foreground transfers, nor for any of its Cake loads
  // not yet done: they finish in the background and are logged then.
  void Abandon(const std::vector<OpId>& ops);

  // The schedule's record of one layer's selection: AddKept() when Pipeline::Run reads it
  // (reorder.enabled: the importance history and the reorderer's evidence), else nothing --
  // without reordering nothing reads kept_fraction, and a history selector's pipeline replaces
  // both with what the attention observed (Pipeline::ObserveImportance). (For the H2O
  // baselines, which do not reorder, this was 16% of a warm run on the Mooncake trace.)
  void Keep(const Selection& kept);
  // Adds one layer's selection to kept_fraction (the share of the layer that kept each token)
  // and, when reorder.enabled, its kept tokens to kept_sets: the shared set, the union of the
  // per-head sets (what the layer loads values of), or the range.
  void AddKept(const Selection& kept);

  // ---- records: the schedule fills them, Pipeline::Run logs them ---------------------------
  std::uint64_t tree_version = 0;  // Pipeline::tree_version_ when `match` was looked up
  RequestRecord rec;
  Match match;  // what the radix lookup found reusable
  // Tokens: n of the reusable prefix R, nr of the new prefix NR, q of the query Q.
  std::int64_t n = 0, nr = 0, q = 0;
  std::vector<float> kept_fraction;  // per R token: sum over layers of the share kept
  std::vector<TokenSet> kept_sets;   // per layer Keep was called for (reorder.enabled only)
  // reorder.enabled only: per layer and segment (index in planner().segments()), what the
  // layer's demand K and V loads of that segment's chunks cost, as the reorderer prices them
  // (LoadPlanner::Plan). Empty when nothing was mapped.
  std::vector<double> layout_bytes;
  // K and V chunks the demand loads of this request's layers touched (every tier; a chunk per
  // layer, kind and use): the loaded chunks of SPEC Fig. 20.
  std::int64_t kv_chunks = 0;
  std::vector<LayerRecord> layers;
  std::vector<OpId> layer_compute;               // compute op per layer (kNoOp if none)
  std::vector<std::vector<OpId>> layer_gpu_ops;  // GPU ops attributed to each layer
  // Foreground ops in submission order, with how to log them.
  struct OpLog {
    OpId op;
    bool is_transfer;
    TransferRecord transfer;  // when is_transfer
    bool gpu;                 // compute on the GPU
    int layer;
    ComputeKind compute_kind;
  };
  std::vector<OpLog> ops;

 private:
  Pipeline& pipeline_;
  const Request* request_;
  bool warmup_;
  int holder_;
  LoadPlanner planner_;
  bool keeps_;  // Keep() records (see there)
};

// AddKept() of a kCounted selection: w = 1/kept.heads added to fraction[t] once per head
// keeping token t, each token's adds in sequence (the float sums of the per-head sets, bit for
// bit). REQUIRES: kept.kind == kCounted, its tokens < fraction.size().
void AddCountedShares(const Selection& kept, std::span<float> fraction);

}  // namespace kvtier
