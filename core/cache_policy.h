#pragma once
// Cache policies for the GPU and CPU tiers. A CachePolicy only *ranks* chunks: it maps the
// statistics of a chunk to a priority (higher = more worth keeping). TieredCache
// (core/tiered_cache.h) keeps one indexed min-heap per tier ordered by that priority and
// applies SPEC's promote/demote rules, so every policy shares one set of mechanics and the
// contract tests cover all of them.
//
//   lru    priority = tick of the last access         (newest access always wins admission)
//   lfu    priority = access frequency
//   score  priority = frequency x moving-average important ratio   (SPEC §IV-D2, Fig. 14)
//
// Policies are stateless and thread-safe. A new policy: its class and factory, and one line in
// the table in cache_policy.cc (the config choices, --keys and errors derive from it).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/registry.h"

namespace kvtier {

// What the policies score by; kept by TieredCache for every chunk ever accessed (resident or
// not), because admission compares a chunk on SSD with the residents -- unless the policy
// ranks by the last access alone (RanksByHistory() false), when an uncached chunk's statistics
// can never matter again.
struct ChunkStats {
  std::uint64_t frequency = 0;       // accesses so far
  double important_ratio = 0;        // moving average of the fraction of rows used per access
  std::uint64_t last_access = 0;     // logical tick of the last access (1, 2, ...)
};

// The statistics a chunk made of rows of other chunks inherits: a repacked chunk (SPEC §IV-D1,
// core/pipeline.cc) instead of restarting at zero. Each source chunk counts by the share of the
// new chunk's rows it gave, w_s = rows_s / sum rows (a source without statistics -- never
// accessed -- counts as frequency 0, ratio 0):
//   frequency       = round(sum_s w_s frequency_s)     (lfu, and score's first factor)
//   important_ratio = sum_s w_s important_ratio_s      (score's second factor)
//   last_access     = max_s last_access_s              (lru: the rows were last used then)
// so every policy ranks the new chunk as the rows it holds were ranked, pro rata. Returns false
// (and leaves *out alone) when no source has statistics: the new chunk starts fresh, as its
// sources would have. REQUIRES: every rows_s >= 0, and some rows_s > 0.
struct StatsShare {
  const ChunkStats* stats = nullptr;  // nullptr: the source was never accessed
  std::int64_t rows = 0;
};
bool InheritStats(std::span<const StatsShare> sources, ChunkStats* out);

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  // Name used in configs and in the runs table: "lru", "lfu", "score".
  virtual std::string_view Name() const = 0;
  // Priority of a chunk with statistics `stats`; deterministic, finite.
  virtual double Priority(const ChunkStats& stats) const = 0;
  // Whether a chunk's priority after an access depends on its statistics before it (lfu's
  // count, score's count and moving average). lru's does not: an access sets last_access to a
  // new tick whatever came before, so TieredCache forgets uncached chunks' statistics.
  virtual bool RanksByHistory() const { return true; }
};

std::unique_ptr<CachePolicy> NewLruPolicy();
std::unique_ptr<CachePolicy> NewLfuPolicy();
std::unique_ptr<CachePolicy> NewScorePolicy();

// Maps a config name to a policy. Throws ConfigError naming `key` and listing the valid
// names when `name` is unknown.
std::unique_ptr<CachePolicy> NewCachePolicy(std::string_view name, std::string_view key);
std::vector<std::string> CachePolicyNames();
// The table's names with their one-line helps: the choices of cache.policy.
std::vector<Choice> CachePolicyChoices();

}  // namespace kvtier
