#pragma once
// Vocabulary types shared by every part of kvtier: tiers, KV kinds, chunk ids, units.
// Plain values; no behaviour beyond packing and naming. Thread-compatible.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace kvtier {

using Bytes = std::uint64_t;  // sizes and capacities
using Seconds = double;       // simulated or measured time
using RequestId = std::uint64_t;

// Where a chunk can live. The SSD holds every chunk; GPU and CPU are exclusive caches.
enum class Tier : std::uint8_t { kGpu = 0, kCpu = 1, kSsd = 2 };
std::string_view TierName(Tier tier);  // "gpu", "cpu", "ssd"

// What a chunk holds: keys or values of all KV heads of one layer, or the probe heads' keys
// (stored redundantly so ITF reads few bytes; SPEC §VI-E: 1.2% of the prefix KV storage).
enum class KvKind : std::uint8_t { kKey = 0, kValue = 1, kProbeKey = 2 };
std::string_view KvKindName(KvKind kind);  // "K", "V", "PK"

// A chunk: `chunk_tokens` consecutive stored tokens of one segment, one layer, one KvKind.
// A segment is one immutable stored run of prefix tokens (the NR part of some request, or a
// repacked copy made by the reorderer); see core/radix_tree.h. Packed into 64 bits so it can
// key hash maps and SQLite rows: segment 32 bits | kind 2 | layer 10 | index 20.
struct ChunkId {
  std::uint64_t value = 0;

  static ChunkId Make(std::uint32_t segment, KvKind kind, std::uint32_t layer,
                      std::uint32_t index) {
    return ChunkId{(std::uint64_t{segment} << 32) | (std::uint64_t(kind) << 30) |
                   (std::uint64_t(layer & 0x3FF) << 20) | (index & 0xFFFFF)};
  }
  std::uint32_t segment() const { return static_cast<std::uint32_t>(value >> 32); }
  KvKind kind() const { return static_cast<KvKind>((value >> 30) & 0x3); }
  std::uint32_t layer() const { return static_cast<std::uint32_t>((value >> 20) & 0x3FF); }
  std::uint32_t index() const { return static_cast<std::uint32_t>(value & 0xFFFFF); }

  friend bool operator==(ChunkId a, ChunkId b) { return a.value == b.value; }
  friend bool operator!=(ChunkId a, ChunkId b) { return a.value != b.value; }
  friend bool operator<(ChunkId a, ChunkId b) { return a.value < b.value; }
};

// "chunk 0x0000000500c00003 (segment 5, layer 3, V, index 3)": how every error names a chunk.
std::string DescribeChunk(ChunkId id);

inline constexpr std::uint32_t kMaxLayers = 1024;
inline constexpr std::uint32_t kMaxChunksPerSegment = 1u << 20;

}  // namespace kvtier

template <>
struct std::hash<kvtier::ChunkId> {
  std::size_t operator()(kvtier::ChunkId id) const noexcept {
    // splitmix64 finaliser: chunk ids differ mostly in their low bits.
    std::uint64_t z = id.value + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<std::size_t>(z ^ (z >> 31));
  }
};
