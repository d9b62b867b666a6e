// select.policy = history: rows chosen from the importance history of R's stored segments, never
// from this request's query. Each token's history is the reorderer's moving average of what past
// requests' attention kept of it (Reorderer::MeanImportance; the Pipeline records it after every
// request of a system whose selector reads it, core/pipeline.cc ObserveImportance). Of a range
// of R, the top select.retention share of the tokens that have a history are kept, ranked by
// it (ties: the earlier token); a segment with no history yet keeps all its rows.
//
// Because it reads no query it can choose before the query reaches a layer: under Cake's
// schedule (spec_cake) each loaded Cake chunk brings only its historically important rows.
// hw makes the same choice from the same history. Under the layerwise schedule every layer
// keeps the same rows, so the next layer's prediction is exact.

#include <algorithm>

#include "core/options.h"
#include "core/request_run.h"
#include "core/selector.h"

namespace kvtier {
namespace {

class HistorySelector final : public TokenSelector {
 public:
  explicit HistorySelector(const SystemOptions& system) : retention_(system.retention) {}

  Status Select(LayerStep& step) override {
    step.kept = Choose(step.run(), 0, step.reused_tokens());
    step.Load(KvKind::kKey, step.kept, Purpose::kDemand);
    step.Load(KvKind::kValue, step.kept, Purpose::kDemand);
    return Status::OK();
  }

  // The history is per token, not per layer: the next layer keeps what this one kept.
  void Prefetch(LayerStep& step) override {
    const std::vector<OpId> loaded = step.submitted();
    step.Prefetch(KvKind::kKey, step.kept, Purpose::kPrefetch, loaded);
    step.Prefetch(KvKind::kValue, step.kept, Purpose::kPrefetch, loaded);
  }

  Selection Choose(const RequestRun& run, std::int64_t begin, std::int64_t end) override {
    // Filled and used with no wait in between (the selector is shared by requests in flight).
    tokens_.clear();
    importance_.clear();
    Selection sel;
    sel.kind = Selection::Kind::kShared;
    for (const MatchPiece& piece : run.match.pieces) {
      const std::int64_t lo = std::max(begin, piece.prefix_begin);
      const std::int64_t hi = std::min(end, piece.prefix_end);
      if (lo >= hi) continue;
      const std::span<const float> history = run.History(piece.segment);
      for (std::int64_t t = lo; t < hi; ++t) {
        if (history.empty()) {
          sel.shared.push_back(std::int32_t(t));  // no history yet: every row
        } else {
          tokens_.push_back(std::int32_t(t));
          importance_.push_back(history[std::size_t(piece.segment_begin + t - piece.prefix_begin)]);
        }
      }
    }
    if (tokens_.empty()) return Selection::All(begin, end);
    const std::int64_t k = RetainedTokens(retention_, std::int64_t(tokens_.size()));
    for (std::int32_t i : TopK(importance_, k)) sel.shared.push_back(tokens_[std::size_t(i)]);
    std::sort(sel.shared.begin(), sel.shared.end());
    return sel;
  }

 private:
  double retention_;
  std::vector<std::int32_t> tokens_;  // scratch: tokens of the range with a history
  std::vector<float> importance_;     // scratch: their mean importance
};

}  // namespace

std::unique_ptr<TokenSelector> NewHistorySelector(const ModelSpec&, const SystemOptions& system) {
  return std::make_unique<HistorySelector>(system);
}

}  // namespace kvtier
