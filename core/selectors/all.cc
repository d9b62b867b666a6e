// select.policy = all: every K and V row of the reused prefix R (AS; Cake).

#include "core/options.h"
#include "core/selector.h"

namespace kvtier {
namespace {

class AllSelector final : public TokenSelector {
 public:
  Status Select(LayerStep& step) override {
    step.kept = step.AllTokens();
    step.Load(KvKind::kKey, step.kept, Purpose::kDemand);
    step.Load(KvKind::kValue, step.kept, Purpose::kDemand);
    return Status::OK();
  }

  // AS's layer-wise preload: the next layer needs everything too.
  void Prefetch(LayerStep& step) override {
    const std::vector<OpId> loaded = step.submitted();
    step.Prefetch(KvKind::kKey, step.AllTokens(), Purpose::kPrefetch, loaded);
    step.Prefetch(KvKind::kValue, step.AllTokens(), Purpose::kPrefetch, loaded);
  }

  Selection Choose(const RequestRun&, std::int64_t begin, std::int64_t end) override {
    return Selection::All(begin, end);
  }
};

}  // namespace

std::unique_ptr<TokenSelector> NewAllSelector(const ModelSpec&, const SystemOptions&) {
  return std::make_unique<AllSelector>();
}

}  // namespace kvtier
