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
// Structure statistics (StructureStats), at one retention r (default 0.25), over requests
// with n >= min_tokens (64) reusable tokens, k = ceil(r n), layer sets S_l as above:
//   Jaccard by layer distance d : mean over requests and l of J(S_l, S_{l+d}), d = 1..L-1;
//   dispersion   : f_t = |{l : t in S_l}| / L; var over tokens of f_t divided by the binomial
//                  variance p(1-p)/L, p = k/n (1: layers choose independently); mean over
//                  requests;
//   kept by none : share of the tokens no layer set keeps (f_t = 0), mean over requests: the
//                  lower end of f's distribution, which var(f) alone does not fix (at the same
//                  dispersion, a right-skewed f keeps more tokens in some layer);
//   cross-query  : for pairs of requests with an identical prefix, the Pearson correlation of
//                  their f, and the Jaccard of their top-k tokens by f (ties to the lower index);
//   chunks touched per layer : |{floor(pos(t)/C) : t in S_l}|, mean over layers and requests,
//                  stored order pos(t) = t; history packing: pos = rank of t by the summed f of
//                  the *other* sampled requests of the same prefix (descending, stable), for
//                  requests with at least one such other request; own packing (oracle): rank
//                  by the request's own f. Saving = 1 - packed / stored (sums over the same
//                  requests). The numbers behind SPEC's KV reordering (§V-B, Fig. 20);
//   recency      : mean f by distance from the end of the prefix, in bins [4^i - 1, 4^(i+1) - 1);
//   layer pairs  : mean over requests of J(S_l, S_l') for every pair of layers (the matrix the
//                  distance curve averages along its diagonals);
//   cross-query focus : for a request with other sampled requests of its prefix, d_t = f_t
//                  minus the mean f_t of the others; the autocorrelation of d along positions
//                  at lags 1, 4, 16, 64, 256 (mean over requests with n > lag): how far the
//                  tokens one query favours over the others extend (a document, or a token);
//   ITF fallback : share of (request, layer) where core/itf.h SelectItf on the first P KV
//                  heads (retention r, alpha) falls back, exactly as the Pipeline decides;
//   packing of ITF's loads : the history packing saving above, measured on what an ITF system
//                  loads (the sets the reorderer packs online, core/reorderer.h): a layer where
//                  ITF passes loads its voted set (K and V); a layer where it falls back loads
//                  every key (every chunk, in any layout) and the values of the union of the
//                  measured heads' own top-k (H2O), so a chunk there counts as (all + union) / 2.
//                  The history is the other sampled requests' summed share of layers keeping
//                  each token, as the Pipeline records it (1 per voted token; 1/H per head's
//                  token on a fallback layer). This, not the saving of summed-score sets, is
//                  what reordering an ITF system can deliver: fallback layers gain almost
//                  nothing (docs/paper-comparison.md, "Reordering that pays").
// Definitions and the measured real-model values: docs/real-model-observations.md.
// Not thread-safe.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvtier {

struct StructureStatsOptions {
  bool enabled = true;
  double retention = 0.25;
  std::int64_t min_tokens = 64;  // requests with fewer reusable tokens are not measured
  std::vector<int> chunk_sizes = {16, 32, 64, 128, 256};
  double itf_alpha = 0.6;
  int itf_probe_heads = 3;  // clamped to the model's KV heads
};

struct ImportanceStatsOptions {
  std::vector<double> retentions = {0.10, 0.25, 0.40};
  int max_heads = 16;     // heads per layer measured (the first ones)
  int max_groups = 16;    // prefix groups whose static sets (and packing history) are kept
  StructureStatsOptions structure;
};

struct StructureStats {
  double retention = 0;
  std::int64_t min_tokens = 0;
  std::int64_t requests = 0;  // requests measured (n >= min_tokens)
  // [d - 1] for d = 1..L-1: mean Jaccard of layer sets d layers apart; NaN without samples.
  std::vector<double> jaccard_by_distance;
  int layers = 0;
  // [l * layers + l'], l != l': mean Jaccard of the layer sets of layers l and l' (symmetric;
  // 1 on the diagonal; NaN without samples).
  std::vector<double> jaccard_by_pair;
  double random_jaccard = 0;  // mean over requests of (k^2/n) / (2k - k^2/n)
  double dispersion = 0;      // mean over requests of var(f) / (p(1-p)/L)
  double f_mean_var = 0;      // mean over requests of var(f) (for the fit)
  double kept_by_none = 0;    // mean over requests of the share of tokens with f = 0
  // Recency: mean f of tokens at distance [4^i - 1, 4^(i+1) - 1) from the end of the prefix
  // (0-2, 3-14, 15-62, 63-254, ...); NaN where no token was that far.
  std::vector<double> f_by_distance;
  std::int64_t pairs = 0;     // request pairs with an identical prefix
  double f_pearson = 0;       // mean over pairs; NaN without pairs
  double f_topk_jaccard = 0;  // mean over pairs; NaN without pairs
  // Cross-query focus: autocorrelation of f minus the other requests' mean f at focus_lags
  // (NaN where no request was longer than the lag).
  std::vector<int> focus_lags;
  std::vector<double> focus_autocorr;
  std::vector<int> chunk_sizes;
  std::int64_t history_requests = 0;  // requests with another sampled request of their prefix
  // [chunk size]: mean chunks touched per layer over the history requests.
  std::vector<double> chunks_stored, chunks_history, chunks_own;
  // [chunk size]: the same for what ITF loads (see above; NaN without probe heads), over the
  // same requests: K and V chunks per layer / 2.
  std::vector<double> chunks_itf_stored, chunks_itf_history;
  double itf_alpha = 0;
  int itf_probe_heads = 0;
  std::int64_t itf_layers = 0, itf_fallbacks = 0;
  // The probe heads' similarity s (mean pairwise Jaccard) per (request, layer): its mean, and
  // its variance around each layer's mean, averaged over layers (how much head agreement
  // varies from request to request; what makes ITF fall back in some layers).
  double itf_similarity_mean = 0, itf_similarity_within_var = 0;
  std::vector<double> itf_similarity_by_layer;  // [layer]: mean s; NaN without samples

  // 1 - packed / stored; NaN without history requests.
  double HistorySaving(std::size_t chunk_index) const;
  double OwnSaving(std::size_t chunk_index) const;
  double ItfHistorySaving(std::size_t chunk_index) const;  // of ITF's loads
  double FallbackRate() const;  // NaN when no layer was measured
  double JaccardAt(int d) const;  // d >= 1; NaN outside the curve
  double PairJaccard(int l, int l2) const { return jaccard_by_pair[std::size_t(l) * layers + l2]; }
};

struct ImportanceStats {
  std::vector<double> retentions;
  int layers = 0;
  std::int64_t requests = 0;            // requests measured
  std::int64_t recall_samples = 0;      // later requests of a tracked prefix group
  // [retention][layer]
  std::vector<std::vector<double>> head_jaccard, random_jaccard, layer_jaccard, spi_recall;
  std::optional<StructureStats> structure;  // when options.structure.enabled

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

// Chunks of `chunk` positions touched by the set bits of `mask` (stored order pos(t) = t).
std::int64_t ChunksTouched(const std::vector<std::uint64_t>& mask, std::int64_t n, int chunk);
// Chunks touched by the set bits of `mask` when token t sits at position pos[t].
std::int64_t ChunksTouchedPacked(const std::vector<std::uint64_t>& mask,
                                 std::span<const std::int32_t> pos, int chunk);
// pos[t] = rank of t when tokens are ordered by `weight` descending, ties to the lower index.
void PackingOrder(std::span<const double> weight, std::vector<std::int32_t>* pos);
// Pearson correlation of two equally long vectors; NaN when either is constant.
double Pearson(std::span<const double> a, std::span<const double> b);

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
  // What the packing and cross-query statistics keep of one request of a tracked group.
  struct Kept {
    std::int64_t n = 0;
    std::vector<std::uint16_t> count;                 // |{l : t in S_l}|
    std::vector<std::vector<std::uint64_t>> masks;    // S_l per layer
    // What ITF loads per layer (empty without probe heads): the voted set where it passed,
    // the union of the measured heads' top-k where it fell back (itf_fallback[l] = 1).
    std::vector<std::vector<std::uint64_t>> itf_masks;
    std::vector<std::uint8_t> itf_fallback;
    std::vector<float> itf_weight;  // per token: the Pipeline's kept share, summed over layers
  };
  void AddStructure(std::uint64_t group, std::int64_t n,
                    std::vector<std::vector<std::uint64_t>>&& layer_sets, Kept&& itf);
  StructureStats StructureResult() const;

  int layers_, heads_, kv_heads_;
  ImportanceStatsOptions opt_;
  std::int64_t requests_ = 0, recall_samples_ = 0;
  std::vector<std::vector<double>> head_sum_, random_sum_, layer_sum_, recall_sum_;
  std::vector<std::int64_t> head_n_, layer_n_;
  // Structure statistics.
  std::int64_t s_requests_ = 0, itf_layers_ = 0, itf_fallbacks_ = 0;
  std::vector<double> s_jd_sum_, s_fd_sum_;
  std::vector<std::int64_t> s_fd_n_;
  std::vector<std::int64_t> s_jd_n_;
  std::vector<double> s_jp_sum_;  // [l * L + l'], l < l'
  double s_random_sum_ = 0, s_disp_sum_ = 0, s_var_sum_ = 0, s_none_sum_ = 0;
  std::vector<double> s_head_j_sum_, s_head_j2_sum_;  // per layer, structure retention
  std::vector<std::int64_t> s_head_j_n_;
  std::unordered_map<std::uint64_t, std::vector<Kept>> kept_;
  // group -> masks[(layer * heads + h) * R + r]
  std::unordered_map<std::uint64_t, std::vector<std::vector<std::uint64_t>>> static_sets_;
};

}  // namespace kvtier
