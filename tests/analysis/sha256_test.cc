// Sha256 and Sha256File (analysis/sha256.cc): the FIPS 180-4 example vectors, every length
// around the padding boundaries, and the SHA-NI compression against the portable one on the
// same inputs (both run where the CPU has SHA-NI; elsewhere those comparisons are portable vs
// portable and still check the chunked input path).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "analysis/results_db.h"

namespace kvtier {
namespace internal {

// Test hooks defined in analysis/sha256.cc (no header on purpose).
bool Sha256HasShaNiForTest();
std::string Sha256ForTest(const std::string& data, std::size_t chunk, bool portable);

}  // namespace internal

namespace {

// Deterministic pseudo-random bytes (splitmix64), so a failure reproduces.
std::string RandomBytes(std::size_t n, std::uint64_t seed) {
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    out[i] = static_cast<char>(z ^ (z >> 31));
  }
  return out;
}

TEST(Sha256Test, FipsVectors) {
  EXPECT_EQ(Sha256(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqkl"
                   "mnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(Sha256(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, FipsVectorsPortable) {
  EXPECT_EQ(internal::Sha256ForTest("abc", 0, /*portable=*/true),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(internal::Sha256ForTest(std::string(1000000, 'a'), 0, /*portable=*/true),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths 0..200 cover 0-3 blocks and both padding cases (length byte fits after the data or
// spills into an extra block). The digest of all 201 hex digests, from Python's hashlib:
//   sha256(b"".join(sha256(bytes((i*131+7) & 0xff for i in range(n))).hexdigest().encode()
//                   for n in range(201)))
TEST(Sha256Test, EveryLengthUpTo200) {
  std::string all_fast, all_portable;
  for (std::size_t n = 0; n <= 200; ++n) {
    std::string data(n, '\0');
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<char>((i * 131 + 7) & 0xff);
    const std::string fast = Sha256(data);
    EXPECT_EQ(fast, internal::Sha256ForTest(data, 0, /*portable=*/true)) << "length " << n;
    EXPECT_EQ(fast, internal::Sha256ForTest(data, 1, /*portable=*/false)) << "length " << n;
    all_fast += fast;
    all_portable += internal::Sha256ForTest(data, 0, /*portable=*/true);
  }
  const char* const kExpected = "154b54ccc95ef3ef63bd0ca82ac6961f055f40a2e418a2ec4de07d2dc4c3d3b8";
  EXPECT_EQ(Sha256(all_fast), kExpected);
  EXPECT_EQ(Sha256(all_portable), kExpected);
}

// A few MB through both compressions, whole and in pieces that straddle block boundaries
// (partial block buffered, then multi-block runs straight from the input).
TEST(Sha256Test, ShaNiMatchesPortableOnRandomBytes) {
  if (!internal::Sha256HasShaNiForTest()) {
    std::printf("no SHA-NI on this CPU: comparing the portable path with itself\n");
  }
  const std::string data = RandomBytes((3 << 20) + 37, 1);
  const std::string expected = internal::Sha256ForTest(data, 0, /*portable=*/true);
  EXPECT_EQ(Sha256(data), expected);
  for (std::size_t chunk : {1, 7, 63, 64, 65, 127, 1000, 4096, 65537}) {
    EXPECT_EQ(internal::Sha256ForTest(data, chunk, /*portable=*/false), expected) << chunk;
  }
  EXPECT_EQ(internal::Sha256ForTest(data, 65, /*portable=*/true), expected);
}

// Sha256File reads in 64 KiB pieces; a size that is not a multiple of that (nor of 64) leaves a
// partial final read and a partial final block.
TEST(Sha256Test, FileMatchesString) {
  const std::string data = RandomBytes(5 * 65536 + 1000 + 37, 2);
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("kvtier_sha256_test_" + std::to_string(::getpid()));
  {
    std::ofstream out(path, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    ASSERT_TRUE(out.good());
  }
  const std::string from_file = Sha256File(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(from_file, Sha256(data));
  EXPECT_EQ(from_file, internal::Sha256ForTest(data, 0, /*portable=*/true));
}

TEST(Sha256Test, MissingFileIsEmpty) {
  EXPECT_EQ(Sha256File("/nonexistent/kvtier_sha256_test"), "");
}

}  // namespace
}  // namespace kvtier
