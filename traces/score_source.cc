#include "traces/score_source.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "traces/trace_io.h"

namespace kvtier {

ReplaySetup PrepareReplay(const std::string& trace_path, const Config& config,
                          const ExperimentOptions& opts) {
  ReplaySetup setup;
  const TraceReader reader(trace_path);
  setup.header = reader.header();
  const TraceHeader& header = setup.header;
  if (!config.GetBool("workload.retarget")) {
    if (header.model.name != opts.model.name) {
      throw TraceError(trace_path + ": trace was made for model '" + header.model.name +
                       "' but the experiment runs '" + opts.model.name +
                       "' (set workload.retarget = true to map its layers and heads)");
    }
    // Same name, other shape (a hand-written model file, a trace generated with other
    // --model-* flags): its importance rows would be read for the wrong layers and heads.
    const ModelDescriptor& m = header.model;
    if (m.layers != opts.model.layers || m.heads != opts.model.heads ||
        m.kv_heads != opts.model.kv_heads) {
      auto shape = [](int layers, int heads, int kv_heads) {
        return std::to_string(layers) + " layers, " + std::to_string(heads) + " heads, " +
               std::to_string(kv_heads) + " KV heads";
      };
      throw TraceError(trace_path + ": trace was made for '" + m.name + "' with " +
                       shape(m.layers, m.heads, m.kv_heads) + ", but the experiment's '" +
                       opts.model.name + "' (" + config.Get("model.layers").origin + ") has " +
                       shape(opts.model.layers, opts.model.heads, opts.model.kv_heads) +
                       " (set workload.retarget = true to map its layers and heads)");
    }
  }
  // Warm-ups that take every request leave nothing to measure: the run completed with an
  // empty comparison table and exit 0 (found probing with run.warmup_requests = 10^6).
  long long requests = std::max<long long>(0, reader.DeclaredRecords());  // 0: not known
  if (opts.run.max_requests > 0 && (requests == 0 || requests > opts.run.max_requests)) {
    requests = opts.run.max_requests;
  }
  if (requests > 0 && opts.run.warmup_requests >= requests) {
    throw ConfigError(config.Where("run.warmup_requests") + ": " +
                      std::to_string(opts.run.warmup_requests) + " warm-up requests leave none " +
                      "of the " + std::to_string(requests) + " served (" +
                      (opts.run.max_requests > 0 && requests == opts.run.max_requests
                           ? "run.max_requests"
                           : trace_path + "'s requests") +
                      ") to measure");
  }
  if (!opts.importance.empty()) {
    setup.none_model =
        ProceduralParams::Parse(opts.importance, config.Where("workload.importance"));
  }
  return setup;
}

TraceScoreSource::TraceScoreSource(const TraceHeader& header, const ModelSpec& target,
                                   std::optional<ProceduralParams> none_model)
    : target_(target),
      source_layers_(header.model.layers),
      source_kv_heads_(header.model.kv_heads) {
  KVTIER_CHECK(target.layers >= 1 && target.kv_heads >= 1, "target model needs a shape");
  if (header.procedural) {
    procedural_ = std::make_unique<ImportanceModel>(*header.procedural, target.layers,
                                                    target.kv_heads);
  }
  if (none_model) {
    none_model->Validate("importance model");
    none_model_ = std::make_unique<ImportanceModel>(*none_model, target.layers, target.kv_heads);
  }
}

TraceScoreSource::~TraceScoreSource() = default;

void TraceScoreSource::AddEntry(RequestId id, ImportanceKind kind, std::uint64_t query_key,
                                ExplicitScores scores) {
  auto [it, added] = entries_.try_emplace(id);
  Entry& e = it->second;
  for (SelectionMemo* m : {memo_, h2o_memo_}) {
    if (m != nullptr && !added) m->End(e.ordinal);  // replaced
  }
  e.ordinal = next_ordinal_++;
  for (SelectionMemo* m : {memo_, h2o_memo_}) {
    if (m != nullptr) m->Begin(e.ordinal, id);
  }
  e.kind = kind;
  // A none record without an importance model is fine until something asks for its scores
  // (ModelFor): a system that selects nothing (recomp, as, cake) replays such a trace as is.
  e.query_key = kind != ImportanceKind::kNone ? query_key
                : none_model_               ? DefaultQueryKey(none_model_->params().seed, id)
                                            : 0;
  e.scores = std::move(scores);
  e.token_keys.clear();
  e.anchors.Clear();
}

void TraceScoreSource::NoteContext(const Request& request) {
  const std::int64_t tokens = request.prefix_tokens() + request.query_tokens;
  if (target_.max_context <= 0 || tokens <= target_.max_context) return;
  if (over_context_++ > 0) return;
  // The cost model extrapolates past the model's context (the shipped Fig. 3 workload goes to
  // 8K-token prefixes on OPT-13B, whose context is 2K); the real model refuses such a sequence
  // (LlamaModel::Forward). So a warning, once per run, not an error.
  std::fprintf(stderr,
               "kvtier: warning: request %llu has %lld tokens (prefix + query), more than "
               "model.max_context = %d of %s; the cost model extrapolates (the model itself "
               "could not run it); later such requests are not reported\n",
               static_cast<unsigned long long>(request.id), static_cast<long long>(tokens),
               target_.max_context, target_.name.c_str());
}

void TraceScoreSource::Add(const TraceRecord& record) {
  NoteContext(record.request);
  AddEntry(record.request.id, record.importance, record.query_key,
           record.importance == ImportanceKind::kExplicit ? record.explicit_scores
                                                          : ExplicitScores{});
}

void TraceScoreSource::Add(TraceRecord&& record) {
  NoteContext(record.request);
  AddEntry(record.request.id, record.importance, record.query_key,
           record.importance == ImportanceKind::kExplicit ? std::move(record.explicit_scores)
                                                          : ExplicitScores{});
}

void TraceScoreSource::Release(RequestId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  for (SelectionMemo* m : {memo_, h2o_memo_}) {
    if (m != nullptr) m->End(it->second.ordinal);
  }
  entries_.erase(it);
}

ItfDecision TraceScoreSource::Itf(const Request& request, int layer, std::int64_t reused_tokens,
                                  std::span<const int> probe_heads, const ItfOptions& options) {
  // The memo's key names the probe-head count; the Pipeline probes heads 0..P-1.
  bool first_heads = static_cast<int>(probe_heads.size()) == options.probe_heads;
  for (std::size_t j = 0; j < probe_heads.size(); ++j) {
    first_heads = first_heads && probe_heads[j] == static_cast<int>(j);
  }
  if (memo_ == nullptr || !first_heads || reused_tokens < 1) {
    return ScoreSource::Itf(request, layer, reused_tokens, probe_heads, options);
  }
  auto it = entries_.find(request.id);
  KVTIER_CHECK(it != entries_.end(), "TraceScoreSource::Itf: request was not Add()ed");
  const std::uint64_t ordinal = it->second.ordinal;
  const std::int64_t n = reused_tokens;
  if (const MemoLayer* m = memo_->Find(ordinal, layer, n);
      m != nullptr && std::int64_t(m->k) == RetainedTokens(options.retention, n)) {
    ItfDecision d;
    d.k = m->k;
    d.similarity = m->similarity;
    d.threshold = ItfThreshold(d.k, n, options.alpha);
    d.fallback = d.similarity < d.threshold;  // as SelectItf
    if (!d.fallback) d.voted = m->Voted();
    memo_->Store(ordinal, layer, *m, /*from_memo=*/true);
    return d;
  }
  Scores(request, layer, n, probe_heads, &probe_scores_);
  ItfDecision d = ItfDecisionOnly(probe_scores_, options.probe_heads, n, options,
                                  /*always_vote=*/true);
  memo_->Store(ordinal, layer, MemoLayer::FromVoted(n, d.k, d.similarity, d.voted),
               /*from_memo=*/false);
  if (d.fallback) d.voted.clear();  // as SelectItf: a fallback layer has no voted set
  return d;
}

namespace {
std::int64_t CountSum(const std::vector<std::uint8_t>& counts) {
  std::int64_t sum = 0;
  for (std::uint8_t c : counts) sum += c;
  return sum;
}
}  // namespace

Selection TraceScoreSource::TopKPerHead(const Request& request, int layer,
                                        std::int64_t reused_tokens, std::span<const int> heads,
                                        std::int64_t k) {
  if (sample_h2o_ && reused_tokens >= 1 && !heads.empty()) {
    auto it = entries_.find(request.id);
    KVTIER_CHECK(it != entries_.end(), "TraceScoreSource::TopKPerHead: request was not Add()ed");
    Entry& e = it->second;
    if (e.kind != ImportanceKind::kExplicit) {
      KVTIER_CHECK(layer >= 0 && layer < target_.layers, "layer out of range");
      KVTIER_CHECK(reused_tokens <= request.prefix_tokens(), "reused_tokens > prefix tokens");
      for (int h : heads) KVTIER_CHECK(h >= 0 && h < target_.kv_heads, "head out of range");
      ModelFor(request, e, reused_tokens)
          .SampleTopKCounts(e.token_keys, e.query_key, layer, static_cast<int>(heads.size()),
                            reused_tokens, k, &sampled_counts_, request.prefix_tokens(),
                            &e.anchors);
      return Selection::FromCounts(sampled_counts_, static_cast<int>(heads.size()));
    }
  }
  // The memo's key names every KV head.
  bool all_heads = static_cast<int>(heads.size()) == target_.kv_heads;
  for (std::size_t j = 0; j < heads.size(); ++j) {
    all_heads = all_heads && heads[j] == static_cast<int>(j);
  }
  if (h2o_memo_ == nullptr || !all_heads || reused_tokens < 1) {
    return ScoreSource::TopKPerHead(request, layer, reused_tokens, heads, k);
  }
  auto it = entries_.find(request.id);
  KVTIER_CHECK(it != entries_.end(), "TraceScoreSource::TopKPerHead: request was not Add()ed");
  const std::uint64_t ordinal = it->second.ordinal;
  const std::int64_t n = reused_tokens;
  if (const MemoLayer* m = h2o_memo_->Find(ordinal, layer, n);
      m != nullptr && std::int64_t(m->k) == k && !m->counts.empty() &&
      CountSum(m->counts) == k * target_.kv_heads) {
    Selection sel = m->Counted(target_.kv_heads);
    h2o_memo_->Store(ordinal, layer, *m, /*from_memo=*/true);
    return sel;
  }
  Selection sel = ScoreSource::TopKPerHead(request, layer, n, heads, k);
  h2o_memo_->Store(ordinal, layer, MemoLayer::FromCounted(n, k, sel), /*from_memo=*/false);
  return sel;
}

void TraceScoreSource::Scores(const Request& request, int layer, std::int64_t reused_tokens,
                              std::span<const int> kv_heads, std::vector<float>* out) {
  KVTIER_CHECK(layer >= 0 && layer < target_.layers, "layer out of range");
  KVTIER_CHECK(reused_tokens >= 0 && reused_tokens <= request.prefix_tokens(),
               "reused_tokens > prefix tokens");
  auto it = entries_.find(request.id);
  KVTIER_CHECK(it != entries_.end(), "TraceScoreSource::Scores: request was not Add()ed");
  Entry& e = it->second;
  const std::int64_t n = reused_tokens;
  out->resize(kv_heads.size() * static_cast<std::size_t>(n));
  for (int h : kv_heads) KVTIER_CHECK(h >= 0 && h < target_.kv_heads, "head out of range");
  if (e.kind == ImportanceKind::kExplicit) {
    const int src_layer = RetargetLayer(layer, target_.layers, source_layers_);
    for (std::size_t j = 0; j < kv_heads.size(); ++j) {
      e.scores.Row(src_layer, RetargetHead(kv_heads[j], source_kv_heads_), n,
                   out->data() + j * n);
    }
    return;
  }
  ModelFor(request, e, n).Scores(e.token_keys, e.query_key, layer, kv_heads, n, out->data(),
                                 request.prefix_tokens(), &e.anchors);
}

const ImportanceModel& TraceScoreSource::ModelFor(const Request& request, Entry& e,
                                                  std::int64_t n) {
  const ImportanceModel* model =
      e.kind == ImportanceKind::kProcedural ? procedural_.get() : none_model_.get();
  if (model == nullptr && e.kind == ImportanceKind::kNone) {
    throw TraceError("request " + std::to_string(request.id) +
                     ": the trace has no importance for it (a trace of lengths and prefixes "
                     "only, as import-mooncake writes) and no importance model was named: set "
                     "workload.importance, e.g. --workload.importance=\"seed=1\" "
                     "(docs/configuration.md)");
  }
  KVTIER_CHECK(model != nullptr, "no importance model for this request");
  if (std::int64_t(e.token_keys.size()) < n) PrefixTokenKeys(request, &e.token_keys);
  return *model;
}

}  // namespace kvtier
