#include "traces/importance_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <sstream>

#include "core/check.h"
#include "core/errors.h"
#include "traces/hash.h"

namespace kvtier {
namespace {

constexpr std::uint64_t kTagStaticAnchor = 0x51;
constexpr std::uint64_t kTagQueryAnchor = 0x52;
constexpr std::uint64_t kTagStaticHead = 0x53;
constexpr std::uint64_t kTagQueryHead = 0x54;

// Two 16-bit halves summed: triangular on [-1, 1] (variance 1/6), scaled to unit variance.
// Closer to Gaussian than one uniform, so mixtures of components keep nearly the same shape
// and head/layer similarity depend on correlations, not on how many components are mixed.
constexpr float kUnitScale = 2.449489742783178f / 65535.0f;

inline float Unit(std::uint32_t h) {
  return (static_cast<float>(h & 0xFFFFu) + static_cast<float>(h >> 16) - 65535.0f) * kUnitScale;
}

// 2^y, monotone piecewise-linear (Schraudolph): exact at integers, within 6% in between. Only
// ranks and heavy-tailedness matter here, and it vectorises. y is clamped to [-120, 120].
inline float FastExp2(float y) {
  y = std::clamp(y, -120.0f, 120.0f);
  const std::int32_t bits = static_cast<std::int32_t>(y * 8388608.0f) + (127 << 23);
  return std::bit_cast<float>(bits);
}

std::uint32_t Salt(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return static_cast<std::uint32_t>(hash::Combine(hash::Combine(hash::Combine(a, b), c), d));
}

// out[t] = ca * U(salt_a, t) + cb * U(salt_b, t), prefix-keyed (token keys).
__attribute__((optimize("O3"))) void AnchorMixStatic(const std::uint32_t* keys, std::int64_t n,
                                                       std::uint32_t sa, std::uint32_t sb,
                                                       float ca, float cb, float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    out[t] = ca * Unit(hash::Hash32(keys[t] ^ sa)) + cb * Unit(hash::Hash32(keys[t] ^ sb));
  }
}

// out[t] += ca * U(salt_a + t*G) + cb * U(salt_b + t*G), query-keyed (token positions).
__attribute__((optimize("O3"))) void AnchorMixQuery(std::int64_t n, std::uint32_t sa,
                                                      std::uint32_t sb, float ca, float cb,
                                                      float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint32_t g = static_cast<std::uint32_t>(t) * 0x9E3779B9u;
    out[t] += ca * Unit(hash::Hash32(sa + g)) + cb * Unit(hash::Hash32(sb + g));
  }
}

__attribute__((optimize("O3"))) void HeadRow(const std::uint32_t* keys, const float* common,
                                             std::int64_t n, std::uint32_t ss, std::uint32_t sq,
                                             float es, float eq, float* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint32_t g = static_cast<std::uint32_t>(t) * 0x9E3779B9u;
    const float z = common[t] + es * Unit(hash::Hash32(keys[t] ^ ss)) +
                    eq * Unit(hash::Hash32(sq + g));
    out[t] = FastExp2(z);
  }
}

}  // namespace

void ProceduralParams::Validate(const std::string& where) const {
  auto bad = [&](const std::string& what) { throw InputError(where + ": " + what); };
  if (head_corr.empty()) bad("head_corr: empty profile");
  for (double w : head_corr) {
    if (!(w >= 0 && w <= 1)) bad("head_corr: values must be in [0, 1]");
  }
  if (!(layer_corr >= 0 && layer_corr <= 1)) bad("layer_corr: must be in [0, 1]");
  if (!(query_dependence >= 0 && query_dependence <= 1)) bad("query_dependence: must be in [0, 1]");
  if (sink_tokens < 0 || sink_tokens > 1 << 20) bad("sink_tokens: must be in [0, 2^20]");
  if (!(sink_boost >= 0 && sink_boost <= 60)) bad("sink_boost: must be in [0, 60]");
  if (!(tail > 0 && tail <= 20)) bad("tail: must be in (0, 20]");
  if (model != 1 && model != 2) bad("model: must be v1 or v2");
  if (!(persistent >= 0 && persistent <= 1)) bad("persistent: must be in [0, 1]");
  if (!(persistent_query >= 0 && persistent_query <= 1)) bad("persistent_query: must be in [0, 1]");
  if (!(head_spread >= 0 && head_spread <= 10)) bad("head_spread: must be in [0, 10]");
  if (!(tail_shape >= 0 && tail_shape <= 4)) bad("tail_shape: must be in [0, 4]");
}

std::string ProceduralParams::ToString() const {
  std::ostringstream s;
  s.precision(6);
  s << "seed=" << seed << " head_corr=";
  for (std::size_t i = 0; i < head_corr.size(); ++i) s << (i ? "," : "") << head_corr[i];
  s << " layer_corr=" << layer_corr << " query_dependence=" << query_dependence
    << " sink_tokens=" << sink_tokens << " sink_boost=" << sink_boost << " tail=" << tail;
  if (model == 2) {
    s << " model=v2 persistent=" << persistent << " persistent_query=" << persistent_query
      << " head_spread=" << head_spread << " tail_shape=" << tail_shape;
  }
  return s.str();
}

void PrefixTokenKeys(const Request& request, std::vector<std::uint32_t>* keys,
                     std::int64_t max_tokens) {
  std::int64_t total = request.prefix_tokens();
  if (max_tokens >= 0) total = std::min(total, max_tokens);
  keys->resize(static_cast<std::size_t>(total));
  std::uint64_t h = hash::ChainStart(request.tokens_per_symbol);
  const int tps = request.tokens_per_symbol;
  std::int64_t t = 0;
  for (std::size_t i = 0; i < request.prefix.size() && t < total; ++i) {
    h = hash::ChainNext(h, request.prefix[i]);
    if (tps == 1) {
      (*keys)[t++] = static_cast<std::uint32_t>(h ^ (h >> 32));
    } else {
      const auto base = static_cast<std::uint32_t>(h ^ (h >> 32));
      for (int o = 0; o < tps && t < total; ++o) {
        (*keys)[t++] = hash::Hash32(base + static_cast<std::uint32_t>(o) * 0x9E3779B9u);
      }
    }
  }
}

std::uint64_t DefaultQueryKey(std::uint64_t seed, RequestId id) {
  return hash::Combine(seed ^ 0x7175657279ull, id);
}

ImportanceModel::ImportanceModel(const ProceduralParams& params, int layers, int kv_heads)
    : params_(params), layers_(layers), kv_heads_(kv_heads) {
  KVTIER_CHECK(layers >= 1 && kv_heads >= 1, "ImportanceModel needs a model shape");
  const auto& p = params_.head_corr;
  w_.resize(layers);
  for (int l = 0; l < layers; ++l) {
    if (p.size() == 1 || layers == 1) {
      w_[l] = p.size() == 1 ? p[0] : p[0];
      continue;
    }
    const double x = double(l) / double(layers - 1) * double(p.size() - 1);
    const std::size_t i = std::min<std::size_t>(static_cast<std::size_t>(x), p.size() - 2);
    const double f = x - double(i);
    w_[l] = p[i] * (1 - f) + p[i + 1] * f;
  }
  phi_ = std::acos(std::clamp(params_.layer_corr, 0.0, 1.0));
}

void ImportanceModel::Scores(std::span<const std::uint32_t> token_keys, std::uint64_t query_key,
                             int layer, std::span<const int> heads, std::int64_t n,
                             float* out) const {
  KVTIER_DCHECK(static_cast<std::int64_t>(token_keys.size()) >= n, "token keys too short");
  KVTIER_DCHECK(layer >= 0 && layer < layers_, "layer out of range");
  if (n <= 0) return;
  thread_local std::vector<float> common;
  common.resize(static_cast<std::size_t>(n));

  // Anchor chain: layer l sits at angle l*phi; anchors every pi/2.
  const double angle = double(layer) * phi_;
  const double quarter = std::numbers::pi / 2;
  std::uint64_t anchor = phi_ > 0 ? static_cast<std::uint64_t>(std::floor(angle / quarter)) : 0;
  double a = angle - double(anchor) * quarter;
  if (a >= quarter) a = quarter - 1e-12;  // floating guard
  const double w = w_[layer];
  const double g = params_.query_dependence;
  const double tail = params_.tail;
  const double cs = tail * std::sqrt(w * (1 - g)), cq = tail * std::sqrt(w * g);
  const double es = tail * std::sqrt((1 - w) * (1 - g)), eq = tail * std::sqrt((1 - w) * g);
  const std::uint64_t seed = params_.seed;

  AnchorMixStatic(token_keys.data(), n, Salt(seed, kTagStaticAnchor, anchor, 0),
                  Salt(seed, kTagStaticAnchor, anchor + 1, 0), float(cs * std::cos(a)),
                  float(cs * std::sin(a)), common.data());
  AnchorMixQuery(n, Salt(seed, kTagQueryAnchor, anchor, query_key),
                 Salt(seed, kTagQueryAnchor, anchor + 1, query_key), float(cq * std::cos(a)),
                 float(cq * std::sin(a)), common.data());
  const float boost = std::exp2(static_cast<float>(params_.sink_boost));
  const std::int64_t sinks = std::min<std::int64_t>(params_.sink_tokens, n);
  for (std::size_t j = 0; j < heads.size(); ++j) {
    KVTIER_DCHECK(heads[j] >= 0 && heads[j] < kv_heads_, "head out of range");
    const auto h = static_cast<std::uint64_t>(heads[j]);
    float* row = out + j * n;
    HeadRow(token_keys.data(), common.data(), n, Salt(seed, kTagStaticHead, layer, h),
            Salt(seed ^ query_key, kTagQueryHead, layer, h), float(es), float(eq), row);
    for (std::int64_t t = 0; t < sinks; ++t) row[t] *= boost;
  }
}

}  // namespace kvtier
