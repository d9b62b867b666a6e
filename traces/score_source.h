#pragma once
// TraceScoreSource: the ScoreSource (core/score_source.h) of trace replay. It serves the
// importance of a request's reusable prefix tokens from the request's trace record:
//   - explicit payloads: the recorded (dequantized) scores;
//   - procedural payloads: regenerated lazily from the header's importance model, only for the
//     (layer, heads, tokens) asked for;
//   - none: from the importance model the experiment names (`none_model`), keyed by the
//     request's id; without one, Add() of such a record throws TraceError.
// Retargeting: the replayed `target` model may differ from the trace's source model. Explicit
// scores map target layer l to source layer floor(l * Ls / Lt) and head h to h % Hs
// (FORMAT.md §Retargeting); procedural scores are generated for the target model directly
// (the head-correlation profile is read by relative depth).
//
// Usage: Add(record) when the request is submitted, Scores() any number of times while it runs,
// Release(id) when it is done, so memory is bounded by the requests in flight. Records are
// Add()ed in trace order (their ordinal is the count of earlier Add() calls). Not thread-safe.
//
// With a SelectionMemo (UseMemo), Itf() answers from decisions an earlier run of the same trace
// made and remembers the ones it computes (traces/selection_memo.h); with an H2O selection memo
// (UseH2oMemo), TopKPerHead() does the same for H2O's per-head selections.

#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/model_spec.h"
#include "core/score_source.h"
#include "traces/importance_model.h"
#include "traces/selection_memo.h"
#include "traces/trace_format.h"

namespace kvtier {

struct ExperimentOptions;
class Config;

// What a replay (sim or hw) needs from a trace before it starts.
struct ReplaySetup {
  TraceHeader header;
  std::optional<ProceduralParams> none_model;  // importance for records without scores
};

// Opens `trace_path` and checks that `config` can replay it: the trace's model must be the
// experiment's unless workload.retarget is set; workload.importance, if set, is parsed.
// Throws TraceError (naming the file) or ConfigError (naming the key).
ReplaySetup PrepareReplay(const std::string& trace_path, const Config& config,
                          const ExperimentOptions& opts);

class TraceScoreSource : public ScoreSource {
 public:
  // `header`: the trace's header (source model, importance model). `target`: the model replayed
  // (its layers and kv_heads bound Scores()' arguments). `none_model`: importance model for
  // records whose payload is none (e.g. imported request traces).
  // REQUIRES: target.layers >= 1, target.kv_heads >= 1.
  TraceScoreSource(const TraceHeader& header, const ModelSpec& target,
                   std::optional<ProceduralParams> none_model = std::nullopt);
  ~TraceScoreSource() override;

  // Registers the importance payload of `record` under record.request.id (replacing an earlier
  // one with the same id). Explicit scores are copied (or moved). A none payload without a
  // none_model is accepted: Scores() for it throws TraceError naming workload.importance (so a
  // system that selects nothing replays such a trace). The first request longer than the
  // target's max_context (prefix + query) prints one warning to stderr; over_context_requests()
  // counts them all.
  void Add(const TraceRecord& record);
  void Add(TraceRecord&& record);
  // Forgets a request. Unknown ids are ignored.
  void Release(RequestId id);
  std::size_t live_requests() const { return entries_.size(); }
  std::int64_t over_context_requests() const { return over_context_; }

  // See ScoreSource. REQUIRES additionally: Add() was called for request.id.
  void Scores(const Request& request, int layer, std::int64_t reused_tokens,
              std::span<const int> kv_heads, std::vector<float>* out) override;

  // Remember and reuse ITF decisions in `memo` (not owned; nullptr: none). Call before Add().
  void UseMemo(SelectionMemo* memo) { memo_ = memo; }
  // Remember and reuse H2O's selections in `memo` (opened with SelectionMemo::MakeH2oKey; not
  // owned; nullptr: none). Call before Add().
  void UseH2oMemo(SelectionMemo* memo) { h2o_memo_ = memo; }
  // H2O's selections of model-generated importance (procedural or none payloads) drawn from the
  // importance model's statistics (ImportanceModel::SampleTopKCounts) instead of scored head by
  // head: `workload.h2o_selection = sampled`. Explicit scores are always selected exactly; no
  // H2O memo is read or written for a sampled selection.
  void SampleH2o(bool on) { sample_h2o_ = on; }
  bool sample_h2o() const { return sample_h2o_; }
  // See ScoreSource. With a memo and probe heads 0..P-1, answers from the memo when it holds
  // this (record, layer, n); otherwise computes and stores the decision.
  ItfDecision Itf(const Request& request, int layer, std::int64_t reused_tokens,
                  std::span<const int> probe_heads, const ItfOptions& options) override;
  // See ScoreSource. With an H2O memo and every KV head 0..H-1, answers from the memo when it
  // holds this (record, layer, n) for this k; otherwise computes and stores the selection.
  // With SampleH2o(true) and model-generated importance, the sampled selection instead.
  Selection TopKPerHead(const Request& request, int layer, std::int64_t reused_tokens,
                        std::span<const int> heads, std::int64_t k) override;

 private:
  struct Entry {
    std::uint64_t ordinal = 0;             // position of the record in the trace
    ImportanceKind kind = ImportanceKind::kNone;
    std::uint64_t query_key = 0;
    ExplicitScores scores;                 // explicit only
    std::vector<std::uint32_t> token_keys;  // procedural/none: computed on first use
    ImportanceModel::AnchorCache anchors;   // procedural/none: version 1's anchor rows
  };
  void AddEntry(RequestId id, ImportanceKind kind, std::uint64_t query_key, ExplicitScores scores);
  // The importance model behind a model-generated (procedural or none) entry, with the entry's
  // token keys computed up to `n` tokens of `request`'s prefix.
  const ImportanceModel& ModelFor(const Request& request, Entry& e, std::int64_t n);
  void NoteContext(const Request& request);

  ModelSpec target_;
  int source_layers_;
  int source_kv_heads_;
  std::unique_ptr<ImportanceModel> procedural_;  // header's model, for the target shape
  std::unique_ptr<ImportanceModel> none_model_;
  std::unordered_map<RequestId, Entry> entries_;
  SelectionMemo* memo_ = nullptr;
  SelectionMemo* h2o_memo_ = nullptr;
  bool sample_h2o_ = false;
  std::vector<std::uint16_t> sampled_counts_;  // TopKPerHead()'s scratch when sampling
  std::uint64_t next_ordinal_ = 0;
  std::int64_t over_context_ = 0;  // requests longer than target_.max_context
  std::vector<float> probe_scores_;  // Itf()'s scratch
};

}  // namespace kvtier
