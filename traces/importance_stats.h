#pragma once
// Importance statistics of a trace (the numbers of SPEC Observations I-III, §IV-B/§IV-C),
// measured request by request with bounded memory. Used by `kvtier trace stats`, by
// `trace fit`, and by the generator's calibration, so all three measure the same thing:
//   head Jaccard  : per layer, mean pairwise Jaccard of the heads' top-k sets (k = ceil(r*n),
//                   ties to the lower index), over up to `max_heads` heads (the first ones);
//   random        : the random-selection expectation (k^2/n) / (2k - k^2/n) (§IV-B);
//   layer Jaccard : Jaccard of the layer sets of adjacent layers l, l+1, where a layer set is
//                   the top-k of the per-token sum over heads of row-normalised scores;
//   SPI recall    : for requests with an identical prefix, the first one's per-head top-k sets
//                   are the statically pre-identified sets; a later request's recall is
//                   |static ∩ own| / k, averaged over layers and heads (§III-A, Fig. 4).
// Not thread-safe.

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvtier {

struct ImportanceStatsOptions {
  std::vector<double> retentions = {0.10, 0.25, 0.40};
  int max_heads = 16;     // heads per layer measured (the first ones)
  int max_groups = 16;    // prefix groups whose static sets are kept for SPI recall
};

struct ImportanceStats {
  std::vector<double> retentions;
  int layers = 0;
  std::int64_t requests = 0;            // requests measured
  std::int64_t recall_samples = 0;      // later requests of a tracked prefix group
  // [retention][layer]
  std::vector<std::vector<double>> head_jaccard, random_jaccard, layer_jaccard, spi_recall;

  double MeanHeadJaccard(std::size_t r) const;
  double MeanRandomJaccard(std::size_t r) const;
  double MeanLayerJaccard(std::size_t r) const;  // over layers 0..L-2
  double MeanRecall(std::size_t r) const;        // NaN when no samples
};

// Top-k mask of `scores` as bits (n bits, word-packed); ties prefer the lower index.
// Computes several k at once (ks descending not required); masks[i] gets the top ks[i].
void TopKMasks(std::span<const float> scores, std::span<const std::int64_t> ks,
               std::vector<std::vector<std::uint64_t>>* masks);
std::int64_t MaskIntersection(const std::vector<std::uint64_t>& a,
                              const std::vector<std::uint64_t>& b);
// (k^2/n) / (2k - k^2/n); 1 when k == n.
double RandomSetJaccard(std::int64_t k, std::int64_t n);
std::int64_t RetainedCount(double retention, std::int64_t n);  // ceil(r*n) in [1, n]

class ImportanceAccumulator {
 public:
  // Fills out[j * n + t] for heads[j] of `layer`, tokens 0..n-1.
  using ScoreFn = std::function<void(int layer, std::span<const int> heads, float* out)>;

  ImportanceAccumulator(int layers, int kv_heads, ImportanceStatsOptions options = {});

  // Measures one request with n reusable tokens. `group` identifies the prefix (equal for
  // identical prefixes); requests of one group must have the same n.
  void AddRequest(std::uint64_t group, std::int64_t n, const ScoreFn& scores);
  ImportanceStats Result() const;

 private:
  int layers_, heads_;
  ImportanceStatsOptions opt_;
  std::int64_t requests_ = 0, recall_samples_ = 0;
  std::vector<std::vector<double>> head_sum_, random_sum_, layer_sum_, recall_sum_;
  std::vector<std::int64_t> head_n_, layer_n_;
  // group -> masks[(layer * heads + h) * R + r]
  std::unordered_map<std::uint64_t, std::vector<std::vector<std::uint64_t>>> static_sets_;
};

}  // namespace kvtier
