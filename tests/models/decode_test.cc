// Decoding with KIVI and SpeCache on a tiny GGUF (models/decode.h) against the naive
// double-precision reference (tests/models/tiny_model.h, ReferenceDecode): logits of every step
// and the 16-bit sets every step read, for each method, 1 and 2 bits, original and improved
// 1-bit quantization. Plus properties that need no reference: with k covering every low-bit
// position SpeCache is the 16-bit cache, the speculative token's set is the next step's fetch,
// pre-decoding runs once and appends nothing, and the hit rate of a complete set is 1; and a
// batched step (Decoder::StepBatch) is, decoder by decoder, the unbatched step.

#include "models/decode.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <set>

#include "core/errors.h"
#include "tests/models/tiny_model.h"

namespace kvtier {
namespace {

using testing::RefDecodeOptions;
using testing::ReferenceDecode;

constexpr double kTol = 1e-4;  // relative L2 error of float32 logits vs double

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvtier_decode_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

double RelErr(std::span<const float> got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  EXPECT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got[i]));
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

std::set<int32_t> AsSet(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

class DecodeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::TinySpec spec;
    spec.context_length = 128;
    spec.seed = 7;
    path_ = new std::string(TempPath("tiny.gguf"));
    vocab_ = testing::WriteTinyLlama(*path_, spec);
    model_ = LlamaModel::Load(*path_).release();
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete model_;
    delete path_;
  }

  static std::vector<int32_t> Tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> u(0, vocab_ - 1);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = u(rng);
    return t;
  }

  static DecodeOptions Options(const RefDecodeOptions& r) {
    DecodeOptions o;
    o.method = r.method == "full"              ? DecodeMethod::kFull
               : r.method == "kivi"            ? DecodeMethod::kKivi
               : r.method == "specache"        ? DecodeMethod::kSpeCache
                                               : DecodeMethod::kSpeCacheNoSpec;
    o.quant.bits = r.bits;
    o.quant.group = r.group;
    o.quant.residual = r.residual;
    o.quant.improved_1bit = r.improved_1bit;
    o.k = r.k;
    o.measure = true;
    return o;
  }

  // Decodes `outputs` after `prompt` and compares every step with the reference.
  static void CheckAgainstReference(const RefDecodeOptions& r) {
    SCOPED_TRACE(r.method + " " + std::to_string(r.bits) + "-bit" +
                 (r.improved_1bit ? "" : " original") + " k=" + std::to_string(r.k));
    const std::vector<int32_t> prompt = Tokens(37, 11), outputs = Tokens(12, 12);
    const testing::RefDecodeResult ref = ReferenceDecode(*path_, prompt, outputs, r);
    KvCache cache;
    model_->Prefill(prompt, &cache);
    Decoder d(*model_, cache, Options(r));
    for (size_t t = 0; t < outputs.size(); ++t) {
      SCOPED_TRACE("step " + std::to_string(t));
      const std::span<const float> logits = d.Step(outputs[t]);
      EXPECT_LT(RelErr(logits, ref.logits[t]), kTol);
      EXPECT_EQ(d.cache().n_tokens, static_cast<int>(prompt.size() + t + 1));
      if (r.method == "specache") {
        EXPECT_EQ(d.speculative_token(), ref.speculative[t]);
      }
      const PositionSets& got = d.last().fetched;
      if (r.method == "full" || r.method == "kivi") {
        EXPECT_TRUE(got.empty());
        continue;
      }
      ASSERT_EQ(got.size(), ref.fetched[t].size());
      for (size_t l = 0; l < got.size(); ++l) {
        for (size_t g = 0; g < got[l].size(); ++g) {
          EXPECT_EQ(AsSet(got[l][g]), ref.fetched[t][l][g]) << "layer " << l << " head " << g;
          EXPECT_EQ(got[l][g].size(),
                    std::min<size_t>(r.k, static_cast<size_t>(d.last().low_bit)));
        }
      }
    }
  }

  static std::string* path_;
  static int vocab_;
  static LlamaModel* model_;
};

std::string* DecodeTest::path_ = nullptr;
int DecodeTest::vocab_ = 0;
LlamaModel* DecodeTest::model_ = nullptr;

TEST_F(DecodeTest, FullMatchesReference) { CheckAgainstReference({.method = "full"}); }

TEST_F(DecodeTest, KiviMatchesReference) {
  for (int bits : {1, 2}) CheckAgainstReference({.method = "kivi", .bits = bits});
  CheckAgainstReference({.method = "kivi", .bits = 1, .improved_1bit = false});
}

TEST_F(DecodeTest, SpeCacheMatchesReference) {
  for (int bits : {1, 2}) CheckAgainstReference({.method = "specache", .bits = bits});
  CheckAgainstReference({.method = "specache", .bits = 1, .improved_1bit = false});
  CheckAgainstReference({.method = "specache", .bits = 2, .group = 2, .residual = 4, .k = 7});
}

TEST_F(DecodeTest, SpeCacheWithoutSpeculationMatchesReference) {
  for (int bits : {1, 2}) CheckAgainstReference({.method = "specache_nospec", .bits = bits});
}

TEST_F(DecodeTest, LowBitChangesTheLogits) {
  // The comparisons above would pass vacuously if quantization did nothing: it must change
  // the logits.
  KvCache cache;
  model_->Prefill(Tokens(37, 11), &cache);
  DecodeOptions full, kivi;
  kivi.method = DecodeMethod::kKivi;
  kivi.quant.group = 4;
  kivi.quant.residual = 8;
  kivi.quant.bits = 1;
  Decoder a(*model_, cache, full), b(*model_, cache, kivi);
  const std::span<const float> fa = a.Step(5);
  const std::vector<double> ref(fa.begin(), fa.end());
  EXPECT_GT(RelErr(b.Step(5), ref), 1e-3);
}

TEST_F(DecodeTest, CompleteFetchIsTheSixteenBitCache) {
  // With k >= every low-bit position, SpeCache and its non-speculative variant read all KV in
  // 16 bits: the same logits as the 16-bit cache, and every hit rate is 1.
  const std::vector<int32_t> prompt = Tokens(37, 21), outputs = Tokens(8, 22);
  KvCache cache;
  model_->Prefill(prompt, &cache);
  DecodeOptions full;
  for (DecodeMethod m : {DecodeMethod::kSpeCache, DecodeMethod::kSpeCacheNoSpec}) {
    DecodeOptions o;
    o.method = m;
    o.quant.bits = 1;
    o.quant.group = 4;
    o.quant.residual = 8;
    o.k = 1000;
    o.measure = true;
    Decoder d(*model_, cache, o);
    Decoder r(*model_, cache, full);
    for (int32_t t : outputs) {
      const std::span<const float> want = r.Step(t);
      const std::vector<double> w(want.begin(), want.end());
      EXPECT_LT(RelErr(d.Step(t), w), 1e-5) << DecodeMethodName(m);
      const auto& mass = d.last().mass;
      ASSERT_GT(mass.shares, 0);
      EXPECT_NEAR(mass.hit_share / mass.shares, 1.0, 1e-6);
      EXPECT_NEAR(mass.oracle_share / mass.shares, 1.0, 1e-6);
    }
  }
}

TEST_F(DecodeTest, SpeculativeSetIsNextStepsFetchAndPreDecodingRunsOnce) {
  const std::vector<int32_t> prompt = Tokens(40, 31), outputs = Tokens(10, 32);
  KvCache cache;
  model_->Prefill(prompt, &cache);
  DecodeOptions o;
  o.method = DecodeMethod::kSpeCache;
  o.quant.group = 4;
  o.quant.residual = 8;
  o.k = 5;
  o.measure = true;
  o.keep_exact_scores = true;
  Decoder d(*model_, cache, o);
  EXPECT_EQ(d.speculative_token(), -1);
  for (size_t t = 0; t < outputs.size(); ++t) {
    d.Step(outputs[t]);
    const DecodeStepInfo& s = d.last();
    EXPECT_EQ(s.forwards, t == 0 ? 2 : 1);  // pre-decoding before the first step only
    EXPECT_EQ(s.context, static_cast<int>(prompt.size() + t));
    EXPECT_EQ(d.cache().n_tokens, s.context + 1);  // the speculative token is not appended
    EXPECT_GE(d.speculative_token(), 0);
    const LlamaConfig& c = model_->config();
    ASSERT_EQ(static_cast<int>(s.exact.size()), c.n_layers);
    ASSERT_EQ(static_cast<int>(s.exact_scores.size()), c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      for (int g = 0; g < c.n_kv_heads; ++g) {
        // Ranked: scores non-increasing along the exact top-k; sets within the low-bit range.
        const auto& ex = s.exact[l][g];
        const auto& sc = s.exact_scores[l][g];
        ASSERT_EQ(static_cast<int>(sc.size()), s.context + 1);
        for (size_t i = 1; i < ex.size(); ++i) EXPECT_GE(sc[ex[i - 1]], sc[ex[i]]);
        for (int32_t p : s.fetched[l][g]) EXPECT_LT(p, s.low_bit);
        // Each query head's weights sum to 1: the KV head's sum is the group size.
        double total = 0;
        for (float x : sc) total += x;
        EXPECT_NEAR(total, c.group_size(), 1e-4);
      }
    }
    const double hit = s.mass.hit_share / s.mass.shares;
    const double oracle = s.mass.oracle_share / s.mass.shares;
    EXPECT_GE(hit, 0.0);
    EXPECT_LE(hit, oracle + 1e-9);  // no k-set covers more than the exact top-k
  }
}

TEST_F(DecodeTest, BatchedStepsAreTheUnbatchedSteps) {
  // Decoder::StepBatch stacks several sequences' rows in every projection and FFN product:
  // each decoder must see, token by token, what Step alone gives it -- logits, the sets it
  // read and picked, the speculative token, its cache -- whatever the batch mixes: methods,
  // prompt lengths, and SpeCache's pre-decoding for some members only (one joins late).
  struct Member {
    DecodeOptions o;
    int prompt;
    int joins;  // the step the member joins the batch at
  };
  const auto opts = [](DecodeMethod m, int bits, int k) {
    DecodeOptions o;
    o.method = m;
    o.quant.bits = bits;
    o.quant.group = 4;
    o.quant.residual = 8;
    o.k = k;
    o.measure = true;
    o.keep_exact_scores = true;
    return o;
  };
  const std::vector<Member> members = {
      {opts(DecodeMethod::kFull, 2, 4), 37, 0},
      {opts(DecodeMethod::kKivi, 1, 4), 21, 0},
      {opts(DecodeMethod::kSpeCache, 2, 5), 40, 0},
      {opts(DecodeMethod::kSpeCacheNoSpec, 2, 3), 29, 0},
      {opts(DecodeMethod::kSpeCache, 1, 6), 33, 3},  // pre-decodes while the others step
  };
  const int steps = 9;
  std::vector<std::unique_ptr<Decoder>> alone, batched;
  std::vector<std::vector<int32_t>> outputs;
  for (size_t i = 0; i < members.size(); ++i) {
    KvCache cache;
    model_->Prefill(Tokens(members[i].prompt, 100 + i), &cache);
    alone.push_back(std::make_unique<Decoder>(*model_, cache, members[i].o));
    batched.push_back(std::make_unique<Decoder>(*model_, cache, members[i].o));
    outputs.push_back(Tokens(steps, 200 + i));
  }
  for (int t = 0; t < steps; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    std::vector<Decoder*> batch;
    std::vector<int32_t> tokens;
    std::vector<size_t> who;
    for (size_t i = 0; i < members.size(); ++i) {
      if (t < members[i].joins) continue;
      batch.push_back(batched[i].get());
      tokens.push_back(outputs[i][t - members[i].joins]);
      who.push_back(i);
    }
    Decoder::StepBatch(batch, tokens);
    for (size_t j = 0; j < who.size(); ++j) {
      const size_t i = who[j];
      SCOPED_TRACE("member " + std::to_string(i) + " " + DecodeMethodName(members[i].o.method));
      Decoder& a = *alone[i];
      const Decoder& b = *batched[i];
      const std::span<const float> want = a.Step(tokens[j]);
      const std::vector<double> w(want.begin(), want.end());
      EXPECT_LT(RelErr(b.logits(), w), 1e-5);
      EXPECT_EQ(b.cache().n_tokens, a.cache().n_tokens);
      EXPECT_EQ(b.speculative_token(), a.speculative_token());
      EXPECT_EQ(b.last().context, a.last().context);
      EXPECT_EQ(b.last().low_bit, a.last().low_bit);
      EXPECT_EQ(b.last().forwards, a.last().forwards);
      EXPECT_EQ(b.last().fetched, a.last().fetched);
      EXPECT_EQ(b.last().exact, a.last().exact);
      ASSERT_EQ(b.last().exact_scores.size(), a.last().exact_scores.size());
      EXPECT_NEAR(b.last().mass.hit_share, a.last().mass.hit_share, 1e-4);
      EXPECT_NEAR(b.last().mass.oracle_share, a.last().mass.oracle_share, 1e-4);
      EXPECT_EQ(b.last().mass.shares, a.last().mass.shares);
      for (int l = 0; l < model_->config().n_layers; ++l) {
        ASSERT_EQ(b.cache().k[l].size(), a.cache().k[l].size());
        for (size_t x = 0; x < a.cache().k[l].size(); ++x) {
          ASSERT_NEAR(b.cache().k[l][x], a.cache().k[l][x], 1e-4) << "layer " << l;
          ASSERT_NEAR(b.cache().v[l][x], a.cache().v[l][x], 1e-4) << "layer " << l;
        }
      }
    }
  }
  // A member that joined late pre-decoded on its first batched step only.
  EXPECT_EQ(batched[4]->cache().n_tokens, members[4].prompt + steps - members[4].joins);
}

TEST_F(DecodeTest, GpuKvBytes) {
  const LlamaConfig& c = model_->config();  // 2 layers, 2 KV heads, head_dim 16
  DecodeOptions full;
  EXPECT_EQ(DecodeGpuKvBytes(c, full, 100), 100ull * 2 * 2 * 16 * 2 * 2);
  DecodeOptions s;
  s.method = DecodeMethod::kSpeCache;
  s.quant.group = 4;
  s.quant.residual = 8;
  s.k = 10;
  const std::uint64_t kivi =
      KiviCache::GpuBytes(s.quant, 100, c.n_layers, c.n_kv_heads, c.head_dim);
  EXPECT_EQ(DecodeGpuKvBytes(c, s, 100), kivi + 10ull * 2 * 16 * 2 * 2 * 2);
  EXPECT_DOUBLE_EQ(DecodeKvSizeRatio(c, s, 100),
                   (kivi + 10.0 * 2 * 16 * 2 * 2 * 2) / (100.0 * 2 * 2 * 16 * 2 * 2));
}

TEST_F(DecodeTest, BadConfigurationsAreInputErrors) {
  KvCache cache;
  model_->Prefill(Tokens(10, 1), &cache);
  DecodeOptions o;
  o.method = DecodeMethod::kKivi;
  o.quant.bits = 4;
  EXPECT_THROW(Decoder(*model_, cache, o), InputError);
  o.method = DecodeMethod::kSpeCache;
  o.quant.bits = 2;
  o.quant.group = 4;
  o.quant.residual = 8;
  o.k = 0;
  EXPECT_THROW(Decoder(*model_, cache, o), InputError);
}

}  // namespace
}  // namespace kvtier
