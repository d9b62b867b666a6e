#include "core/selector.h"

#include <string>

#include "core/check.h"
#include "core/options.h"
#include "core/request_run.h"

namespace kvtier {

// ---- the table ------------------------------------------------------------------------------

// Factories, one per file in core/selectors/.
std::unique_ptr<TokenSelector> NewAllSelector(const ModelSpec& model, const SystemOptions& system);
std::unique_ptr<TokenSelector> NewH2oSelector(const ModelSpec& model, const SystemOptions& system);
std::unique_ptr<TokenSelector> NewItfSelector(const ModelSpec& model, const SystemOptions& system);
std::unique_ptr<TokenSelector> NewHistorySelector(const ModelSpec& model,
                                                  const SystemOptions& system);

namespace {

// The one table of selectors. A new selector adds one line here (and its file).
//  name       factory          help                             query  probe  history  per-head
constexpr SelectorInfo kSelectors[] = {
    {"all", &NewAllSelector, "every K and V row of the reused prefix", false, false, false,
     false},
    {"h2o", &NewH2oSelector,
     "all keys, full scores, each KV head's top-k tokens, their values (H2O)", true, false,
     false, true},
    {"itf", &NewItfSelector,
     "probe heads' keys and scores; K and V of one voted set, or itf.fallback (SPEC IV-B)",
     true, true, false, false},
    {"history", &NewHistorySelector,
     "top select.retention of each range by the segments' importance history; reads no query",
     false, false, true, false},
};

}  // namespace

std::span<const SelectorInfo> Selectors() { return kSelectors; }

std::vector<Choice> SelectorChoices() { return ChoicesOf(Selectors()); }

std::vector<Choice> ItfFallbackChoices() {
  std::vector<Choice> out;
  for (const SelectorInfo& info : Selectors()) {
    if (!info.probe_keys) out.push_back({info.name, info.help});
  }
  return out;
}

const SelectorInfo& FindSelector(std::string_view name, std::string_view key) {
  return FindEntry(Selectors(), name, key, "selector");
}

bool UsesPerHeadTopK(const SystemOptions& system) {
  const SelectorInfo& s = FindSelector(system.select);
  // A history selector's pipeline records what each KV head's top-k observed
  // (Pipeline::ObserveImportance).
  return s.per_head_top_k || s.history ||
         (s.probe_keys && FindSelector(system.itf_fallback, "itf.fallback").per_head_top_k);
}

std::unique_ptr<TokenSelector> NewSelector(std::string_view name, const ModelSpec& model,
                                           const SystemOptions& system, std::string_view key) {
  return FindSelector(name, key).make(model, system);
}

Selection TokenSelector::Choose(const RequestRun&, std::int64_t, std::int64_t) {
  KVTIER_CHECK(false, "TokenSelector::Choose: the selector reads the query (needs_query)");
  return {};
}

// ---- LayerStep --------------------------------------------------------------------------------

LayerStep::LayerStep(RequestRun& run, int layer, OpId prev_compute, bool overlap)
    : run_(run), layer_(layer), prev_compute_(prev_compute) {
  record_.request_id = run.id();
  record_.layer = layer;
  record_.prefetched_chunks = run.planner().BeginLayer();
  // Without cross-layer overlap a layer's I/O starts only once the previous layer is done.
  if (!overlap) io_after_.push_back(prev_compute);
}

const Request& LayerStep::request() const { return run_.request(); }
std::int64_t LayerStep::reused_tokens() const { return run_.n; }
std::int64_t LayerStep::new_tokens() const { return run_.nr + run_.q; }
const ModelSpec& LayerStep::model() const { return run_.model(); }
ScoreSource& LayerStep::scores() const { return run_.scores(); }
Selection LayerStep::AllTokens() const { return Selection::All(0, run_.n); }

std::vector<OpId> LayerStep::Load(KvKind kind, const Selection& sel, Purpose purpose) {
  LoadPlanner& planner = run_.planner();
  LoadPlanner::Group g;
  planner.Plan(layer_, kind, sel, /*demand=*/true, &g);
  OpId read = kNoOp;
  planner.Submit(g, purpose, layer_, io_after_, nullptr, &read);
  if (read != kNoOp) ssd_reads_.push_back(read);
  deps_.insert(deps_.end(), g.terminal.begin(), g.terminal.end());
  record_.loaded_chunks += g.cpu_hits + g.ssd_reads;
  record_.prefetch_used_chunks += g.prefetch_used;
  return std::move(g.terminal);
}

OpId LayerStep::Score(ComputeKind kind, int heads, std::vector<OpId> after) {
  after.push_back(prev_compute_);
  ComputeOp op;
  op.kind = kind;
  op.layer = layer_;
  op.new_tokens = new_tokens();
  op.context_tokens = run_.n;
  op.heads = heads;
  const OpId score = run_.SubmitCompute(op, std::move(after));
  gpu_ops_.push_back(score);
  deps_.push_back(score);
  return score;
}

Status LayerStep::Wait(OpId op) { return run_.Wait(op); }

namespace {

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

void LayerStep::RecordItf(const ItfDecision& d) {
  ++run_.rec.itf_layers;
  record_.itf_similarity = d.similarity;
  record_.itf_threshold = d.threshold;
  record_.itf_fallback = d.fallback;
  // The layers row holds the same (itf_similarity, itf_threshold, itf_fallback); the decision
  // row, with its formatted detail, only with the per-chunk decisions.
  if (run_.options().log_chunk_decisions) {
    run_.log().LogDecision({run_.id(), layer_, "itf", 0,
                            std::string(d.fallback ? "fallback" : "pass") +
                                " s=" + Fixed(d.similarity) + " t=" + Fixed(d.threshold),
                            false});
  }
  if (d.fallback) ++run_.rec.itf_fallback_layers;
}

std::vector<OpId> LayerStep::Prefetch(KvKind kind, const Selection& sel, Purpose purpose,
                                      const std::vector<OpId>& after) {
  KVTIER_DCHECK(layer_ + 1 < run_.model().layers, "LayerStep::Prefetch past the last layer");
  return run_.planner().Prefetch(layer_ + 1, kind, sel, purpose, after, &ssd_reads_);
}

}  // namespace kvtier
