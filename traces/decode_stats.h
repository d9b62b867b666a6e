#pragma once
// Decode top-k statistics (`kvtier trace stats` on traces with decode top-k sets, extension
// tag 2, traces/FORMAT.md): how stable the output token's top-k is from one decode step to
// the next, and how much of it the speculative token's top-k (SpeCache's prefetched set)
// covers. Measured per (record, step, layer, KV head), for every k in `ks` (the sets are
// ranked, so the top-k' set of any k' below the recorded k is a prefix of the stored set):
//   step Jaccard at lag d : J(O_s, O_{s+d}), O_s the output token's exact top-k at step s
//                           (d = 1 is the step-to-step overlap; larger d show how fast the set
//                           drifts, what a generator's time structure has to reproduce);
//   step hit              : |O_s ∩ O_{s+1}| / |O_{s+1}|, the previous output token's exact set
//                           used as the prediction (what fetching without speculation but
//                           with the last step's own scores would cover);
//   spec hit              : |P_s ∩ O_s| / |O_s|, P_s the set prefetched for step s (chosen by
//                           step s-1's speculative token over the low-bit copy): the
//                           speculative hit rate by set overlap. Only with prefetched sets
//                           (absent in 16-bit decode recordings);
//   leading share         : per layer, the share of output sets at the smallest k that hold
//                           position t, for t < 16 (attention sinks: `trace fit --decode`).
// Samples with an empty set (no candidates yet) are skipped. Every distribution keeps its
// values exactly (they are ratios of small integers), so quantiles are exact; each also keeps
// the mean the same samples would have if the sets were drawn uniformly at random from the
// step's candidates (overlap |A||B|/n, Jaccard E/(|A|+|B|-E)), and its mean per layer.
// Not thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "traces/trace_format.h"

namespace kvtier {

struct DecodeStatsOptions {
  std::vector<int> ks;               // empty: 8, 16, 32, ... below the recorded k, and k itself
  std::vector<int> lags = {1, 2, 4, 8, 16};  // step distances of the step Jaccard
  std::int64_t max_records = 0;      // records with decode sets measured (0: all)
  bool distributions = true;  // false: means only (no quantiles or histograms; the fit's loop)
};

// The distribution of one overlap statistic over its samples.
struct OverlapDistribution {
  std::int64_t samples = 0;
  double sum = 0, random_sum = 0;
  bool keep_values = true;
  std::map<double, std::int64_t> values;  // value -> count (when keep_values)
  std::vector<double> layer_sum;
  std::vector<std::int64_t> layer_n;

  void Add(double value, double random, int layer);
  double Mean() const;        // NaN without samples
  double RandomMean() const;  // NaN without samples
  double Quantile(double q) const;  // the smallest value with at least q of the samples <= it
                                    // (NaN without kept values)
  double LayerMean(int layer) const;  // NaN without samples
  // Counts in 10 bins [i/10, (i+1)/10), the last one closed.
  std::vector<std::int64_t> Histogram() const;
};

struct DecodeStats {
  std::int64_t records = 0;  // records with decode sets measured
  std::int64_t steps = 0;    // decode steps in them
  int layers = 0, kv_heads = 0;
  int k = 0;                 // the largest recorded k
  bool has_prefetched = false;
  std::int64_t empty_sets = 0;  // (step, layer, head) output sets without candidates
  double candidates_mean = 0;   // mean candidates per step
  std::vector<int> ks, lags;
  // [k index][lag index]
  std::vector<std::vector<OverlapDistribution>> step_jaccard;
  // [k index]
  std::vector<OverlapDistribution> step_hit, spec_hit;
  // [layer][t], t < kLeadingPositions: share of output sets at ks[0] holding position t.
  static constexpr int kLeadingPositions = 16;
  std::vector<std::vector<double>> leading_share;

  double StepJaccard(std::size_t ki, std::size_t lag_index = 0) const {
    return step_jaccard[ki][lag_index].Mean();
  }
};

// Measures decode sets record by record (ks and lags fixed by the first record's k unless
// given).
class DecodeStatsAccumulator {
 public:
  explicit DecodeStatsAccumulator(DecodeStatsOptions options = {});
  // Adds one record's sets. Throws TraceError if its layers or KV heads differ from the first
  // record's (the reader already checks both against the header).
  void Add(const DecodeTopKSets& sets);
  bool empty() const { return stats_.records == 0; }
  bool full() const {
    return opt_.max_records > 0 && stats_.records >= opt_.max_records;
  }
  const DecodeStats& Result() const { return stats_; }

 private:
  void Init(const DecodeTopKSets& sets);
  DecodeStatsOptions opt_;
  DecodeStats stats_;
  double candidates_sum_ = 0;
  std::vector<std::vector<std::int64_t>> leading_hits_;  // [layer][t]
  std::vector<std::int64_t> leading_sets_;               // [layer]
  std::vector<std::int32_t> rank_;  // by position: rank in the current output set, or -1
};

// The default k list for a recorded k: 8, 16, 32, ... below k, then k (k itself when k < 8).
std::vector<int> DefaultDecodeKs(int k);

// |A ∩ B| of the first a positions of `x` and the first b of `y` (ranked sets of distinct
// positions); exposed for tests.
std::int64_t PrefixIntersection(const std::vector<std::int64_t>& x, std::size_t a,
                                const std::vector<std::int64_t>& y, std::size_t b);

// The decode block of `trace stats`: the table and the JSON object (at `indent`).
std::string FormatDecodeTable(const DecodeStats& stats);
std::string FormatDecodeJson(const DecodeStats& stats, const std::string& indent);

}  // namespace kvtier
