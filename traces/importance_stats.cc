#include "traces/importance_stats.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace kvtier {

std::int64_t RetainedCount(double retention, std::int64_t n) {
  if (n <= 0) return 0;
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(retention * double(n) - 1e-9)),
                                  1, n);
}

double RandomSetJaccard(std::int64_t k, std::int64_t n) {
  if (k <= 0 || n <= 0) return 0;
  if (k >= n) return 1;
  const double kk = double(k) * double(k) / double(n);
  return kk / (2.0 * double(k) - kk);
}

void TopKMasks(std::span<const float> scores, std::span<const std::int64_t> ks,
               std::vector<std::vector<std::uint64_t>>* masks) {
  const std::int64_t n = static_cast<std::int64_t>(scores.size());
  thread_local std::vector<std::uint64_t> keys;
  keys.resize(static_cast<std::size_t>(n));
  // Larger key = larger score, then lower index. Scores are >= 0, so float bits order as uints.
  for (std::int64_t t = 0; t < n; ++t) {
    keys[t] = (std::uint64_t(std::bit_cast<std::uint32_t>(scores[t])) << 32) |
              (0xFFFFFFFFu - static_cast<std::uint32_t>(t));
  }
  std::vector<std::size_t> order(ks.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ks[a] > ks[b]; });
  masks->resize(ks.size());
  std::int64_t bound = n;  // keys[0..bound) hold the current top set
  for (std::size_t i : order) {
    const std::int64_t k = std::clamp<std::int64_t>(ks[i], 0, n);
    if (k < bound && k > 0) {
      std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.begin() + bound,
                       std::greater<std::uint64_t>());
    }
    bound = k;
    auto& m = (*masks)[i];
    m.assign(static_cast<std::size_t>((n + 63) / 64), 0);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::uint32_t t = 0xFFFFFFFFu - static_cast<std::uint32_t>(keys[j]);
      m[t >> 6] |= std::uint64_t{1} << (t & 63);
    }
  }
}

std::int64_t MaskIntersection(const std::vector<std::uint64_t>& a,
                              const std::vector<std::uint64_t>& b) {
  std::int64_t c = 0;
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) c += std::popcount(a[i] & b[i]);
  return c;
}

ImportanceAccumulator::ImportanceAccumulator(int layers, int kv_heads,
                                             ImportanceStatsOptions options)
    : layers_(layers), heads_(std::min(kv_heads, std::max(1, options.max_heads))), opt_(options) {
  const std::size_t R = opt_.retentions.size();
  auto zeros = [&] { return std::vector<std::vector<double>>(R, std::vector<double>(layers_, 0)); };
  head_sum_ = zeros();
  random_sum_ = zeros();
  layer_sum_ = zeros();
  recall_sum_ = zeros();
  head_n_.assign(layers_, 0);
  layer_n_.assign(layers_, 0);
}

void ImportanceAccumulator::AddRequest(std::uint64_t group, std::int64_t n, const ScoreFn& scores) {
  if (n < 2) return;
  const std::size_t R = opt_.retentions.size();
  std::vector<std::int64_t> ks(R);
  for (std::size_t r = 0; r < R; ++r) ks[r] = RetainedCount(opt_.retentions[r], n);
  std::vector<int> heads(heads_);
  std::iota(heads.begin(), heads.end(), 0);
  std::vector<float> buf(static_cast<std::size_t>(heads_) * n);
  std::vector<float> agg(static_cast<std::size_t>(n));
  // masks[h][r]
  std::vector<std::vector<std::vector<std::uint64_t>>> masks(heads_);
  std::vector<std::vector<std::uint64_t>> layer_masks, prev_layer_masks;

  auto it = static_sets_.find(group);
  const bool known = it != static_sets_.end();
  std::vector<std::vector<std::uint64_t>>* static_sets = nullptr;
  bool record_static = false;
  if (known) {
    static_sets = &it->second;
    ++recall_samples_;
  } else if (static_cast<int>(static_sets_.size()) < opt_.max_groups) {
    static_sets = &static_sets_[group];
    static_sets->resize(static_cast<std::size_t>(layers_) * heads_ * R);
    record_static = true;
  }

  for (int l = 0; l < layers_; ++l) {
    scores(l, heads, buf.data());
    std::fill(agg.begin(), agg.end(), 0.0f);
    for (int h = 0; h < heads_; ++h) {
      std::span<const float> row(buf.data() + std::size_t(h) * n, static_cast<std::size_t>(n));
      TopKMasks(row, ks, &masks[h]);
      double sum = 0;
      for (float s : row) sum += s;
      const float inv = sum > 0 ? float(1.0 / sum) : 0.0f;
      for (std::int64_t t = 0; t < n; ++t) agg[t] += row[t] * inv;
      if (static_sets) {
        for (std::size_t r = 0; r < R; ++r) {
          auto& s = (*static_sets)[(std::size_t(l) * heads_ + h) * R + r];
          if (record_static) {
            s = masks[h][r];
          } else if (known) {
            recall_sum_[r][l] += double(MaskIntersection(s, masks[h][r])) / double(ks[r]) / heads_;
          }
        }
      }
    }
    for (std::size_t r = 0; r < R; ++r) {
      if (heads_ >= 2) {
        double js = 0;
        int pairs = 0;
        for (int a = 0; a < heads_; ++a) {
          for (int b = a + 1; b < heads_; ++b) {
            const double i = double(MaskIntersection(masks[a][r], masks[b][r]));
            js += i / (2.0 * double(ks[r]) - i);
            ++pairs;
          }
        }
        head_sum_[r][l] += js / pairs;
      } else {
        head_sum_[r][l] += 1;
      }
      random_sum_[r][l] += RandomSetJaccard(ks[r], n);
    }
    ++head_n_[l];
    TopKMasks(agg, ks, &layer_masks);
    if (l > 0) {
      for (std::size_t r = 0; r < R; ++r) {
        const double i = double(MaskIntersection(prev_layer_masks[r], layer_masks[r]));
        layer_sum_[r][l - 1] += i / (2.0 * double(ks[r]) - i);
      }
      ++layer_n_[l - 1];
    }
    std::swap(prev_layer_masks, layer_masks);
  }
  ++requests_;
}

ImportanceStats ImportanceAccumulator::Result() const {
  ImportanceStats s;
  s.retentions = opt_.retentions;
  s.layers = layers_;
  s.requests = requests_;
  s.recall_samples = recall_samples_;
  const std::size_t R = opt_.retentions.size();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto div = [&](const std::vector<std::vector<double>>& sum, auto count) {
    std::vector<std::vector<double>> out(R, std::vector<double>(layers_, nan));
    for (std::size_t r = 0; r < R; ++r) {
      for (int l = 0; l < layers_; ++l) {
        const double c = double(count(l));
        if (c > 0) out[r][l] = sum[r][l] / c;
      }
    }
    return out;
  };
  s.head_jaccard = div(head_sum_, [&](int l) { return head_n_[l]; });
  s.random_jaccard = div(random_sum_, [&](int l) { return head_n_[l]; });
  s.layer_jaccard = div(layer_sum_, [&](int l) { return layer_n_[l]; });
  s.spi_recall = div(recall_sum_, [&](int) { return recall_samples_; });
  return s;
}

namespace {
double MeanOf(const std::vector<double>& v, std::size_t count) {
  double s = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < std::min(count, v.size()); ++i) {
    if (!std::isnan(v[i])) {
      s += v[i];
      ++n;
    }
  }
  return n ? s / double(n) : std::numeric_limits<double>::quiet_NaN();
}
}  // namespace

double ImportanceStats::MeanHeadJaccard(std::size_t r) const { return MeanOf(head_jaccard[r], layers); }
double ImportanceStats::MeanRandomJaccard(std::size_t r) const {
  return MeanOf(random_jaccard[r], layers);
}
double ImportanceStats::MeanLayerJaccard(std::size_t r) const {
  return MeanOf(layer_jaccard[r], layers > 0 ? layers - 1 : 0);
}
double ImportanceStats::MeanRecall(std::size_t r) const { return MeanOf(spi_recall[r], layers); }

}  // namespace kvtier
