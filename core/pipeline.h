#pragma once
// Pipeline: runs requests through a system's policies, asking an Executor to move and
// compute and a ScoreSource for importance, and reports everything to a RunLog. It is the one
// driver both modes run (sim: in SimGrid; hw: on a host thread; tests: over FakeExecutor).
// Policies decide; the Executor says when.
//
// A system is composed of policy objects, each made by name from its registration table:
//   schedule (schedule.policy, core/schedule.h): the order of a request's loads and computes
//       -- recompute, layerwise (prefetch.mode = none | layer), cake;
//   selector (select.policy, core/selector.h): what a layer keeps of the reused prefix and
//       what the next layer is predicted to need -- all, h2o, itf (itf.fallback);
//   cache policy (cache.policy, core/cache_policy.h): how the GPU and CPU tiers rank chunks;
//   and the stored layout (core/stored_layout.h): which kinds a chunk has, bytes per chunk.
// Loads go through one LoadPlanner per request (core/load_planner.h), whatever the schedule.
//
// Per request, Run keeps the lifecycle (SPEC §IV-A "Dataflow"):
//   radix lookup -> reusable R (n tokens), new prefix tokens NR, query tokens Q;
//   the schedule's prefill (recompute when nothing is reusable);
//   the output layer; NR's KV written to the SSD and NR inserted into the radix tree
//       (background);
//   the importance history: the share of layers that kept each reused token (a history
//       selector's request records what its attention observed instead), for the reorderer;
//   reorder.enabled: every reorder.interval, repack the segments whose repack has paid for
//       itself by the reorderer's evidence (core/reorderer.h), from the copies GPU and CPU
//       memory hold where they hold one (background: SSD reads of the rest, copies, a CPU
//       gather into the new layout, the SSD write);
//   retire, check and log every op of the request;
//   with decode.policy (core/decode_engine.h): join the decode batch, whose steps the serving
//       loop (ServeWithDecode, below) runs between prefills.
//
// Failures (core/executor.h, "Failure"). Every operation's status is checked: each Wait and
// WaitAny, and every op when it is retired, foreground or background. The first failure of a
// request fails it: the pipeline stops submitting its work, waits for what is in flight, logs
// its rows as they happened (transfers with status failed/aborted and the bytes that did
// move; the request with its error) and Run returns the failure, annotated with the failed
// operation: "IoError: ssd_read (demand, request 7, layer 3): chunk 0x... (segment 2, layer
// 3, K, index 0): short read 4096 < 65536 bytes at offset ...". When only ops downstream of
// the failure are known (the root was a background store the executor ordered a read after),
// the status is kAborted and names the root in its message. A background operation (store,
// repack, promotion, demotion) that fails is remembered when it is retired and returned by the
// next Run -- which then serves nothing and logs no request -- or by Finish. A caller should
// stop the run at the first failure: the caches may then hold chunks whose loads failed.
//
// Not thread-safe; one Pipeline per executor. With max_in_flight = 1 (one request at a time),
// decisions depend only on the request sequence, the trace's importance and the config, never
// on timing, so every executor makes the same decisions for the same inputs.
//
// Several requests at once (max_in_flight > 1): Run may be entered again by another SimGrid
// actor while one request is blocked in an executor wait (the simulator's concurrent
// prefills; actors are cooperative, so nothing else runs between two waits). The caches, the
// radix tree, the reorderer and the background list are shared; what keeps them consistent:
//   - every chunk a request accesses, or plans to take from GPU or CPU memory for a prefetch,
//     is pinned for it in the TieredCache until the request ends: other requests' victim
//     selection skips it (the request's own still evicts it, as it would alone);
//   - a segment an in-flight request reads is not repacked (the reorderer keeps it due);
//   - storing the new prefix looks the prefix up again if the tree changed since the request's
//     lookup (RadixTree::Insert requires an unchanged tree);
//   - the radix tree is only replaced (a new tokens_per_symbol) with no request in flight.
// Then the interleaving of requests, and so the decisions, depend on timing; the simulator is
// deterministic, so the same inputs still give the same rows.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/decode_engine.h"
#include "core/executor.h"
#include "core/model_spec.h"
#include "core/options.h"
#include "core/radix_tree.h"
#include "core/reorderer.h"
#include "core/request.h"
#include "core/run_log.h"
#include "core/score_source.h"
#include "core/status.h"
#include "core/stored_layout.h"
#include "core/tiered_cache.h"

namespace kvtier {

class RequestRun;
class Schedule;
class TokenSelector;
struct SelectorInfo;

struct PipelineOptions {
  SystemOptions system;
  // Log every cache move and prefetch, and each layer's ITF outcome, as decision rows (parity
  // tests, small runs). Off, only request-level decisions (stores, reorders, Cake's meeting
  // point) are logged; the layers rows always carry the ITF outcome.
  bool log_chunk_decisions = true;
  // Fill ChunkIo::rows of transfers (executors that move real bytes need them).
  bool chunk_detail = true;
  // How many Run calls may be in flight at once (1..TieredCache::kMaxHolders); above 1 the
  // pipeline pins what each request uses (see above). 1 takes no pins at all.
  int max_in_flight = 1;
};

// Running totals over all measured (non-warm-up) requests.
struct PipelineTotals {
  std::int64_t requests = 0;
  std::int64_t gpu_hit_chunks = 0;
  std::int64_t cpu_hit_chunks = 0;
  std::int64_t ssd_read_chunks = 0;
  std::int64_t itf_layers = 0;
  std::int64_t itf_fallback_layers = 0;
  std::int64_t prefetched_chunks = 0;
  std::int64_t prefetch_used_chunks = 0;
  std::int64_t reorder_passes = 0;
  std::int64_t repacked_segments = 0;
  // Old chunks repacks took from GPU or CPU memory, and those they read from the SSD (all
  // requests: repacks are background work).
  std::int64_t repack_chunks_from_memory = 0;
  std::int64_t repack_chunks_from_ssd = 0;
  // K and V chunks the demand loads touched (RequestRun::kv_chunks), and the layers of the
  // requests that reused something: kv_chunks / kv_layers is SPEC Fig. 20's loaded chunks per
  // layer.
  std::int64_t kv_chunks = 0;
  std::int64_t kv_layers = 0;
  Bytes ssd_read_bytes = 0;
  Bytes pcie_h2d_bytes = 0;
};

class Pipeline {
 public:
  // The executor, score source and log must outlive the pipeline. Throws ConfigError if the
  // options name an unknown schedule, selector or cache policy.
  Pipeline(const ModelSpec& model, const PipelineOptions& options, Executor* executor,
           ScoreSource* scores, RunLog* log);
  ~Pipeline();

  // Serves `request` starting now (the caller has handled arrival and queueing). Logs its
  // request, layer, transfer and decision rows; `warmup` marks them excluded from statistics.
  // Returns the request's first failure (see "Failures" above; the request is logged with it
  // as its status), or, without serving the request or logging it, the failure of a
  // background operation retired since the last report.
  // REQUIRES: fewer than options.max_in_flight calls in flight (other actors' Run calls
  // blocked in an executor wait); `request` outlives the call.
  Status Run(const Request& request, bool warmup = false);

  // Stores `request`'s prefix and places its chunks in the caches (GPU first, then CPU) without
  // moving data or logging transfers: the paper's pre-warmed caches (§VI-B).
  void Prewarm(const Request& request);

  // Waits for background work (stores, promotions, repacks), logs it and the run's metrics.
  // With decode, first steps the decode batch until it is empty (core/decode_engine.h). Returns the
  // first failure of a background operation or decode step not yet returned.
  // REQUIRES: no Run in flight.
  Status Finish();

  // Decode (decode.policy, core/decode_engine.h). Without it: decodes() and decoding() are false,
  // CanAdmit is always true and Run is exactly what it was. With it, Run ends a request that
  // decodes by joining it to the decode batch (its row is logged then; its decode rows when it
  // finishes), and the serving loop interleaves prefills and decode steps:
  //   - CanAdmit(r): the batch has GPU memory and room for r (serve r's prefill now);
  //   - decoding(): sequences are in the batch; DecodeStep() runs one step of all of them.
  // REQUIRES (DecodeStep): decoding(); no Run in flight.
  bool decodes() const { return decode_ != nullptr; }
  bool CanAdmit(const Request& request) const {
    return decode_ == nullptr || decode_->CanJoin(request);
  }
  bool decoding() const { return decode_ != nullptr && decode_->batch() > 0; }
  Status DecodeStep();
  const DecodeEngine* decode_engine() const { return decode_.get(); }

  const TieredCache& cache() const { return *cache_; }
  const RadixTree& tree() const { return *tree_; }
  const Reorderer& reorderer() const { return *reorderer_; }
  const PipelineTotals& totals() const { return totals_; }

 private:
  friend class RequestRun;  // a request's primitives act on the pipeline's parts

  void StoreNewPrefix(RequestRun& rs, OpId after);
  void ObserveImportance(RequestRun& rs);
  void MaybeReorder(RequestId request);
  // What repacking segment `id` would move over the SSD now (the reorderer's repack cost).
  // *reads, when given, is the part of it that reads chunks no cache holds.
  double RepackSsdBytes(std::uint32_t id, double* reads = nullptr) const;
  // Repacks segment `old_id` (see MaybeReorder), submitting its background ops through `rs`.
  void RepackSegment(RequestRun& rs, RequestId request, std::uint32_t old_id);
  // The reorderer's evidence of request `rs` (before its history is recorded).
  void RecordEvidence(const RequestRun& rs);
  // True if an in-flight request reads segment `id` (its match references it).
  bool SegmentInUse(std::uint32_t id) const;
  // Hands a transfer no request waits for to the background: retired (and logged) once done,
  // in the order handed over.
  void AddBackground(OpId op, const TransferRecord& record);
  void RetireBackground(bool wait_all);
  void RetireOne(OpId op, TransferRecord& record);

  ModelSpec model_;
  PipelineOptions options_;
  StoredLayout layout_;
  const SelectorInfo* selector_info_ = nullptr;
  bool reuses_ = true;                   // the schedule looks up and stores prefix KV
  std::unique_ptr<TokenSelector> selector_;
  std::unique_ptr<Schedule> schedule_;   // over selector_
  std::unique_ptr<Schedule> recompute_;  // for a request with nothing reusable
  Executor* executor_;
  ScoreSource* scores_;
  RunLog* log_;
  std::unique_ptr<TieredCache> cache_;
  std::unique_ptr<RadixTree> tree_;
  std::unique_ptr<Reorderer> reorderer_;
  std::unique_ptr<DecodeEngine> decode_;  // decode.policy != none
  Seconds last_reorder_s_ = 0;
  bool reorder_started_ = false;
  struct Background {
    OpId op;
    TransferRecord record;
  };
  // Background transfers not yet retired, by the order they were handed over (their retire
  // and log order). Found done through the executor's notices (Executor::Watch), not by
  // polling each per request: on the whole Mooncake trace thousands of stores wait behind the
  // SSD's write backlog, and polling them all before every request was ~20% of `as`'s time
  // late in the trace. An executor without notices is polled (background_notices_ false).
  std::map<std::uint64_t, Background> background_;
  std::uint64_t background_next_ = 0;                   // the next one's number
  std::unordered_map<OpId, std::uint64_t> watched_;  // a watched op -> its number
  bool background_notices_ = true;  // false once the executor refused a Watch
  std::vector<OpId> done_ops_;          // scratch: TakeDone's notices
  std::vector<std::uint64_t> done_numbers_;  // scratch: theirs, in order
  Status background_error_;  // first background failure not yet returned by Run or Finish
  PipelineTotals totals_;
  std::vector<const RequestRun*> in_flight_;  // requests inside Run, oldest first
  std::uint32_t holders_in_use_ = 0;  // bit h: a request in flight holds pin slot h
  std::uint64_t tree_version_ = 0;    // bumped by every Insert and Repack
};

// The serving loop of a system that decodes (Pipeline::decodes()), written once for every
// executor: requests are taken in arrival order; one that has arrived and fits in the decode
// batch (Pipeline::CanAdmit) is prefilled first and joins the batch; otherwise the batch takes
// a decode step; with nothing decoding, executor time passes until the next arrival (vLLM's
// default order, without chunked prefill; a request waiting for memory blocks those behind
// it). next(&warmup) returns the next request, valid until done(request, warmup, status) is
// called for it, or nullptr when there is none (it stops being called then). Returns after
// Pipeline::Finish (which steps the batch empty): its failure, else the first decode step's.
// *served counts the requests run. A request's failure is reported to done; the caller's next
// should then return nullptr. REQUIRES: pipeline.decodes(); one driving thread or actor.
Status ServeWithDecode(Pipeline& pipeline, Executor& executor,
                       const std::function<const Request*(bool* warmup)>& next,
                       const std::function<void(const Request&, bool, const Status&)>& done,
                       long long* served);

}  // namespace kvtier
