#include "traces/importance_stats.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/itf.h"

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

std::int64_t ChunksTouched(const std::vector<std::uint64_t>& mask, std::int64_t n, int chunk) {
  std::int64_t touched = 0, last = -1;
  for (std::size_t w = 0; w < mask.size(); ++w) {
    for (std::uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const std::int64_t t = std::int64_t(w) * 64 + std::countr_zero(bits);
      if (t >= n) return touched;
      const std::int64_t c = t / chunk;  // tokens ascend, so chunks do
      if (c != last) {
        ++touched;
        last = c;
      }
    }
  }
  return touched;
}

std::int64_t ChunksTouchedPacked(const std::vector<std::uint64_t>& mask,
                                 std::span<const std::int32_t> pos, int chunk) {
  thread_local std::vector<std::uint8_t> seen;
  seen.assign(pos.size() / std::size_t(chunk) + 1, 0);
  std::int64_t touched = 0;
  for (std::size_t w = 0; w < mask.size(); ++w) {
    for (std::uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const std::size_t t = w * 64 + std::size_t(std::countr_zero(bits));
      if (t >= pos.size()) break;
      const std::size_t c = std::size_t(pos[t]) / std::size_t(chunk);
      touched += seen[c] == 0;
      seen[c] = 1;
    }
  }
  return touched;
}

void PackingOrder(std::span<const double> weight, std::vector<std::int32_t>* pos) {
  std::vector<std::int32_t> order(weight.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return weight[a] > weight[b]; });
  pos->resize(weight.size());
  for (std::size_t i = 0; i < order.size(); ++i) (*pos)[order[i]] = std::int32_t(i);
}

double Pearson(std::span<const double> a, std::span<const double> b) {
  const std::size_t n = std::min(a.size(), b.size());
  if (n < 2) return std::numeric_limits<double>::quiet_NaN();
  double ma = 0, mb = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ma += a[i];
    mb += b[i];
  }
  ma /= double(n);
  mb /= double(n);
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  if (saa <= 0 || sbb <= 0) return std::numeric_limits<double>::quiet_NaN();
  return sab / std::sqrt(saa * sbb);
}

ImportanceAccumulator::ImportanceAccumulator(int layers, int kv_heads,
                                             ImportanceStatsOptions options)
    : layers_(layers),
      heads_(std::min(kv_heads, std::max(1, options.max_heads))),
      kv_heads_(kv_heads),
      opt_(options) {
  const std::size_t R = opt_.retentions.size();
  auto zeros = [&] { return std::vector<std::vector<double>>(R, std::vector<double>(layers_, 0)); };
  head_sum_ = zeros();
  random_sum_ = zeros();
  layer_sum_ = zeros();
  recall_sum_ = zeros();
  head_n_.assign(layers_, 0);
  layer_n_.assign(layers_, 0);
  s_jd_sum_.assign(std::max(0, layers_ - 1), 0);
  s_jd_n_.assign(std::max(0, layers_ - 1), 0);
  s_jp_sum_.assign(std::size_t(layers_) * layers_, 0);
  s_head_j_sum_.assign(layers_, 0);
  s_head_j2_sum_.assign(layers_, 0);
  s_head_j_n_.assign(layers_, 0);
}

void ImportanceAccumulator::AddRequest(std::uint64_t group, std::int64_t n, const ScoreFn& scores) {
  if (n < 2) return;
  const std::size_t R = opt_.retentions.size();
  std::vector<std::int64_t> ks(R);
  for (std::size_t r = 0; r < R; ++r) ks[r] = RetainedCount(opt_.retentions[r], n);
  const StructureStatsOptions& so = opt_.structure;
  const bool structure = so.enabled && n >= so.min_tokens;
  const int probes = std::clamp(so.itf_probe_heads, 0, kv_heads_);
  const std::int64_t s_k = structure ? RetainedCount(so.retention, n) : 0;
  const ItfOptions itf{probes, so.itf_alpha, so.retention};
  std::vector<std::vector<std::uint64_t>> s_sets, s_one;
  Kept itf_loads;  // what ITF loads (its itf_* members only)
  if (structure && probes >= 1) itf_loads.itf_weight.assign(std::size_t(n), 0.0f);
  // Rows fetched: the measured heads, and the probe heads when they are more.
  const int fetched = structure ? std::max(heads_, probes) : heads_;
  std::vector<int> heads(fetched);
  std::iota(heads.begin(), heads.end(), 0);
  std::vector<float> buf(static_cast<std::size_t>(fetched) * n);
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
    if (structure) {
      if (probes >= 1) {  // as the Pipeline: SelectItf on heads 0..P-1 (core/itf.h)
        const ItfDecision d = SelectItf(
            std::span<const float>(buf.data(), std::size_t(probes) * n), probes, n, itf);
        ++itf_layers_;
        itf_fallbacks_ += d.fallback ? 1 : 0;
        // What the layer loads, and its share of each token as RequestRun::AddKept records it.
        std::vector<std::uint64_t> loads(std::size_t((n + 63) / 64), 0);
        if (!d.fallback) {
          for (std::int32_t t : d.voted) {
            loads[std::size_t(t) / 64] |= std::uint64_t(1) << (t % 64);
            itf_loads.itf_weight[std::size_t(t)] += 1.0f;
          }
        } else {
          const float w = 1.0f / float(heads_);
          for (int h = 0; h < heads_; ++h) {
            TopKMasks(std::span<const float>(buf.data() + std::size_t(h) * n, std::size_t(n)),
                      std::span<const std::int64_t>(&s_k, 1), &s_one);
            for (std::size_t i = 0; i < loads.size(); ++i) {
              loads[i] |= s_one[0][i];
              for (std::uint64_t bits = s_one[0][i]; bits != 0; bits &= bits - 1) {
                itf_loads.itf_weight[i * 64 + std::size_t(std::countr_zero(bits))] += w;
              }
            }
          }
        }
        itf_loads.itf_masks.push_back(std::move(loads));
        itf_loads.itf_fallback.push_back(d.fallback ? 1 : 0);
        s_head_j_sum_[l] += d.similarity;
        s_head_j2_sum_[l] += d.similarity * d.similarity;
        ++s_head_j_n_[l];
      }
      TopKMasks(agg, std::span<const std::int64_t>(&s_k, 1), &s_one);
      s_sets.push_back(std::move(s_one[0]));
    }
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
  if (structure) AddStructure(group, n, std::move(s_sets), std::move(itf_loads));
}

void ImportanceAccumulator::AddStructure(std::uint64_t group, std::int64_t n,
                                         std::vector<std::vector<std::uint64_t>>&& sets,
                                         Kept&& itf) {
  const std::int64_t k = RetainedCount(opt_.structure.retention, n);
  ++s_requests_;
  for (int l = 0; l + 1 < layers_; ++l) {
    for (int d = 1; l + d < layers_; ++d) {
      const double i = double(MaskIntersection(sets[l], sets[l + d]));
      const double j = i / (2.0 * double(k) - i);
      s_jd_sum_[d - 1] += j;
      s_jp_sum_[std::size_t(l) * layers_ + l + d] += j;
      ++s_jd_n_[d - 1];
    }
  }
  s_random_sum_ += RandomSetJaccard(k, n);
  Kept kept;
  auto add_distance_bins = [&] {
    for (std::int64_t t = 0; t < n; ++t) {
      const std::size_t b = static_cast<std::size_t>(std::bit_width(std::uint64_t(n - t)) - 1) / 2;
      if (b >= s_fd_sum_.size()) {
        s_fd_sum_.resize(b + 1, 0);
        s_fd_n_.resize(b + 1, 0);
      }
      s_fd_sum_[b] += double(kept.count[t]) / double(layers_);
      ++s_fd_n_[b];
    }
  };
  kept.n = n;
  kept.count.assign(static_cast<std::size_t>(n), 0);
  for (const auto& m : sets) {
    for (std::size_t w = 0; w < m.size(); ++w) {
      for (std::uint64_t bits = m[w]; bits != 0; bits &= bits - 1) {
        ++kept.count[w * 64 + std::size_t(std::countr_zero(bits))];
      }
    }
  }
  add_distance_bins();
  // var(f) with f = count / L; the mean of f is exactly k / n (every layer keeps k tokens).
  const double p = double(k) / double(n), L = double(layers_);
  double m2 = 0;
  for (std::uint16_t c : kept.count) m2 += double(c) * double(c);
  const double var = std::max(0.0, m2 / double(n) / (L * L) - p * p);
  s_var_sum_ += var;
  if (p < 1) s_disp_sum_ += var / (p * (1 - p) / L);
  std::int64_t none = 0;
  for (std::uint16_t c : kept.count) none += c == 0 ? 1 : 0;
  s_none_sum_ += double(none) / double(n);
  auto it = kept_.find(group);
  if (it == kept_.end()) {
    if (static_cast<int>(kept_.size()) >= opt_.max_groups) return;
    it = kept_.emplace(group, std::vector<Kept>{}).first;
  }
  if (!it->second.empty() && it->second.front().n != n) return;  // REQUIRES violated: skip
  kept.masks = std::move(sets);
  kept.itf_masks = std::move(itf.itf_masks);
  kept.itf_fallback = std::move(itf.itf_fallback);
  kept.itf_weight = std::move(itf.itf_weight);
  it->second.push_back(std::move(kept));
}

StructureStats ImportanceAccumulator::StructureResult() const {
  const StructureStatsOptions& so = opt_.structure;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  StructureStats s;
  s.retention = so.retention;
  s.min_tokens = so.min_tokens;
  s.requests = s_requests_;
  s.jaccard_by_distance.assign(s_jd_sum_.size(), nan);
  for (std::size_t d = 0; d < s_jd_sum_.size(); ++d) {
    if (s_jd_n_[d] > 0) s.jaccard_by_distance[d] = s_jd_sum_[d] / double(s_jd_n_[d]);
  }
  s.layers = layers_;
  s.jaccard_by_pair.assign(std::size_t(layers_) * layers_, nan);
  for (int l = 0; l < layers_; ++l) {
    s.jaccard_by_pair[std::size_t(l) * layers_ + l] = 1;
    for (int l2 = l + 1; l2 < layers_ && s_requests_ > 0; ++l2) {
      const double j = s_jp_sum_[std::size_t(l) * layers_ + l2] / double(s_requests_);
      s.jaccard_by_pair[std::size_t(l) * layers_ + l2] = j;
      s.jaccard_by_pair[std::size_t(l2) * layers_ + l] = j;
    }
  }
  const double reqs = double(std::max<std::int64_t>(1, s_requests_));
  s.random_jaccard = s_requests_ ? s_random_sum_ / reqs : nan;
  s.dispersion = s_requests_ ? s_disp_sum_ / reqs : nan;
  s.f_mean_var = s_requests_ ? s_var_sum_ / reqs : nan;
  s.kept_by_none = s_requests_ ? s_none_sum_ / reqs : nan;
  for (std::size_t b = 0; b < s_fd_sum_.size(); ++b) {
    s.f_by_distance.push_back(s_fd_n_[b] ? s_fd_sum_[b] / double(s_fd_n_[b]) : nan);
  }
  s.itf_alpha = so.itf_alpha;
  s.itf_probe_heads = std::clamp(so.itf_probe_heads, 0, kv_heads_);
  s.itf_layers = itf_layers_;
  s.itf_fallbacks = itf_fallbacks_;
  double sim = 0, within = 0;
  std::int64_t sim_n = 0, within_n = 0;
  for (int l = 0; l < layers_; ++l) {
    const std::int64_t c = s_head_j_n_[l];
    if (c == 0) continue;
    sim += s_head_j_sum_[l];
    sim_n += c;
    const double m = s_head_j_sum_[l] / double(c);
    within += std::max(0.0, s_head_j2_sum_[l] / double(c) - m * m);
    ++within_n;
  }
  s.itf_similarity_by_layer.assign(layers_, nan);
  for (int l = 0; l < layers_; ++l) {
    if (s_head_j_n_[l] > 0) {
      s.itf_similarity_by_layer[l] = s_head_j_sum_[l] / double(s_head_j_n_[l]);
    }
  }
  s.itf_similarity_mean = sim_n ? sim / double(sim_n) : nan;
  s.itf_similarity_within_var = within_n ? within / double(within_n) : nan;

  // Cross-query correlation and packing, per tracked prefix group (in group-key order, so the
  // result does not depend on hash-map iteration order).
  s.chunk_sizes = so.chunk_sizes;
  const std::size_t C = so.chunk_sizes.size();
  std::vector<double> stored(C, 0), hist(C, 0), own(C, 0), itf_stored(C, 0), itf_hist(C, 0);
  bool itf_measured = false;
  std::vector<std::uint64_t> keys;
  for (const auto& [g, v] : kept_) keys.push_back(g);
  std::sort(keys.begin(), keys.end());
  double pearson_sum = 0, topk_sum = 0;
  std::int64_t pearson_n = 0;
  s.focus_lags = {1, 4, 16, 64, 256};
  std::vector<double> focus_sum(s.focus_lags.size(), 0), diff;
  std::vector<std::int64_t> focus_n(s.focus_lags.size(), 0);
  std::vector<double> fa, fb, weight;
  std::vector<std::int32_t> pos_hist, pos_own;
  std::vector<std::vector<std::uint64_t>> ma, mb;
  std::vector<float> fscore;
  for (std::uint64_t g : keys) {
    const std::vector<Kept>& reqs_g = kept_.at(g);
    if (reqs_g.size() < 2) continue;
    const std::int64_t n = reqs_g.front().n;
    const std::int64_t k = RetainedCount(so.retention, n);
    std::vector<std::vector<std::uint64_t>> topk(reqs_g.size());
    for (std::size_t i = 0; i < reqs_g.size(); ++i) {
      fscore.assign(reqs_g[i].count.begin(), reqs_g[i].count.end());
      TopKMasks(fscore, std::span<const std::int64_t>(&k, 1), &ma);
      topk[i] = std::move(ma[0]);
    }
    for (std::size_t i = 0; i < reqs_g.size(); ++i) {
      fa.assign(reqs_g[i].count.begin(), reqs_g[i].count.end());
      for (std::size_t j = i + 1; j < reqs_g.size(); ++j) {
        fb.assign(reqs_g[j].count.begin(), reqs_g[j].count.end());
        const double r = Pearson(fa, fb);
        const double inter = double(MaskIntersection(topk[i], topk[j]));
        ++s.pairs;
        topk_sum += inter / (2.0 * double(k) - inter);
        if (!std::isnan(r)) {
          pearson_sum += r;
          ++pearson_n;
        }
      }
    }
    std::vector<double> total(static_cast<std::size_t>(n), 0), itf_total(total);
    for (const Kept& q : reqs_g) {
      for (std::int64_t t = 0; t < n; ++t) total[t] += q.count[t];
      if (q.itf_weight.empty()) continue;
      for (std::int64_t t = 0; t < n; ++t) itf_total[t] += double(q.itf_weight[t]);
    }
    for (const Kept& q : reqs_g) {
      // Focus: d = f - mean f of the others (counts; the scale cancels), centred.
      const double others = double(reqs_g.size() - 1);
      diff.resize(static_cast<std::size_t>(n));
      double mean = 0;
      for (std::int64_t t = 0; t < n; ++t) {
        diff[t] = double(q.count[t]) - (total[t] - double(q.count[t])) / others;
        mean += diff[t];
      }
      mean /= double(n);
      double var = 0;
      for (double& v : diff) {
        v -= mean;
        var += v * v;
      }
      var /= double(n);
      for (std::size_t i = 0; i < s.focus_lags.size() && var > 0; ++i) {
        const std::int64_t h = s.focus_lags[i];
        if (h >= n) continue;
        double c = 0;
        for (std::int64_t t = 0; t + h < n; ++t) c += diff[t] * diff[t + h];
        focus_sum[i] += c / double(n - h) / var;
        ++focus_n[i];
      }
      weight.resize(static_cast<std::size_t>(n));
      for (std::int64_t t = 0; t < n; ++t) weight[t] = total[t] - q.count[t];
      PackingOrder(weight, &pos_hist);
      for (std::int64_t t = 0; t < n; ++t) weight[t] = q.count[t];
      PackingOrder(weight, &pos_own);
      ++s.history_requests;
      for (std::size_t c = 0; c < C; ++c) {
        const int chunk = so.chunk_sizes[c];
        for (const auto& m : q.masks) {
          stored[c] += double(ChunksTouched(m, n, chunk));
          hist[c] += double(ChunksTouchedPacked(m, pos_hist, chunk));
          own[c] += double(ChunksTouchedPacked(m, pos_own, chunk));
        }
      }
      // ITF's loads, packed by the other requests' ITF history (every request of a group has
      // them or none does: the probe heads are the trace's).
      if (q.itf_masks.empty()) continue;
      itf_measured = true;
      for (std::int64_t t = 0; t < n; ++t) {
        weight[t] = double(itf_total[t]) - double(q.itf_weight[t]);
      }
      PackingOrder(weight, &pos_hist);
      for (std::size_t c = 0; c < C; ++c) {
        const int chunk = so.chunk_sizes[c];
        const double all = double((n + chunk - 1) / chunk);
        for (std::size_t l = 0; l < q.itf_masks.size(); ++l) {
          const auto& m = q.itf_masks[l];
          const double s0 = double(ChunksTouched(m, n, chunk));
          const double p0 = double(ChunksTouchedPacked(m, pos_hist, chunk));
          // A fallback layer's keys are every chunk in any layout; its values the union's.
          itf_stored[c] += q.itf_fallback[l] ? (all + s0) / 2 : s0;
          itf_hist[c] += q.itf_fallback[l] ? (all + p0) / 2 : p0;
        }
      }
    }
  }
  for (std::size_t i = 0; i < s.focus_lags.size(); ++i) {
    s.focus_autocorr.push_back(focus_n[i] ? focus_sum[i] / double(focus_n[i]) : nan);
  }
  s.f_pearson = pearson_n ? pearson_sum / double(pearson_n) : nan;
  s.f_topk_jaccard = s.pairs ? topk_sum / double(s.pairs) : nan;
  const double denom = double(s.history_requests) * double(layers_);
  s.chunks_stored.assign(C, nan);
  s.chunks_history.assign(C, nan);
  s.chunks_own.assign(C, nan);
  s.chunks_itf_stored.assign(C, nan);
  s.chunks_itf_history.assign(C, nan);
  if (s.history_requests > 0) {
    for (std::size_t c = 0; c < C; ++c) {
      s.chunks_stored[c] = stored[c] / denom;
      s.chunks_history[c] = hist[c] / denom;
      s.chunks_own[c] = own[c] / denom;
      if (!itf_measured) continue;
      s.chunks_itf_stored[c] = itf_stored[c] / denom;
      s.chunks_itf_history[c] = itf_hist[c] / denom;
    }
  }
  return s;
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
  if (opt_.structure.enabled) s.structure = StructureResult();
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

double StructureStats::HistorySaving(std::size_t c) const {
  if (c >= chunks_stored.size() || !(chunks_stored[c] > 0)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return 1.0 - chunks_history[c] / chunks_stored[c];
}
double StructureStats::OwnSaving(std::size_t c) const {
  if (c >= chunks_stored.size() || !(chunks_stored[c] > 0)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return 1.0 - chunks_own[c] / chunks_stored[c];
}
double StructureStats::ItfHistorySaving(std::size_t c) const {
  if (c >= chunks_itf_stored.size() || !(chunks_itf_stored[c] > 0)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return 1.0 - chunks_itf_history[c] / chunks_itf_stored[c];
}
double StructureStats::FallbackRate() const {
  return itf_layers ? double(itf_fallbacks) / double(itf_layers)
                    : std::numeric_limits<double>::quiet_NaN();
}
double StructureStats::JaccardAt(int d) const {
  if (d < 1 || d > int(jaccard_by_distance.size())) return std::numeric_limits<double>::quiet_NaN();
  return jaccard_by_distance[std::size_t(d) - 1];
}

}  // namespace kvtier
