// The build's flags against a compiler bug (cmake/VectorConstantCheck.cmake): GCC 12.2 with
// AVX-512 stored constant vectors whose leading elements repeat and whose tail is zero as a
// broadcast of the first element ({3, 3, 0, 0} read back as {3, 3, 3, 3}). The configuration
// adds -fno-tree-slp-vectorize where its check program sees that; these stores, compiled with
// the project's flags, must read back as written in every build type.

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace kvtier {
namespace {

struct Params {
  std::vector<double> head_corr = {0.8};
  std::vector<double> recency;
  int sink_tokens = 4;
};

// Out of line, so the stores below happen and are read through memory.
__attribute__((noinline)) std::vector<double> ReadBack(const Params& p) { return p.recency; }
template <typename T>
__attribute__((noinline)) std::vector<T> Copy(const std::vector<T>& v) {
  return v;
}

// Element by element against scalars: an expected vector built from the same kind of
// initializer list could be stored wrongly the same way.
template <typename T>
void ExpectElements(const std::vector<T>& got, std::initializer_list<double> want) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t k = 0;
  for (double w : want) {
    EXPECT_EQ(double(got[k]), w) << "element " << k;
    ++k;
  }
}

TEST(CompilerFlags, ConstantVectorsWithAZeroTailAreStoredAsWritten) {
  Params p;
  p.sink_tokens = 0;
  p.recency = {3, 3, 0, 0};  // the assignment ImportanceModelV2.RecencyRaisesTheLastTokens makes
  ExpectElements(ReadBack(p), {3, 3, 0, 0});
  const std::vector<std::int64_t> i = {5, 5, 0, 0};
  ExpectElements(Copy(i), {5, 5, 0, 0});
  const std::vector<float> f = {3, 3, 3, 3, 0, 0, 0, 0};
  ExpectElements(Copy(f), {3, 3, 3, 3, 0, 0, 0, 0});
  const std::vector<double> d = {3, 3, 3, 0};
  ExpectElements(Copy(d), {3, 3, 3, 0});
}

}  // namespace
}  // namespace kvtier
