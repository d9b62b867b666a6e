#pragma once
// Helpers for the hw/ tests: a scratch directory on the real disk (not tmpfs: O_DIRECT must
// hit the block device) and deterministic chunk contents.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace kvtier::hw::testing {

class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("KVTIER_HW_TEST_DIR");
    std::filesystem::path root = base ? base : std::filesystem::temp_directory_path();
    path_ = root / ("kvtier_hw_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// Bytes of version `version` of chunk `id`: a header (id, version, size) then a pattern from
// a seeded generator, so any stale or foreign bytes are detected.
inline std::vector<std::byte> ChunkBytes(uint64_t id, uint64_t version, size_t size) {
  std::vector<std::byte> b(size);
  std::mt19937_64 rng(id * 1000003ull + version);
  for (size_t i = 0; i < size; i += 8) {
    uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < size; ++j) b[i + j] = std::byte(v >> (8 * j));
  }
  const uint64_t header[3] = {id, version, size};
  for (size_t i = 0; i < sizeof(header) && i < size; ++i) {
    b[i] = reinterpret_cast<const std::byte*>(header)[i];
  }
  return b;
}

}  // namespace kvtier::hw::testing
