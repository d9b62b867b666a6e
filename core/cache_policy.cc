#include "core/cache_policy.h"

#include <string>

#include "core/errors.h"
#include "core/registry.h"

namespace kvtier {
namespace {

// Recency: the tick of the last access. Ticks stay below 2^53, so the double is exact.
class LruPolicy final : public CachePolicy {
 public:
  std::string_view Name() const override { return "lru"; }
  double Priority(const ChunkStats& stats) const override {
    return static_cast<double>(stats.last_access);
  }
};

// Frequency: the number of accesses so far (Fig. 14(a), the "traditional" policy).
class LfuPolicy final : public CachePolicy {
 public:
  std::string_view Name() const override { return "lfu"; }
  double Priority(const ChunkStats& stats) const override {
    return static_cast<double>(stats.frequency);
  }
};

// SPEC §IV-D2, score-based cache admission:
//   score = access frequency x moving-average important ratio
// Fig. 14: chunk 1 (A, rate 1.5, ratio 0.5) scores 0.75 < chunk 2 (B, rate 1, ratio 1.0).
class ScorePolicy final : public CachePolicy {
 public:
  std::string_view Name() const override { return "score"; }
  double Priority(const ChunkStats& stats) const override {
    return static_cast<double>(stats.frequency) * stats.important_ratio;
  }
};

struct PolicyEntry {
  std::string_view name;
  std::unique_ptr<CachePolicy> (*make)();
  std::string_view help;
};

// The one table of config names. A new policy adds one line here.
constexpr PolicyEntry kPolicies[] = {
    {"lru", &NewLruPolicy, "least recently used is evicted first"},
    {"lfu", &NewLfuPolicy, "least frequently used is evicted first"},
    {"score", &NewScorePolicy, "frequency x moving-average important ratio (SPEC IV-D2)"},
};

}  // namespace

std::unique_ptr<CachePolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }
std::unique_ptr<CachePolicy> NewLfuPolicy() { return std::make_unique<LfuPolicy>(); }
std::unique_ptr<CachePolicy> NewScorePolicy() { return std::make_unique<ScorePolicy>(); }

std::unique_ptr<CachePolicy> NewCachePolicy(std::string_view name, std::string_view key) {
  return FindEntry(std::span<const PolicyEntry>(kPolicies), name, key, "cache policy").make();
}

std::vector<std::string> CachePolicyNames() {
  std::vector<std::string> names;
  for (const PolicyEntry& entry : kPolicies) names.emplace_back(entry.name);
  return names;
}

std::vector<Choice> CachePolicyChoices() {
  return ChoicesOf(std::span<const PolicyEntry>(kPolicies));
}

}  // namespace kvtier
