#pragma once
// Counter-based hashing shared by the importance model, the importer and the statistics.
// Pure functions; stable across platforms and releases of kvtier (traces depend on them:
// changing one changes every procedural trace, which needs a format version bump).

#include <cstdint>

namespace kvtier::hash {

// splitmix64 finaliser.
inline std::uint64_t Mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::uint64_t Combine(std::uint64_t a, std::uint64_t b) {
  return Mix64(a ^ (b * 0xD6E8FEB86659FD93ull) ^ 0x5851F42D4C957F2Dull);
}

// lowbias32 (Chris Wellons): a bijective 32-bit mixer, cheap enough to vectorise.
inline std::uint32_t Hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Chain hash of prefix symbols: h_0 = ChainStart(tps), h_{i+1} = ChainNext(h_i, symbol_i).
// Two prefixes share h_i exactly when their first i symbols (and symbol size) agree.
inline std::uint64_t ChainStart(int tokens_per_symbol) {
  return Mix64(0x6B76746965720001ull ^ static_cast<std::uint64_t>(tokens_per_symbol));
}
inline std::uint64_t ChainNext(std::uint64_t h, std::uint64_t symbol) { return Combine(h, symbol); }

}  // namespace kvtier::hash
