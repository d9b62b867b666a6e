#pragma once
// TokenSelector: what one layer keeps of the reusable prefix R, and what the next layer is
// predicted to need. A system names one with `select.policy`:
//
//   all      every K and V row of R (AS, Cake).
//   h2o      every head's keys of R; full scores on the GPU; each KV head's top-k tokens
//            (k = ceil(select.retention * n)); those heads' value rows (the H2O baselines).
//   itf      the probe heads' keys; their scores; ITF's decision (SPEC §IV-B, core/itf.h):
//            pass -> K and V rows of the one voted set; fallback -> what the `itf.fallback`
//            selector loads for this layer.
//   history  the top select.retention share of R by each token's stored importance history
//            (the reorderer's moving average of past requests' attention); reads no query.
//
// Implementations live one per file in core/selectors/ and are registered in the one table
// in core/selector.cc (name, factory, one-line help, and what each needs); the config key's
// choices, `kvtier config --keys` and errors are derived from it.
//
// A selector acts only through the context the schedule gives it -- a LayerStep (loads of
// rows of one kind for one purpose, a score step on the GPU, waits, the ScoreSource, the ITF
// outcome) -- never through the Executor or the caches directly, so every executor and
// every schedule sees the same decisions.
//
// Thread safety: a Pipeline makes one TokenSelector and shares it between the requests in flight;
// Select may wait, and another request's Select may run inside that wait. A selector keeps
// no per-request state across a wait.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/executor.h"
#include "core/itf.h"
#include "core/model_spec.h"
#include "core/registry.h"
#include "core/run_log.h"
#include "core/score_source.h"
#include "core/selection.h"
#include "core/status.h"

namespace kvtier {

class RequestRun;
struct SystemOptions;

// One layer of the layer-by-layer schedule, as a TokenSelector sees it: what the layer is, and the
// operations it may ask for. The schedule (core/schedules/layerwise.cc) owns it and gathers
// what the selector submits: everything it loads and scores is what the layer's compute waits
// for. Not thread-safe; lives for one layer of one request.
class LayerStep {
 public:
  // `prev_compute`: the previous layer's compute (kNoOp for layer 0). overlap: loads may
  // start before the previous layer is done (prefetch.mode = layer); otherwise they wait for
  // prev_compute.
  LayerStep(RequestRun& run, int layer, OpId prev_compute, bool overlap);

  int layer() const { return layer_; }
  // The request: its match (R's segments), their importance history, its tokens.
  const RequestRun& run() const { return run_; }
  const Request& request() const;
  // Tokens of R (n) and new tokens (NR + query) this layer computes.
  std::int64_t reused_tokens() const;
  std::int64_t new_tokens() const;
  const ModelSpec& model() const;
  ScoreSource& scores() const;

  // Every token of R.
  Selection AllTokens() const;

  // Loads the `kind` rows of this layer that `sel` needs (one use of each chunk: cache
  // accesses, prefetched rows settled) for `purpose`. Returns the ops the rows arrive with;
  // the layer's compute waits for them too.
  std::vector<OpId> Load(KvKind kind, const Selection& sel, Purpose purpose);

  // Submits a score step of this layer on the GPU: `kind` (kProbeScores, kFullScores) of the
  // new tokens' queries against the keys of R of `heads` KV heads, after `after` and the
  // previous layer's compute. The layer's compute waits for it too.
  OpId Score(ComputeKind kind, int heads, std::vector<OpId> after);

  // Waits for `op` (another request may run inside the wait). A failure fails the layer:
  // the selector returns it at once.
  Status Wait(OpId op);

  // Records this layer's ITF outcome: the layers row, the request's counters and, when chunk
  // decisions are logged, an "itf" decision row.
  void RecordItf(const ItfDecision& decision);

  // What the loads and score steps submitted so far bring (for a prefetch to follow).
  const std::vector<OpId>& submitted() const { return deps_; }

  // Prefetches `kind` rows of layer() + 1 that `sel` names for `purpose`, after `after` (on
  // PCIe; on the SSD after this layer's reads and earlier prefetches). Returns the ops they
  // arrive with. REQUIRES: layer() + 1 < model().layers.
  std::vector<OpId> Prefetch(KvKind kind, const Selection& sel, Purpose purpose,
                             const std::vector<OpId>& after);

  // What the layer keeps: set by TokenSelector::Select.
  Selection kept;

 private:
  friend class LayerwiseSchedule;  // reads what the layer submitted
  RequestRun& run_;
  int layer_;
  OpId prev_compute_;
  LayerRecord record_;
  std::vector<OpId> deps_;       // what the layer's compute waits for
  std::vector<OpId> gpu_ops_;    // GPU ops attributed to the layer
  std::vector<OpId> io_after_;   // what this layer's loads wait for
  std::vector<OpId> ssd_reads_;  // the layer's SSD reads, in submission order
};

class TokenSelector {
 public:
  virtual ~TokenSelector() = default;

  // Loads what layer step.layer() needs through `step` and sets step.kept to what the layer
  // keeps. Returns the failure of an op it waited for (the request then fails), else OK.
  virtual Status Select(LayerStep& step) = 0;

  // Submits through step.Prefetch what layer step.layer() + 1 is predicted to need, given
  // step.kept (SPEC §IV-C: adjacent layers keep similar tokens). Called after Select, before
  // the layer's compute, by a schedule that prefetches (prefetch.mode = layer).
  // REQUIRES: step.layer() + 1 < layers.
  virtual void Prefetch(LayerStep& step) = 0;

  // The rows of R tokens [begin, end) to load for every layer before the query has reached
  // any layer (Cake's loads). REQUIRES: this selector's SelectorInfo::needs_query is false;
  // 0 <= begin < end <= run.n.
  virtual Selection Choose(const RequestRun& run, std::int64_t begin, std::int64_t end);
};

// What makes a TokenSelector: the model and the whole system (retention, ITF options, fallback).
using SelectorFactory = std::unique_ptr<TokenSelector> (*)(const ModelSpec& model,
                                                           const SystemOptions& system);

// One line of the selector table (core/selector.cc).
struct SelectorInfo {
  std::string_view name;  // select.policy
  SelectorFactory make;
  std::string_view help;  // one line, for --keys and docs
  // Reads this request's attention at every layer (scores of the query against R's keys): a
  // schedule that loads before the query reaches a layer (cake) cannot use it.
  bool needs_query;
  // Reads the probe heads' keys and makes ITF decisions: systems store probe-key chunks
  // (StoredLayout) and may memoise the decisions (traces/selection_memo.h).
  bool probe_keys;
  // Chooses from the segments' importance history: the pipeline keeps that history (each
  // request's observed importance) even without reordering.
  bool history;
  // Keeps every KV head's top-k (ScoreSource::TopKPerHead): the selections may be memoised
  // (traces/selection_memo.h, MakeH2oKey).
  bool per_head_top_k;
};
// Whether `system` asks ScoreSource::TopKPerHead (its selector, or ITF's fallback, keeps every
// KV head's top-k, or a history selector's pipeline observes it).
bool UsesPerHeadTopK(const SystemOptions& system);

// The table, in order; choices of select.policy.
std::span<const SelectorInfo> Selectors();
std::vector<Choice> SelectorChoices();
// The entry named `name`; throws ConfigError naming `key` and the valid names if none.
const SelectorInfo& FindSelector(std::string_view name, std::string_view key = "select.policy");
// The choices of itf.fallback: the selectors that read no probe keys themselves.
std::vector<Choice> ItfFallbackChoices();
// A new selector named `name` (`key` names where the name came from, for the error).
std::unique_ptr<TokenSelector> NewSelector(std::string_view name, const ModelSpec& model,
                                           const SystemOptions& system,
                                           std::string_view key = "select.policy");

}  // namespace kvtier
