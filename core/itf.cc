#include "core/itf.h"

#include <cstring>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define KVTIER_ITF_AVX512 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define KVTIER_ITF_AVX2 1
#endif

namespace kvtier {

std::int64_t RetainedTokens(double retention, std::int64_t n) {
  if (n <= 0) return 0;
  // ceil(retention * n). The relative nudge keeps products such as 0.1 * 30 =
  // 3.0000000000000004 from rounding up to 4.
  const double x = retention * static_cast<double>(n);
  const auto k = static_cast<std::int64_t>(std::ceil(x - 1e-9 * std::max(1.0, x)));
  return std::clamp<std::int64_t>(k, 1, n);
}

// SPEC §IV-B: J(A, B) = |A ∩ B| / |A ∪ B|.
double Jaccard(const TokenSet& a, const TokenSet& b) {
  if (a.empty() && b.empty()) return 1.0;
  std::size_t i = 0, j = 0, common = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++common;
      ++i;
      ++j;
    }
  }
  const std::size_t uni = a.size() + b.size() - common;
  return static_cast<double>(common) / static_cast<double>(uni);
}

// SPEC §IV-B: two random k-of-n selections A, B share each token with probability k^2/n^2, so
//   E|A ∩ B| = k^2/n,  E|A ∪ B| = 2k - k^2/n,  j = (k^2/n) / (2k - k^2/n).
// (The paper takes the ratio of expectations, not the expectation of the ratio.)
double RandomJaccard(std::int64_t k, std::int64_t n) {
  KVTIER_CHECK(k >= 0 && k <= n, "RandomJaccard needs 0 <= k <= n");
  if (k == n) return 1.0;  // includes n == 0: two empty sets are identical
  if (k == 0) return 0.0;
  const double kk = static_cast<double>(k);
  const double inter = kk * kk / static_cast<double>(n);
  return inter / (2 * kk - inter);
}

// SPEC §IV-B: t = j^alpha (alpha = 0.6 in the paper). pow(x, 0) == 1 for every x.
double ItfThreshold(std::int64_t k, std::int64_t n, double alpha) {
  return std::pow(RandomJaccard(k, n), alpha);
}

namespace {

// Rank key of one score: an order-preserving encoding of the score, complemented so that a
// smaller key ranks higher; NaN never outranks a number (it ranks as -inf). Ties (equal keys)
// prefer the lower index.
std::uint32_t DescendingKey(float score) {
  std::uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
  // Without branches, so that TopK's key pass vectorises: NaN ranks as -inf, -0 as +0.
  bits = (bits & 0x7FFFFFFFu) > 0x7F800000u ? 0xFF800000u : bits;
  bits = bits == 0x80000000u ? 0u : bits;
  const std::uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

// Index collection: the tokens t < n that pass a test, written in order to out[0..count) (out
// has room for n + 16 entries: the vector paths store whole blocks of 16). The simulator's ITF
// path collects TopK's boundary bucket, the vote's straddling level and the voted set this way
// for every probe head and layer; one token at a time, branch-free (a store per token, the
// end advanced by the test), they were ~45% of TopKBound and ~25% of SelectItfImpl in a cold
// spec run on the Mooncake trace (perf). With AVX-512, 16 tokens are tested in one compare and
// their indices packed by one compress into a register (a register compress: the memory
// form is microcoded and slow on AMD Zen 4, this machine's core). The same indices either
// way.

#ifdef KVTIER_ITF_AVX512
// The indices 0..15 of the first block of 16 tokens.
inline __m512i FirstBlockIndices() {
  return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
// Appends the indices `hit` selects from `idx` (one block's) at out, by one register
// compress and a whole-block store; returns how many.
inline std::int64_t AppendHits(__mmask16 hit, __m512i idx, std::int32_t* out) {
  _mm512_storeu_si512(out, _mm512_maskz_compress_epi32(hit, idx));
  return __builtin_popcount(hit);
}
#endif

#ifdef KVTIER_ITF_AVX2
// Without AVX-512 (AMD Zen 3, Intel before Ice Lake) a block of 8 tokens is tested in one
// compare, and the indices of its hits are packed by a table: entry `mask` holds, byte by
// byte, the positions of mask's set bits (low first), widened to 8 int32 offsets and added to
// the block's first index, stored whole (out has room: n + 16 entries), the end advanced by
// the hits' count. No branch on the data: a loop over the mask's bits mispredicted on every
// third block (~5% of tokens hit), and the one-token-at-a-time loop below, whose store and
// end wait on the token before, was ~65% of TopKBound (~29% of an exact as_h2o_lfu run on
// the Mooncake trace, perf, Zen 3).
constexpr std::array<std::uint64_t, 256> MakePackTable() {
  std::array<std::uint64_t, 256> table{};
  for (unsigned mask = 0; mask < 256; ++mask) {
    std::uint64_t packed = 0;
    int at = 0;
    for (unsigned bit = 0; bit < 8; ++bit) {
      if ((mask >> bit) & 1u) packed |= std::uint64_t{bit} << (8 * at++);
    }
    table[mask] = packed;
  }
  return table;
}
constexpr std::array<std::uint64_t, 256> kPackTable = MakePackTable();

// Appends the indices first + i of the set bits i of `mask` (< 256) at out; returns how many.
inline std::int64_t AppendHits8(unsigned mask, std::int64_t first, std::int32_t* out) {
  const __m256i offsets = _mm256_cvtepu8_epi32(
      _mm_cvtsi64_si128(static_cast<long long>(kPackTable[mask])));
  const __m256i idx =
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)), offsets);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), idx);
  return __builtin_popcount(mask);
}
#endif

// Tokens whose key's top bits (key >> shift) equal `bucket`.
std::int64_t CollectBucket(const std::uint32_t* keys, std::int64_t n, std::uint32_t bucket,
                           int shift, std::int32_t* out) {
  std::int64_t m = 0, t = 0;
#ifdef KVTIER_ITF_AVX512
  // key >> shift == bucket  <=>  key - (bucket << shift) < 2^shift (unsigned).
  const __m512i base = _mm512_set1_epi32(static_cast<int>(bucket << shift));
  const __m512i width = _mm512_set1_epi32(static_cast<int>(1u << shift));
  __m512i idx = FirstBlockIndices();
  const __m512i step = _mm512_set1_epi32(16);
  for (; t + 16 <= n; t += 16) {
    const __m512i k = _mm512_sub_epi32(_mm512_loadu_si512(keys + t), base);
    m += AppendHits(_mm512_cmplt_epu32_mask(k, width), idx, out + m);
    idx = _mm512_add_epi32(idx, step);
  }
#elif defined(KVTIER_ITF_AVX2)
  // key - (bucket << shift) <= 2^shift - 1 (unsigned): min(d, 2^shift - 1) == d.
  const __m256i base = _mm256_set1_epi32(static_cast<int>(bucket << shift));
  const __m256i last = _mm256_set1_epi32(static_cast<int>((1u << shift) - 1));
  for (; t + 8 <= n; t += 8) {
    const __m256i d = _mm256_sub_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + t)), base);
    const __m256i hit = _mm256_cmpeq_epi32(_mm256_min_epu32(d, last), d);
    m += AppendHits8(static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit))), t,
                     out + m);
  }
#endif
  for (; t < n; ++t) {
    out[m] = static_cast<std::int32_t>(t);
    m += (keys[t] >> shift) == bucket;
  }
  return m;
}

// Tokens with votes[t] == level (above == false) or votes[t] > level (above == true).
std::int64_t CollectVotes(const std::uint16_t* votes, std::int64_t n, std::uint16_t level,
                          bool above, std::int32_t* out) {
  std::int64_t m = 0, t = 0;
#ifdef KVTIER_ITF_AVX512
  const __m256i want = _mm256_set1_epi16(static_cast<short>(level));
  __m512i idx = FirstBlockIndices();
  const __m512i step = _mm512_set1_epi32(16);
  for (; t + 16 <= n; t += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(votes + t));
    const __mmask16 hit =
        above ? _mm256_cmpgt_epu16_mask(v, want) : _mm256_cmpeq_epu16_mask(v, want);
    m += AppendHits(hit, idx, out + m);
    idx = _mm512_add_epi32(idx, step);
  }
#elif defined(KVTIER_ITF_AVX2)
  // 8 votes widened to 32-bit lanes a step (counts <= 65535: the signed compare is exact);
  // the scalar loop was ~30% of SelectItfImpl in a cold spec run on the Mooncake trace (Zen 3).
  const __m256i want = _mm256_set1_epi32(level);
  for (; t + 8 <= n; t += 8) {
    const __m256i v =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(votes + t)));
    const __m256i hit = above ? _mm256_cmpgt_epi32(v, want) : _mm256_cmpeq_epi32(v, want);
    m += AppendHits8(static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit))), t,
                     out + m);
  }
#endif
  for (; t < n; ++t) {
    out[m] = static_cast<std::int32_t>(t);
    m += above ? votes[t] > level : votes[t] == level;
  }
  return m;
}

// How many tokens have votes[t] == level. Its own function, so that GCC vectorises this loop
// over t: inlined into the loop over levels it vectorised the levels instead (there are 2 to
// 9) and ran the tokens one at a time, ~35% of SelectItfImpl (perf, cold spec, Mooncake).
__attribute__((noinline)) std::int64_t CountVotes(const std::uint16_t* votes, std::int64_t n,
                                                  std::uint16_t level) {
  std::uint32_t c = 0;  // n < 2^31 (token indices are int32)
  for (std::int64_t t = 0; t < n; ++t) c += votes[t] == level;
  return c;
}

}  // namespace

// Radix select on the 32-bit rank keys, ranked by (key asc, index asc): a histogram of the keys'
// top 11 bits finds the bucket holding the k-th token; everything in lower buckets is kept, and
// only that boundary bucket's tokens are ordered (since session 12 a histogram of their next 8
// key bits, then nth_element on the (key, index) of its boundary sub-bucket, packed in 64 bits;
// and the bucket is first guessed, TopKBound below). One walk in index order then emits the
// set already sorted. The simulator calls this per
// probe head and layer of every request (per head for H2O). Replacing nth_element over all n
// 64-bit keys plus a sort of the k winners: 15.0 -> 9.5 us of CPU per call at n = 4,900,
// k = 1,225 (lognormal scores, microbenchmark on a loaded 2-core machine). Then keys computed
// in their own (vectorised) pass, the boundary collected branch-free, and this file built with
// -O3 (core/CMakeLists.txt): 13.8 -> 8.3 us in one run of the same microbenchmark.
namespace {

// TopK's ranking of `scores` (1 <= k < n): the rank keys, left in *keys, and the bound on
// (key << 32 | index) below which a token is kept (exactly k tokens are).
//
// Two shortcuts, both exact, from a cold spec run on the Mooncake trace (n ~ 12,000, the
// histogram ~30% of this function and the boundary's nth_element ~20%, perf):
// - The boundary bucket is first guessed: *guess, the previous call's of the same caller
//   (each caller keeps its own, thread_local). ITF asks for the k-th score of 3 probe heads of
//   one layer, then of the next layer, whose k-th scores lie a small fraction of a bucket (a
//   quarter octave) apart, so the guess is mostly right; the key
//   pass counts the keys below the guessed bucket and up to its end (vectorised), which says
//   whether it holds the k-th token, and a wrong guess moves to the neighbouring bucket with
//   one more counting pass, twice at most, before the histogram decides.
// - The boundary bucket's tokens (~5% of n) are ranked by a second histogram of the next 8
//   key bits, and only the tokens of its boundary sub-bucket (a few) by nth_element.
std::uint64_t TopKBound(std::span<const float> scores, std::int64_t k,
                        std::vector<std::uint32_t>* keys_out, std::uint32_t* guess_io) {
  const auto n = static_cast<std::int64_t>(scores.size());
  constexpr int kBucketBits = 11;
  constexpr int kShift = 32 - kBucketBits;
  constexpr std::uint32_t kBuckets = 1u << kBucketBits;
  constexpr std::uint32_t kBucketWidth = 1u << kShift;
  const std::uint32_t guess = std::min(*guess_io, kBuckets - 1);
  thread_local std::vector<std::uint64_t> boundary;
  keys_out->resize(static_cast<std::size_t>(n));
  const float* score = scores.data();
  std::uint32_t* keys = keys_out->data();
  // Keys below the guessed bucket, and up to its last key (both fit 32 bits: n < 2^31).
  const std::uint32_t lo = guess * kBucketWidth, last = lo + (kBucketWidth - 1);
  std::uint32_t below_lo = 0, upto_last = 0;
  std::uint32_t min_key = 0xFFFFFFFFu;  // the best score's key: the histogram's scan starts there
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t key = DescendingKey(score[i]);
    keys[i] = key;
    min_key = std::min(min_key, key);
    below_lo += key < lo;
    upto_last += key <= last;
  }
  std::uint32_t b = guess;
  std::int64_t below = below_lo, nb = std::int64_t(upto_last) - below_lo;
  // The bucket holds the k-th token iff fewer than k keys lie below it and at least k up to
  // its end; otherwise the k-th lies above (more buckets) or below.
  for (int tries = 0; !(below < k && k <= below + nb); ++tries) {
    const bool up = below + nb < k;
    if (tries == 2 || (up ? b + 1 >= kBuckets : b == 0)) {
      b = kBuckets;  // the histogram decides
      break;
    }
    b = up ? b + 1 : b - 1;
    const std::uint32_t blo = b * kBucketWidth, blast = blo + (kBucketWidth - 1);
    std::uint32_t c_lo = 0, c_last = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      c_lo += keys[i] < blo;
      c_last += keys[i] <= blast;
    }
    below = c_lo;
    nb = std::int64_t(c_last) - c_lo;
  }
  if (b == kBuckets) {
    // Four interleaved histograms: the procedural scores crowd into a few dozen buckets, and
    // increments of one counter by consecutive tokens wait on each other through memory (one
    // histogram was ~40% of TopK's time in sim_bench's as_h2o_lfu profile).
    constexpr int kWays = 4;
    std::uint32_t hist[kWays][kBuckets] = {};
    std::int64_t i = 0;
    for (; i + kWays <= n; i += kWays) {
      ++hist[0][keys[i] >> kShift];
      ++hist[1][keys[i + 1] >> kShift];
      ++hist[2][keys[i + 2] >> kShift];
      ++hist[3][keys[i + 3] >> kShift];
    }
    for (; i < n; ++i) ++hist[0][keys[i] >> kShift];
    // The boundary bucket b: fewer than k keys below it, at least k up to it.
    auto in_bucket = [&](std::uint32_t bucket) {
      std::int64_t c = 0;
      for (int w = 0; w < kWays; ++w) c += hist[w][bucket];
      return c;
    };
    // Buckets below the best score's are empty (typical scores sit ~500 buckets from 0).
    b = min_key >> kShift;
    below = 0;
    while (below + in_bucket(b) < k) below += in_bucket(b++);
    nb = in_bucket(b);
  }
  *guess_io = b;
  std::int64_t need = k - below;  // 1 <= need <= nb
  // The bucket's tokens, in index order.
  thread_local std::vector<std::int32_t> in_b;
  in_b.resize(static_cast<std::size_t>(n) + 16);
  const std::int64_t m = CollectBucket(keys, n, b, kShift, in_b.data());
  KVTIER_DCHECK(m == nb, "TopK's boundary disagrees with its count");
  // The sub-bucket (next 8 key bits) holding the need-th of them.
  constexpr int kSubBits = 8;
  constexpr int kSubShift = kShift - kSubBits;
  constexpr std::uint32_t kSubMask = (1u << kSubBits) - 1;
  std::uint32_t sub[1u << kSubBits] = {};
  for (std::int64_t j = 0; j < nb; ++j) {
    ++sub[(keys[in_b[static_cast<std::size_t>(j)]] >> kSubShift) & kSubMask];
  }
  std::uint32_t sb = 0;
  while (need > std::int64_t(sub[sb])) need -= sub[sb++];
  // Its tokens, (key, index) packed; the need-th smallest is the last one kept.
  boundary.resize(sub[sb]);
  std::size_t nsb = 0;
  for (std::int64_t j = 0; j < nb; ++j) {
    const std::int32_t t = in_b[static_cast<std::size_t>(j)];
    if (((keys[t] >> kSubShift) & kSubMask) == sb) {
      boundary[nsb++] = (std::uint64_t{keys[t]} << 32) | std::uint32_t(t);
    }
  }
  KVTIER_DCHECK(nsb == sub[sb], "TopK's sub-bucket disagrees with its histogram");
  std::nth_element(boundary.begin(), boundary.begin() + (need - 1), boundary.end());
  // A token is kept iff its (key, index) <= last_kept; last_kept + 1 cannot overflow: indices
  // are < 2^31.
  return boundary[static_cast<std::size_t>(need - 1)] + 1;
}

}  // namespace

TokenSet TopK(std::span<const float> scores, std::int64_t k) {
  const auto n = static_cast<std::int64_t>(scores.size());
  KVTIER_CHECK(k >= 0 && k <= n, "TopK needs 0 <= k <= scores.size()");
  TokenSet idx;
  if (k == n) {
    idx.resize(static_cast<std::size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    return idx;
  }
  if (k == 0) return idx;
  thread_local std::vector<std::uint32_t> key_buffer;
  thread_local std::uint32_t guess = 0;  // TopKBound's, of this caller
  const std::uint64_t bound = TopKBound(scores, k, &key_buffer, &guess);
  const std::uint32_t* keys = key_buffer.data();
  // Branch-free emission (kept or not is a coin flip for the branch predictor): every token is
  // written at the end and the end advances only for kept ones; one spare slot takes the
  // writes after the k-th.
  idx.resize(static_cast<std::size_t>(k) + 1);
  std::int64_t kept = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    const std::uint64_t packed = (std::uint64_t{keys[t]} << 32) | static_cast<std::uint32_t>(t);
    idx[static_cast<std::size_t>(kept)] = static_cast<std::int32_t>(t);
    kept += packed < bound;
  }
  KVTIER_DCHECK(kept == k, "TopK kept a wrong count");
  idx.resize(static_cast<std::size_t>(k));
  return idx;
}

// SPEC §IV-B: "compute the similarity of important token sets between each pair of probe heads,
// and then take the average".
double MeanPairwiseJaccard(const std::vector<TokenSet>& sets) {
  if (sets.size() < 2) return 1.0;
  double sum = 0;
  std::size_t pairs = 0;
  for (std::size_t i = 0; i < sets.size(); ++i) {
    for (std::size_t j = i + 1; j < sets.size(); ++j) {
      sum += Jaccard(sets[i], sets[j]);
      ++pairs;
    }
  }
  return sum / static_cast<double>(pairs);
}

namespace {

// Without the per-head sets (ItfDecisionOnly, up to 8 probe heads): each head's TopK bound
// marks its tokens straight into the per-token vote count and head mask, in one pass per head
// (where TopK wrote the set, and the vote loop read it back scattered); the pairwise
// intersections and set sizes are counted over the masks. The same integers, so the same
// similarity, levels and voted set. TopKBound, the vote and the Jaccard loops were ~40% of a
// cold spec run's samples over the whole Mooncake trace (perf), with n ~ 12,000.
void MarkTopKPerHead(std::span<const float> probe_scores, int probe_heads, std::int64_t n,
                     std::int64_t k, std::uint16_t* votes, std::uint8_t* heads_of) {
  thread_local std::vector<std::uint32_t> key_buffer;
  thread_local std::uint32_t guess = 0;  // TopKBound's, of this caller
  for (int h = 0; h < probe_heads; ++h) {
    const std::uint8_t bit = std::uint8_t(1u << h);
    if (k <= 0) continue;
    if (k >= n) {  // every token (TopK's k == n)
      for (std::int64_t t = 0; t < n; ++t) {
        heads_of[t] |= bit;
        ++votes[t];
      }
      continue;
    }
    const std::span<const float> row =
        probe_scores.subspan(static_cast<std::size_t>(h) * static_cast<std::size_t>(n),
                             static_cast<std::size_t>(n));
    const std::uint64_t bound = TopKBound(row, k, &key_buffer, &guess);
    const std::uint32_t* keys = key_buffer.data();
    for (std::int64_t t = 0; t < n; ++t) {
      const std::uint64_t packed = (std::uint64_t{keys[t]} << 32) | static_cast<std::uint32_t>(t);
      const std::uint8_t kept = packed < bound;
      heads_of[t] |= std::uint8_t(kept << h);
      votes[t] = static_cast<std::uint16_t>(votes[t] + kept);
    }
  }
}

ItfDecision SelectItfImpl(std::span<const float> probe_scores, int probe_heads, std::int64_t n,
                          const ItfOptions& options, bool always_vote, bool sets = true) {
  KVTIER_CHECK(n >= 1 && probe_heads >= 1, "SelectItf needs n >= 1 and a probe head");
  KVTIER_CHECK(
      probe_scores.size() == static_cast<std::size_t>(probe_heads) * static_cast<std::size_t>(n),
      "SelectItf: probe_scores must hold probe_heads rows of n scores");
  ItfDecision d;
  d.k = RetainedTokens(options.retention, n);
  // Which probe heads selected each token: a vote count, and for up to 8 probe heads a bit mask.
  thread_local std::vector<std::uint16_t> votes;
  thread_local std::vector<std::uint8_t> heads_of;
  const bool masks = probe_heads <= 8;
  votes.assign(static_cast<std::size_t>(n), 0);
  heads_of.assign(masks ? static_cast<std::size_t>(n) : 0, 0);
  if (!sets && masks) {
    MarkTopKPerHead(probe_scores, probe_heads, n, d.k, votes.data(), heads_of.data());
    // |A_i| and |A_i ∩ A_j| over the masks; summed in SelectItf's pair order, the same double.
    const std::uint8_t* m = heads_of.data();
    std::int64_t size[8] = {};
    for (int i = 0; i < probe_heads; ++i) {
      std::int64_t c = 0;
      for (std::int64_t t = 0; t < n; ++t) c += (m[t] >> i) & 1u;
      size[i] = c;
    }
    double sum = 0;
    int pairs = 0;
    for (int i = 0; i < probe_heads; ++i) {
      for (int j = i + 1; j < probe_heads; ++j) {
        const std::uint8_t both = std::uint8_t((1u << i) | (1u << j));
        std::int64_t common = 0;
        for (std::int64_t t = 0; t < n; ++t) common += (m[t] & both) == both;
        const std::int64_t uni = size[i] + size[j] - common;
        sum += static_cast<double>(common) / static_cast<double>(uni);
        ++pairs;
      }
    }
    d.similarity = pairs == 0 ? 1.0 : sum / static_cast<double>(pairs);
  } else {
    d.probe_sets = SelectPerHead(probe_scores, probe_heads, n, d.k);
    for (int h = 0; h < probe_heads; ++h) {
      for (std::int32_t t : d.probe_sets[static_cast<std::size_t>(h)]) {
        ++votes[static_cast<std::size_t>(t)];
        if (masks) heads_of[static_cast<std::size_t>(t)] |= std::uint8_t(1u << h);
      }
    }
  }
  if (!sets && masks) {
    // similarity computed above
  } else if (masks) {
    // MeanPairwiseJaccard without merges: |A_i ∩ A_j| counts the tokens of A_i whose mask has
    // bit j (independent loads, no branch); the same integers, divided and summed in the same
    // order, give the same double. The merges mispredict on partly overlapping probe sets.
    double sum = 0;
    int pairs = 0;
    for (int i = 0; i < probe_heads; ++i) {
      const TokenSet& a = d.probe_sets[static_cast<std::size_t>(i)];
      for (int j = i + 1; j < probe_heads; ++j) {
        std::int64_t common = 0;
        for (std::int32_t t : a) common += (heads_of[static_cast<std::size_t>(t)] >> j) & 1u;
        const TokenSet& b = d.probe_sets[static_cast<std::size_t>(j)];
        const auto uni = static_cast<std::int64_t>(a.size() + b.size()) - common;
        sum += static_cast<double>(common) / static_cast<double>(uni);
        ++pairs;
      }
    }
    d.similarity = pairs == 0 ? 1.0 : sum / static_cast<double>(pairs);
  } else {
    d.similarity = MeanPairwiseJaccard(d.probe_sets);
  }
  d.threshold = ItfThreshold(d.k, n, options.alpha);
  // §IV-B: ITF is enabled for the layer only when the probe heads' similarity reaches t.
  d.fallback = d.similarity < d.threshold;
  if (d.fallback && !always_vote) return d;

  // Vote: rank the probe heads' candidates by (votes desc, summed score over all probe heads
  // desc, index asc) and keep k. Only tokens some probe selected can win (there are >= k).
  // Votes are counted per token in one array; whole vote levels are kept from the top while
  // they fit, and only the level that straddles k is ordered, by summed score. One walk in
  // index order emits the set sorted. Replaces a union, a binary search per candidate and head,
  // and a heap partial_sort of every candidate: SelectItf with 3 probe heads went from 605 to
  // 47 us of CPU per layer at n = 4,900, k = 1,225, its three TopK calls included.
  // Level counts: one compare-and-count pass per level (CountVotes, vectorised; a histogram's
  // increments of one counter by consecutive tokens would wait on each other through memory).
  const std::size_t levels = static_cast<std::size_t>(probe_heads) + 1;
  std::vector<std::int64_t> at_level(levels, 0);
  const std::uint16_t* vote = votes.data();
  std::int64_t voted_any = 0;
  for (std::size_t v = 1; v < levels; ++v) {
    const std::int64_t c = CountVotes(vote, n, static_cast<std::uint16_t>(v));
    at_level[v] = c;
    voted_any += c;
  }
  at_level[0] = n - voted_any;
  int level = probe_heads;  // levels above `level` are kept whole
  std::int64_t kept = 0;
  while (level >= 1 && kept + at_level[static_cast<std::size_t>(level)] <= d.k) {
    kept += at_level[static_cast<std::size_t>(level)];
    --level;
  }
  const std::int64_t need = d.k - kept;  // taken from `level` by (summed score desc, index asc)
  if (need > 0) {
    // The level's tokens (CollectVotes), then scored and ordered.
    thread_local std::vector<std::int32_t> on_level;
    on_level.resize(static_cast<std::size_t>(n) + 16);
    const std::int64_t m = CollectVotes(vote, n, static_cast<std::uint16_t>(level),
                                        /*above=*/false, on_level.data());
    KVTIER_DCHECK(m == at_level[static_cast<std::size_t>(level)], "the vote's level count");
    struct Candidate {
      double score;
      std::int32_t token;
    };
    thread_local std::vector<Candidate> cands;
    cands.resize(static_cast<std::size_t>(m));
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int32_t t = on_level[static_cast<std::size_t>(i)];
      Candidate c{0, t};
      for (int h = 0; h < probe_heads; ++h) {
        const float s = probe_scores[static_cast<std::size_t>(h) * n + t];
        if (!std::isnan(s)) c.score += s;
      }
      cands[static_cast<std::size_t>(i)] = c;
    }
    auto better = [](const Candidate& a, const Candidate& b) {
      if (a.score != b.score) return a.score > b.score;
      return a.token < b.token;
    };
    // The `need` best by `better`, without ordering all m (1 <= need < m): the summed scores
    // rounded to float are a coarse rank (rounding is monotone, so a smaller rounded score
    // never beats a larger one), and TopKBound's radix select on them finds the rounded
    // score of the need-th best. Every candidate rounding above it wins; those rounding to it
    // (a few, usually one) are ordered by `better` itself. An nth_element of all m by `better`
    // was ~35% of SelectItfImpl once the collections were vectorised (m ~ 1,600 at n = 12,000).
    thread_local std::vector<float> rounded;
    thread_local std::vector<std::uint32_t> rounded_keys;
    thread_local std::uint32_t guess = 0;  // TopKBound's, of this caller
    rounded.resize(static_cast<std::size_t>(m));
    for (std::int64_t i = 0; i < m; ++i) {
      rounded[static_cast<std::size_t>(i)] =
          static_cast<float>(cands[static_cast<std::size_t>(i)].score);
    }
    const std::uint32_t edge = static_cast<std::uint32_t>(
        (TopKBound(rounded, need, &rounded_keys, &guess) - 1) >> 32);  // the need-th's key
    thread_local std::vector<Candidate> tied;
    tied.clear();
    std::int64_t won = 0;
    for (std::int64_t i = 0; i < m; ++i) {
      const std::uint32_t key = rounded_keys[static_cast<std::size_t>(i)];
      const Candidate& c = cands[static_cast<std::size_t>(i)];
      if (key < edge) {
        votes[static_cast<std::size_t>(c.token)] = static_cast<std::uint16_t>(level + 1);
        ++won;
      } else if (key == edge) {
        tied.push_back(c);
      }
    }
    const std::int64_t from_tied = need - won;  // 1 <= from_tied <= |tied|
    KVTIER_DCHECK(from_tied >= 1 && from_tied <= std::int64_t(tied.size()),
                  "the vote's rounded ranking");
    std::nth_element(tied.begin(), tied.begin() + (from_tied - 1), tied.end(), better);
    // The winners move up a level (votes is scratch), so the emission keeps "votes > level".
    for (std::int64_t i = 0; i < from_tied; ++i) {
      votes[static_cast<std::size_t>(tied[static_cast<std::size_t>(i)].token)] =
          static_cast<std::uint16_t>(level + 1);
    }
  }
  // The voted set: every token above `level` (CollectVotes into scratch, so the set's own
  // buffer is k entries, as before).
  thread_local std::vector<std::int32_t> above;
  above.resize(static_cast<std::size_t>(n) + 16);
  const std::int64_t emitted = CollectVotes(vote, n, static_cast<std::uint16_t>(level),
                                            /*above=*/true, above.data());
  KVTIER_DCHECK(emitted == d.k, "the vote kept a wrong count");
  d.voted.assign(above.begin(), above.begin() + d.k);
  return d;
}

}  // namespace

ItfDecision SelectItf(std::span<const float> probe_scores, int probe_heads, std::int64_t n,
                      const ItfOptions& options) {
  return SelectItfImpl(probe_scores, probe_heads, n, options, /*always_vote=*/false);
}

ItfDecision SelectItfAndVote(std::span<const float> probe_scores, int probe_heads,
                             std::int64_t n, const ItfOptions& options) {
  return SelectItfImpl(probe_scores, probe_heads, n, options, /*always_vote=*/true);
}

ItfDecision ItfDecisionOnly(std::span<const float> probe_scores, int probe_heads, std::int64_t n,
                            const ItfOptions& options, bool always_vote) {
  return SelectItfImpl(probe_scores, probe_heads, n, options, always_vote, /*sets=*/false);
}

std::vector<TokenSet> SelectPerHead(std::span<const float> scores, int heads, std::int64_t n,
                                    std::int64_t k) {
  KVTIER_CHECK(heads >= 0 && n >= 0, "SelectPerHead needs heads >= 0 and n >= 0");
  KVTIER_CHECK(scores.size() == static_cast<std::size_t>(heads) * static_cast<std::size_t>(n),
               "SelectPerHead: scores must hold heads rows of n scores");
  std::vector<TokenSet> sets;
  sets.reserve(static_cast<std::size_t>(heads));
  for (int h = 0; h < heads; ++h) {
    sets.push_back(TopK(scores.subspan(static_cast<std::size_t>(h) * n, n), k));
  }
  return sets;
}

void CountTopKPerHead(std::span<const float> scores, int heads, std::int64_t n, std::int64_t k,
                      std::vector<std::uint16_t>* counts) {
  KVTIER_CHECK(heads >= 0 && heads <= 65535 && n >= 0 && k >= 0 && k <= n,
               "CountTopKPerHead needs 0 <= heads <= 65535 and 0 <= k <= n");
  KVTIER_CHECK(scores.size() == static_cast<std::size_t>(heads) * static_cast<std::size_t>(n),
               "CountTopKPerHead: scores must hold heads rows of n scores");
  counts->assign(static_cast<std::size_t>(n), 0);
  if (k == 0) return;
  std::uint16_t* of = counts->data();
  if (k == n) {
    std::fill(counts->begin(), counts->end(), static_cast<std::uint16_t>(heads));
    return;
  }
  thread_local std::vector<std::uint32_t> key_buffer;
  thread_local std::uint32_t guess = 0;  // TopKBound's, of this caller
  for (int h = 0; h < heads; ++h) {
    const std::uint64_t bound =
        TopKBound(scores.subspan(static_cast<std::size_t>(h) * n, n), k, &key_buffer, &guess);
    const std::uint32_t* keys = key_buffer.data();
    // TopK's kept test, (key, index) <= the last kept one's, added instead of emitted (no set
    // is built), in 32-bit lanes: as one 64-bit compare of the packed pair it vectorised 4
    // tokens a step with AVX2.
    const std::uint64_t last = bound - 1;
    const auto last_key = static_cast<std::uint32_t>(last >> 32);
    const auto last_index = static_cast<std::uint32_t>(last);
    for (std::int64_t t = 0; t < n; ++t) {
      const std::uint32_t key = keys[t];
      const bool kept =
          (key < last_key) | ((key == last_key) & (static_cast<std::uint32_t>(t) <= last_index));
      of[t] = static_cast<std::uint16_t>(of[t] + kept);
    }
  }
}

// Sized first, then written without branches (kept or not is a coin flip for the predictor):
// with AVX-512 (VBMI2 for the 16-bit counts) 32 tokens a step by register compresses, else one
// at a time with the end advanced by the test. FromCounts was ~12% of an as_h2o_lru run with
// sampled selections on the Mooncake trace (perf, session 11), one token at a time.
void CollectCounted(std::span<const std::uint16_t> of, TokenSet* tokens,
                    std::vector<std::uint16_t>* counts) {
  const auto n = static_cast<std::int64_t>(of.size());
  const std::uint16_t* c = of.data();
  std::uint32_t kept = 0;  // n < 2^31 (token indices are int32)
  for (std::int64_t t = 0; t < n; ++t) kept += c[t] != 0;
  constexpr std::size_t kSlack = 32;  // the vector stores' whole blocks
  tokens->resize(kept + kSlack);
  counts->resize(kept + kSlack);
  std::int32_t* tok = tokens->data();
  std::uint16_t* cnt = counts->data();
  std::int64_t m = 0, t = 0;
#if defined(KVTIER_ITF_AVX512) && defined(__AVX512VBMI2__)
  __m512i idx = FirstBlockIndices();
  const __m512i half = _mm512_set1_epi32(16);
  const __m512i step = _mm512_set1_epi32(32);
  for (; t + 32 <= n; t += 32) {
    const __m512i v = _mm512_loadu_si512(c + t);
    const __mmask32 nz = _mm512_test_epi16_mask(v, v);
    _mm512_storeu_si512(cnt + m, _mm512_maskz_compress_epi16(nz, v));
    const auto lo = static_cast<__mmask16>(nz), hi = static_cast<__mmask16>(nz >> 16);
    m += AppendHits(lo, idx, tok + m);
    m += AppendHits(hi, _mm512_add_epi32(idx, half), tok + m);
    idx = _mm512_add_epi32(idx, step);
  }
#endif
  for (; t < n; ++t) {
    tok[m] = static_cast<std::int32_t>(t);
    cnt[m] = c[t];
    m += c[t] != 0;
  }
  KVTIER_DCHECK(m == std::int64_t(kept), "CollectCounted's count");
  tokens->resize(kept);
  counts->resize(kept);
}

TokenSet Union(const std::vector<TokenSet>& sets) {
  TokenSet out;
  for (const TokenSet& s : sets) {
    TokenSet merged;
    merged.reserve(out.size() + s.size());
    std::set_union(out.begin(), out.end(), s.begin(), s.end(), std::back_inserter(merged));
    out.swap(merged);
  }
  return out;
}

// SPEC §IV-B, Fig. 9, in vectors (one head's key or value of one token):
//   without ITF:  keys of every head (heads * n), then the selected values (heads * k).
//                 n = 4, 32 heads, k = 1: 128 + 32 = 160.
LayerVectorCount CountVectorsWithoutItf(std::int64_t n, int heads, std::int64_t k) {
  LayerVectorCount c;
  c.keys = heads * n;
  c.values = heads * k;
  return c;
}

//   with ITF, pass:     probe keys (probe_heads * n), then K and V of the voted tokens for every
//                       head (heads * k each). Fig. 9: 12 + 32 + 32 = 76.
//   with ITF, fallback: the probe keys were read for nothing; then as without ITF (a K chunk
//                       holds all heads, the probe keys are a redundant copy, §VI-E), so a
//                       fallback layer costs probe_heads * n more than no ITF: 12 + 160 = 172.
LayerVectorCount CountVectorsWithItf(std::int64_t n, int heads, int probe_heads, std::int64_t k,
                                     bool fallback) {
  LayerVectorCount c = fallback ? CountVectorsWithoutItf(n, heads, k) : LayerVectorCount{};
  c.probe_keys = probe_heads * n;
  if (!fallback) {
    c.keys = heads * k;
    c.values = heads * k;
  }
  return c;
}

}  // namespace kvtier
