// select.policy = h2o: the H2O baselines' selection. Every KV head's keys of R are loaded and
// scored against the new tokens' queries on the GPU; each KV head keeps its own top-k tokens
// (k = ceil(select.retention * n), heavy hitters by accumulated attention), and only those
// heads' value rows are loaded.

#include <numeric>

#include "core/options.h"
#include "core/selector.h"

namespace kvtier {
namespace {

class H2oSelector final : public TokenSelector {
 public:
  H2oSelector(const ModelSpec& model, const SystemOptions& system)
      : kv_heads_(model.kv_heads), retention_(system.retention), all_heads_(model.kv_heads) {
    std::iota(all_heads_.begin(), all_heads_.end(), 0);
  }

  Status Select(LayerStep& step) override {
    const std::int64_t n = step.reused_tokens();
    const std::vector<OpId> keys = step.Load(KvKind::kKey, step.AllTokens(), Purpose::kDemand);
    // KV heads scored, each with its group of query heads.
    const OpId score = step.Score(ComputeKind::kFullScores, kv_heads_, keys);
    if (Status st = step.Wait(score); !st.ok()) return st;
    // The heads' sets as their union and per-token head counts: what the loads and the
    // importance history read of them (and what a selection memo keeps).
    step.kept = step.scores().TopKPerHead(step.request(), step.layer(), n, all_heads_,
                                          RetainedTokens(retention_, n));
    step.Load(KvKind::kValue, step.kept, Purpose::kDemand);
    return Status::OK();
  }

  // The next layer scores every key again: prefetch them all.
  void Prefetch(LayerStep& step) override {
    step.Prefetch(KvKind::kKey, step.AllTokens(), Purpose::kPrefetch, step.submitted());
  }

 private:
  int kv_heads_;
  double retention_;
  std::vector<int> all_heads_;
};

}  // namespace

std::unique_ptr<TokenSelector> NewH2oSelector(const ModelSpec& model, const SystemOptions& system) {
  return std::make_unique<H2oSelector>(model, system);
}

}  // namespace kvtier
