#include "core/cache_policy.h"

#include <string>

#include "core/errors.h"

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
};

// The one table of config names. A new policy adds one line here.
constexpr PolicyEntry kPolicies[] = {
    {"lru", &NewLruPolicy},
    {"lfu", &NewLfuPolicy},
    {"score", &NewScorePolicy},
};

}  // namespace

std::unique_ptr<CachePolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }
std::unique_ptr<CachePolicy> NewLfuPolicy() { return std::make_unique<LfuPolicy>(); }
std::unique_ptr<CachePolicy> NewScorePolicy() { return std::make_unique<ScorePolicy>(); }

std::unique_ptr<CachePolicy> NewCachePolicy(std::string_view name, std::string_view key) {
  for (const PolicyEntry& entry : kPolicies) {
    if (entry.name == name) return entry.make();
  }
  std::string valid;
  for (const PolicyEntry& entry : kPolicies) {
    if (!valid.empty()) valid += ", ";
    valid += entry.name;
  }
  throw ConfigError(std::string(key) + ": unknown cache policy '" + std::string(name) +
                    "' (valid: " + valid + ")");
}

std::vector<std::string> CachePolicyNames() {
  std::vector<std::string> names;
  for (const PolicyEntry& entry : kPolicies) names.emplace_back(entry.name);
  return names;
}

}  // namespace kvtier
