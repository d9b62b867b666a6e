// GPU tests: each CUDA kernel against its CPU reference (kernels/reference.h) on fresh random
// inputs, with NaN-poisoned outputs and explicit tolerances. Skips where no device is present.
#include "kernels/cuda_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cublas_gemm.h"
#include "kernels/reference.h"

namespace kvtier::kernels {
namespace {

constexpr float kRtol = 1e-4f;
constexpr float kAtol = 1e-5f;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;  // cudaGetDeviceCount leaves it untouched on failure
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device: "
                   << (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    seed_ = std::random_device{}();
    RecordProperty("seed", static_cast<int>(seed_));
  }
  void TearDown() override {
    for (void* p : allocs_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::vector<float> Random(size_t n) {
    std::mt19937 rng(seed_++);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  }
  template <typename T>
  T* Upload(const std::vector<T>& h) {
    void* raw = nullptr;
    EXPECT_EQ(cudaMalloc(&raw, h.size() * sizeof(T)), cudaSuccess);
    T* d = static_cast<T*>(raw);
    allocs_.push_back(raw);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  template <typename T>
  T* Poisoned(size_t n) {  // all bits set: NaN for floats, -1 for ints
    void* raw = nullptr;
    EXPECT_EQ(cudaMalloc(&raw, n * sizeof(T)), cudaSuccess);
    T* d = static_cast<T*>(raw);
    allocs_.push_back(raw);
    EXPECT_EQ(cudaMemset(d, 0xFF, n * sizeof(T)), cudaSuccess);
    return d;
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      // NaN never passes: the comparison below is false for NaN.
      const bool ok = std::fabs(got[i] - want[i]) <= kAtol + kRtol * std::fabs(want[i]);
      ASSERT_TRUE(ok) << "index " << i << ": got " << got[i] << ", want " << want[i];
    }
  }

  cudaStream_t stream_ = nullptr;
  uint32_t seed_ = 0;
  std::vector<void*> allocs_;
};

const AttentionShape kShapes[] = {{1, 32, 8, 128, 300}, {17, 8, 8, 64, 1000}, {3, 4, 1, 96, 5}};

TEST_F(CudaOpsTest, ProbeScoresMatchReference) {
  for (const AttentionShape& s : kShapes) {
    auto q = Random(s.q_floats()), k = Random(s.kv_floats());
    std::vector<float> probs(s.prob_floats()), colsum(s.colsum_floats());
    ASSERT_TRUE(ProbeScoresRef(s, q.data(), k.data(), probs.data(), colsum.data()).ok());
    float* dp = Poisoned<float>(s.prob_floats());
    float* dc = Poisoned<float>(s.colsum_floats());
    ASSERT_TRUE(ProbeScoresCuda(s, Upload(q), Upload(k), dp, dc, stream_).ok());
    ExpectClose(Download(dp, s.prob_floats()), probs);
    ExpectClose(Download(dc, s.colsum_floats()), colsum);
  }
}

TEST_F(CudaOpsTest, TopKMatchesReferenceIncludingTies) {
  const TopKShape s{9, 2000, 64};
  auto scores = Random(s.rows * s.cols);
  for (int i = 0; i < 300; ++i) scores[i * 31] = scores[i * 31 + 2];  // ties
  std::vector<int32_t> want(s.rows * s.k);
  ASSERT_TRUE(TopKRef(s, scores.data(), want.data()).ok());
  int32_t* d = Poisoned<int32_t>(want.size());
  ASSERT_TRUE(TopKCuda(s, Upload(scores), d, stream_).ok());
  EXPECT_EQ(Download(d, want.size()), want);
}

TEST_F(CudaOpsTest, GatherMatchesReference) {
  const ChunkedKvLayout l{64, 8 * 128, 5};
  std::vector<std::vector<float>> chunks;
  std::vector<const float*> host_ptrs, dev_ptrs;
  for (int c = 0; c < l.num_chunks; ++c) {
    chunks.push_back(Random(int64_t{l.chunk_tokens} * l.row_floats));
    host_ptrs.push_back(chunks.back().data());
    dev_ptrs.push_back(Upload(chunks.back()));
  }
  std::mt19937 rng(seed_);
  std::vector<int32_t> tokens(100);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % l.tokens());
  std::vector<float> want(tokens.size() * l.row_floats);
  ASSERT_TRUE(GatherRowsRef(l, host_ptrs.data(), tokens.data(), 100, want.data()).ok());
  float* out = Poisoned<float>(want.size());
  ASSERT_TRUE(GatherRowsCuda(l, Upload(dev_ptrs), Upload(tokens), 100, out, stream_).ok());
  ExpectClose(Download(out, want.size()), want);
}

TEST_F(CudaOpsTest, AttentionMatchesReference) {
  for (const AttentionShape& s : kShapes) {
    auto q = Random(s.q_floats()), k = Random(s.kv_floats()), v = Random(s.kv_floats());
    std::vector<float> want(s.q_floats());
    ASSERT_TRUE(AttentionRef(s, q.data(), k.data(), v.data(), want.data()).ok());
    float* ws = Poisoned<float>(s.prob_floats());
    float* out = Poisoned<float>(s.q_floats());
    ASSERT_TRUE(AttentionCuda(s, Upload(q), Upload(k), Upload(v), ws, out, stream_).ok());
    ExpectClose(Download(out, s.q_floats()), want);
  }
}

TEST_F(CudaOpsTest, CublasGemmMatchesReference) {
  std::unique_ptr<CublasGemm> gemm;
  Status st = CublasGemm::Create(&gemm);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const int m = 33, n = 70, k = 128;
  auto a = Random(m * k), b = Random(k * n);
  for (bool transpose : {false, true}) {
    std::vector<float> want(m * n);
    ASSERT_TRUE(GemmRef(m, n, k, a.data(), b.data(), transpose, want.data()).ok());
    float* c = Poisoned<float>(m * n);
    ASSERT_TRUE(gemm->Gemm(m, n, k, Upload(a), Upload(b), transpose, c, stream_).ok());
    // cuBLAS may use TF32 on Ampere+ only when asked; fp32 default keeps these tolerances.
    std::vector<float> got = Download(c, m * n);
    for (int i = 0; i < m * n; ++i) {
      ASSERT_TRUE(std::fabs(got[i] - want[i]) <= 1e-3f + 1e-4f * std::fabs(want[i]))
          << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

TEST_F(CudaOpsTest, LowBitKeyScoresMatchReference) {
  // SmolLM2-like (9 heads over 3 KV heads, head_dim 64) and Mistral-like (32 over 8, 128).
  for (const LowBitKeyShape& s : {LowBitKeyShape{1, 32, 1024, 9, 3, 64},
                                  LowBitKeyShape{2, 32, 2048, 9, 3, 64},
                                  LowBitKeyShape{2, 64, 512, 32, 8, 128}}) {
    std::mt19937 rng(seed_++);
    std::vector<uint8_t> codes(int64_t{s.tokens} * s.kv_heads * s.head_dim);
    for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % (1u << s.bits));
    std::vector<uint32_t> packed(s.code_words());
    ASSERT_TRUE(PackLowBitCodes(s, codes.data(), packed.data()).ok());
    const auto scale = Random(s.param_floats()), zero = Random(s.param_floats()),
               q = Random(int64_t{s.heads} * s.head_dim);
    std::vector<float> want(s.score_floats());
    ASSERT_TRUE(LowBitKeyScoresRef(s, packed.data(), scale.data(), zero.data(), q.data(),
                                   want.data()).ok());
    float* out = Poisoned<float>(s.score_floats());
    ASSERT_TRUE(LowBitKeyScoresCuda(s, Upload(packed), Upload(scale), Upload(zero), Upload(q), out,
                                    stream_).ok());
    ExpectClose(Download(out, s.score_floats()), want);
  }
  EXPECT_FALSE(LowBitKeyScoresCuda({3, 32, 32, 1, 1, 1}, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, stream_).ok());
}

}  // namespace
}  // namespace kvtier::kernels
