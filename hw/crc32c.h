#pragma once
// CRC-32C (Castagnoli), the checksum of chunk records and manifest records in the chunk store.
// Uses the SSE4.2 crc32 instruction when the compiler targets it, a table otherwise; both give
// the same value (RFC 3720 test vector: "123456789" -> 0xE3069283). Thread-safe, no state.

#include <cstddef>
#include <cstdint>

namespace kvtier::hw {

// Extends `crc` (0 for a fresh checksum) over `size` bytes at `data`.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace kvtier::hw
