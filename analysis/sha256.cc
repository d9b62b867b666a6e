// SHA-256 (FIPS 180-4), for trace and configuration fingerprints in the runs table.
//
// Sweeps hash every trace (tens of MB) before running it, so the block compression has an x86
// SHA-NI path, picked at run time (the binary must still run on CPUs without the extension and
// on other architectures, so no global -msha); the portable path is the fallback and the
// reference the tests compare it with.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVTIER_SHA256_X86 1
#endif

#include "analysis/results_db.h"

namespace kvtier {
namespace internal {

// Test hooks, declared by tests/analysis/sha256_test.cc (no header: nothing else should pick a
// compression path). Sha256ForTest hashes `data` fed to the hasher in `chunk`-byte pieces
// (0: one piece), with the portable compression if `portable`, else with the one Sha256 uses.
bool Sha256HasShaNiForTest();
std::string Sha256ForTest(const std::string& data, std::size_t chunk, bool portable);

}  // namespace internal

namespace {

alignas(16) constexpr std::uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline std::uint32_t Rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// Compresses `blocks` consecutive 64-byte blocks at `p` into the state h[0..7] (= a..h).
using CompressFn = void (*)(std::uint32_t* h, const unsigned char* p, std::size_t blocks);

void CompressPortable(std::uint32_t* h_state, const unsigned char* p, std::size_t blocks) {
  for (; blocks > 0; --blocks, p += 64) {
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = std::uint32_t(p[4 * i]) << 24 | std::uint32_t(p[4 * i + 1]) << 16 |
             std::uint32_t(p[4 * i + 2]) << 8 | std::uint32_t(p[4 * i + 3]);
    }
    for (int i = 16; i < 64; ++i) {
      std::uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      std::uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_state[0], b = h_state[1], c = h_state[2], d = h_state[3],
                  e = h_state[4], f = h_state[5], g = h_state[6], h = h_state[7];
    for (int i = 0; i < 64; ++i) {
      std::uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                         kK[i] + w[i];
      std::uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h_state[0] += a, h_state[1] += b, h_state[2] += c, h_state[3] += d;
    h_state[4] += e, h_state[5] += f, h_state[6] += g, h_state[7] += h;
  }
}

#ifdef KVTIER_SHA256_X86

// SHA-NI (Intel SHA extensions). SHA256RNDS2 does two rounds on the state split as ABEF and
// CDGH (A in the top dword) and returns the new ABEF; the new CDGH is the old ABEF, so the two
// state registers swap roles every call and are back in place after each 4-round group.
// SHA256MSG1/MSG2 compute the schedule four words at a time:
//   W[t..t+3] = MSG2(MSG1(W[t-16..t-13], W[t-12..t-9]) + W[t-7..t-4], W[t-4..t-1]).
// Only this function is compiled for the extensions; callers reach it only after the CPU check.
__attribute__((target("sha,sse4.1,ssse3"))) void CompressShaNi(std::uint32_t* h_state,
                                                              const unsigned char* p,
                                                              std::size_t blocks) {
  // Big-endian message words: reverse the bytes of each dword.
  const __m128i kByteSwap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  // h[0..3] = dwords {A, B, C, D} (low first), h[4..7] = {E, F, G, H}; rearrange into
  // ABEF = {F, E, B, A} and CDGH = {H, G, D, C}.
  __m128i abcd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h_state));
  __m128i efgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h_state + 4));
  abcd = _mm_shuffle_epi32(abcd, 0xB1);                 // {B, A, D, C}
  efgh = _mm_shuffle_epi32(efgh, 0x1B);                 // {H, G, F, E}
  __m128i abef = _mm_alignr_epi8(abcd, efgh, 8);        // {F, E, B, A}
  __m128i cdgh = _mm_blend_epi16(efgh, abcd, 0xF0);     // {H, G, D, C}

  for (; blocks > 0; --blocks, p += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];  // the last 16 schedule words; w[g % 4] holds W[4g..4g+3]
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      if (g < 4) {
        w[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)),
                                kByteSwap);
      } else {
        __m128i t = _mm_sha256msg1_epu32(w[g % 4], w[(g + 1) % 4]);
        t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) % 4], w[(g + 2) % 4], 4));
        w[g % 4] = _mm_sha256msg2_epu32(t, w[(g + 3) % 4]);
      }
      __m128i wk = _mm_add_epi32(w[g % 4],
                                 _mm_load_si128(reinterpret_cast<const __m128i*>(kK + 4 * g)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);  // rounds 4g, 4g+1: cdgh is now ABEF
      wk = _mm_shuffle_epi32(wk, 0x0E);              // the upper two W+K into the low half
      abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);  // rounds 4g+2, 4g+3: back in place
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }

  // Back to {A, B, C, D} and {E, F, G, H}.
  abef = _mm_shuffle_epi32(abef, 0x1B);                 // {A, B, E, F}
  cdgh = _mm_shuffle_epi32(cdgh, 0xB1);                 // {G, H, C, D}
  abcd = _mm_blend_epi16(abef, cdgh, 0xF0);             // {A, B, C, D}
  efgh = _mm_alignr_epi8(cdgh, abef, 8);                // {E, F, G, H}
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h_state), abcd);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h_state + 4), efgh);
}

bool CpuHasShaNi() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1") &&
         __builtin_cpu_supports("ssse3");
}

#else

bool CpuHasShaNi() { return false; }

#endif  // KVTIER_SHA256_X86

bool HasShaNi() {
  static const bool has = CpuHasShaNi();  // asked once per process
  return has;
}

CompressFn BestCompress() {
#ifdef KVTIER_SHA256_X86
  if (HasShaNi()) return CompressShaNi;
#endif
  return CompressPortable;
}

class Sha {
 public:
  explicit Sha(CompressFn compress = BestCompress()) : compress_(compress) {}

  // Whole blocks are compressed straight from the input; only a partial block is copied.
  void Update(const unsigned char* p, std::size_t n) {
    total_ += n;
    if (fill_ > 0) {
      const std::size_t take = std::min(n, 64 - fill_);
      std::memcpy(block_.data() + fill_, p, take);
      fill_ += take, p += take, n -= take;
      if (fill_ < 64) return;
      compress_(h_, block_.data(), 1);
      fill_ = 0;
    }
    if (n >= 64) {
      const std::size_t blocks = n / 64;
      compress_(h_, p, blocks);
      p += 64 * blocks, n -= 64 * blocks;
    }
    if (n > 0) std::memcpy(block_.data(), p, n);
    fill_ = n;
  }

  std::string Hex() {
    // 0x80, zeros up to 56 mod 64, then the bit length big-endian.
    const std::uint64_t bits = total_ * 8;
    unsigned char pad[72] = {0x80};
    const std::size_t zeros_end = fill_ < 56 ? 56 - fill_ : 120 - fill_;
    for (int i = 0; i < 8; ++i) {
      pad[zeros_end + i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    }
    Update(pad, zeros_end + 8);
    char out[65];
    for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h_[i]);
    return std::string(out, 64);
  }

 private:
  CompressFn compress_;
  std::array<unsigned char, 64> block_{};
  std::size_t fill_ = 0;
  std::uint64_t total_ = 0;
  std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
};

}  // namespace

namespace internal {

bool Sha256HasShaNiForTest() { return HasShaNi(); }

std::string Sha256ForTest(const std::string& data, std::size_t chunk, bool portable) {
  Sha sha(portable ? CompressPortable : BestCompress());
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  if (chunk == 0) chunk = std::max<std::size_t>(data.size(), 1);
  for (std::size_t at = 0; at < data.size(); at += chunk) {
    sha.Update(p + at, std::min(chunk, data.size() - at));
  }
  return sha.Hex();
}

}  // namespace internal

std::string Sha256(const std::string& data) {
  Sha sha;
  sha.Update(reinterpret_cast<const unsigned char*>(data.data()), data.size());
  return sha.Hex();
}

std::string Sha256File(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "";
  Sha sha;
  unsigned char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) sha.Update(buf, n);
  std::fclose(f);
  return sha.Hex();
}

}  // namespace kvtier
