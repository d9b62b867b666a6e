#pragma once
// Important-token selection: SPEC's similarity-guided identification (ITF, §IV-B) and the H2O
// per-head selection the baselines use. Pure functions over score matrices; no I/O, no clock.
// Token indices are positions in the reusable prefix R in original order, 0 <= t < n.
//
// ITF, for one layer with n reusable tokens and retention ratio r:
//   k = RetainedTokens(r, n); each probe head's top-k set; mean pairwise Jaccard s;
//   j = (k^2/n) / (2k - k^2/n)   (expected Jaccard of two random k-of-n sets, §IV-B);
//   t = j^alpha                  (alpha = 0.6 in the paper);
//   s >= t -> pass: one voted set of k tokens shared by all heads (load K and V of those rows
//             for every head);
//   s <  t -> fallback: load every head's keys and select per head (H2O), like the baselines.

#include <cstdint>
#include <span>
#include <vector>

namespace kvtier {

using TokenSet = std::vector<std::int32_t>;  // sorted ascending, unique

struct ItfOptions {
  int probe_heads = 3;      // first `probe_heads` KV heads of each layer (§IV-B)
  double alpha = 0.6;       // threshold exponent
  double retention = 0.25;  // fraction of R kept per layer, in (0, 1]
};

// k = ceil(retention * n), clamped to [1, n]; 0 when n == 0.
std::int64_t RetainedTokens(double retention, std::int64_t n);

// |A ∩ B| / |A ∪ B| of two sorted sets; 1 when both are empty. Jaccard({0,2},{0,1}) = 1/3.
double Jaccard(const TokenSet& a, const TokenSet& b);

// j = (k^2/n) / (2k - k^2/n); 1 when k == n; 0 when k == 0.
double RandomJaccard(std::int64_t k, std::int64_t n);

// t = j^alpha. alpha = 0 gives t = 1 (ITF only passes on identical sets).
double ItfThreshold(std::int64_t k, std::int64_t n, double alpha);

// Indices of the k largest scores, sorted ascending; ties prefer the lower index; NaN ranks
// below every number.
// REQUIRES: 0 <= k <= scores.size().
TokenSet TopK(std::span<const float> scores, std::int64_t k);

// Mean Jaccard over all pairs of sets (1 when fewer than two sets).
double MeanPairwiseJaccard(const std::vector<TokenSet>& sets);

struct ItfDecision {
  bool fallback = false;
  double similarity = 0;          // mean pairwise Jaccard of the probe heads' top-k sets
  double threshold = 0;           // j^alpha
  std::int64_t k = 0;
  TokenSet voted;                 // the shared important set (pass only), |voted| = k
  std::vector<TokenSet> probe_sets;  // each probe head's top-k
};

// Runs ITF on the probe heads' scores: `probe_scores` holds probe_heads rows of n scores.
// The voted set ranks tokens by (number of probe heads selecting them desc, score summed over
// all probe heads desc, index asc) and keeps the first k. Pass iff similarity >= threshold.
// REQUIRES: probe_scores.size() == probe_heads * n, n >= 1.
ItfDecision SelectItf(std::span<const float> probe_scores, int probe_heads, std::int64_t n,
                      const ItfOptions& options);

// As SelectItf, but votes on a fallback too: `voted` then holds the set a pass would have used.
// A selection memo stores this, so one memo serves every alpha (alpha only moves the threshold).
ItfDecision SelectItfAndVote(std::span<const float> probe_scores, int probe_heads,
                             std::int64_t n, const ItfOptions& options);

// SelectItf (always_vote false) or SelectItfAndVote (true) without `probe_sets` (left empty):
// the same fallback, similarity, threshold and voted set, cheaper (no per-head sets are built
// for up to 8 probe heads). What ScoreSource::Itf runs: the Pipeline never reads the sets.
ItfDecision ItfDecisionOnly(std::span<const float> probe_scores, int probe_heads, std::int64_t n,
                            const ItfOptions& options, bool always_vote);

// H2O selection: each of `heads` rows of n scores gives its own top-k set.
std::vector<TokenSet> SelectPerHead(std::span<const float> scores, int heads, std::int64_t n,
                                    std::int64_t k);

// H2O selection, counted: (*counts)[t] (resized to n) = how many of the `heads` rows keep token
// t in their top-k -- what SelectPerHead's sets give counted, without building them.
// REQUIRES: scores.size() == heads * n, 0 <= k <= n, heads <= 65535.
void CountTopKPerHead(std::span<const float> scores, int heads, std::int64_t n, std::int64_t k,
                      std::vector<std::uint16_t>* counts);

// The tokens t < of.size() with of[t] != 0, in order, into *tokens, and their of[t] into
// *counts (both resized to that many): a kCounted selection's union and head counts
// (core/selection.h Selection::FromCounts).
void CollectCounted(std::span<const std::uint16_t> of, TokenSet* tokens,
                    std::vector<std::uint16_t>* counts);

// Union of sets, sorted.
TokenSet Union(const std::vector<TokenSet>& sets);

// Vector counts of one layer's loads in the paper's unit (one head's key or value of one
// token), for the Fig. 9 comparison: without ITF a layer loads every head's keys and then the
// selected values; with ITF (passing) it loads the probe heads' keys, then K and V of the
// voted tokens for every head. Fig. 9: n = 4, 32 heads, 3 probe heads, k = 1 -> 160 vs 76.
// A fallback layer loads the probe keys and then everything the layer without ITF loads
// (probe_heads * n more vectors than without ITF: 172 in the Fig. 9 setting).
struct LayerVectorCount {
  std::int64_t probe_keys = 0;
  std::int64_t keys = 0;
  std::int64_t values = 0;
  std::int64_t total() const { return probe_keys + keys + values; }
};
LayerVectorCount CountVectorsWithoutItf(std::int64_t n, int heads, std::int64_t k);
LayerVectorCount CountVectorsWithItf(std::int64_t n, int heads, int probe_heads,
                                     std::int64_t k, bool fallback);

}  // namespace kvtier
