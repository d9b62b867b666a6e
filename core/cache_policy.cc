#include "core/cache_policy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"
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
  bool RanksByHistory() const override { return false; }
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

bool InheritStats(std::span<const StatsShare> sources, ChunkStats* out) {
  std::int64_t rows = 0;
  bool any = false;
  for (const StatsShare& s : sources) {
    KVTIER_CHECK(s.rows >= 0, "InheritStats: negative rows");
    rows += s.rows;
    any |= s.stats != nullptr && s.rows > 0;
  }
  KVTIER_CHECK(rows > 0, "InheritStats: no rows");
  if (!any) return false;
  double frequency = 0, ratio = 0;
  std::uint64_t last = 0;
  for (const StatsShare& s : sources) {
    if (s.stats == nullptr || s.rows == 0) continue;
    const double w = double(s.rows) / double(rows);
    frequency += w * double(s.stats->frequency);
    ratio += w * s.stats->important_ratio;
    last = std::max(last, s.stats->last_access);
  }
  out->frequency = std::uint64_t(std::llround(frequency));
  out->important_ratio = std::clamp(ratio, 0.0, 1.0);
  out->last_access = last;
  return true;
}

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
