// LlamaModel against a naive double-precision reference on a tiny GGUF written by the test:
// full prefill, prefix + query, prefix + query with shared and per-KV-head kept subsets, and the
// H2O column sums. Also the input errors of Forward.

#include "models/llama.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "core/errors.h"
#include "tests/models/tiny_model.h"

namespace kvtier {
namespace {

using testing::ReferenceForward;
using testing::TinySpec;
using testing::WriteTinyLlama;
using Kept = std::vector<std::vector<std::set<int32_t>>>;

constexpr double kTol = 1e-4;  // relative L2 error allowed for float32 vs double

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvtier_llama_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

double RelErr(const std::vector<float>& got, const std::vector<std::vector<double>>& ref) {
  double num = 0, den = 0;
  size_t k = 0;
  for (const auto& row : ref) {
    for (double r : row) {
      const double g = got.at(k++);
      EXPECT_TRUE(std::isfinite(g));
      num += (g - r) * (g - r);
      den += r * r;
    }
  }
  EXPECT_EQ(k, got.size());
  return std::sqrt(num / den);
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = u(rng);
  return t;
}

class TinyLlamaTest : public ::testing::TestWithParam<bool> {  // param: tied embeddings
 protected:
  void SetUp() override {
    spec_.tied = GetParam();
    path_ = TempPath(spec_.tied ? "tied.gguf" : "untied.gguf");
    vocab_ = WriteTinyLlama(path_, spec_);
    model_ = LlamaModel::Load(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  // Checks logits and column sums of query rows [n_prefix, T) against the reference.
  void CheckQuery(const std::vector<int32_t>& tokens, int n_prefix, const Kept& kept,
                  const PrefixSelection& sel) {
    KvCache cache = model_->NewCache();
    if (n_prefix > 0) {
      model_->Forward(std::span(tokens).first(n_prefix), &cache);
      ASSERT_EQ(cache.n_tokens, n_prefix);
    }
    ForwardOptions opt;
    opt.all_logits = true;
    opt.importance = true;
    const ForwardResult r =
        model_->Forward(std::span(tokens).subspan(n_prefix), &cache, sel, opt);
    const testing::RefResult ref = ReferenceForward(path_, tokens, n_prefix, kept);
    const int n = static_cast<int>(tokens.size()) - n_prefix;
    ASSERT_EQ(r.logits_rows, n);
    const double err = RelErr(r.logits, ref.logits);
    EXPECT_LT(err, kTol) << "logits";

    // Column sums: per query head against the reference; each head's sums total n (every row's
    // weights sum to 1); the KV-head aggregate is the sum over its group.
    const AttentionImportance& imp = r.importance;
    ASSERT_EQ(imp.n_columns, static_cast<int>(tokens.size()));
    ASSERT_EQ(imp.n_cached, n_prefix);
    const LlamaConfig& c = model_->config();
    for (int l = 0; l < c.n_layers; ++l) {
      std::vector<double> flat_ref;
      std::vector<float> flat_got;
      for (int h = 0; h < c.n_heads; ++h) {
        const std::vector<float>& got = imp.per_q_head[l][h];
        const double total = std::accumulate(got.begin(), got.end(), 0.0);
        EXPECT_NEAR(total, n, 1e-4 * n) << "layer " << l << " head " << h;
        for (int j = 0; j < imp.n_columns; ++j) {
          flat_got.push_back(got[j]);
          flat_ref.push_back(ref.colsum[l][h][j]);
          if (!kept.empty() && j < n_prefix && !kept[l][h / c.group_size()].count(j)) {
            EXPECT_EQ(got[j], 0.0f) << "unkept column " << j << " has weight";
          }
        }
      }
      EXPECT_LT(RelErr(flat_got, {flat_ref}), kTol) << "column sums, layer " << l;
      for (int g = 0; g < c.n_kv_heads; ++g) {
        for (int j = 0; j < imp.n_columns; ++j) {
          double sum = 0;
          for (int h = g * c.group_size(); h < (g + 1) * c.group_size(); ++h) {
            sum += imp.per_q_head[l][h][j];
          }
          EXPECT_NEAR(imp.per_kv_head[l][g][j], sum, 1e-5);
        }
      }
    }
  }

  TinySpec spec_;
  std::string path_;
  int vocab_ = 0;
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(TinyLlamaTest, LoadsConfigFromMetadata) {
  const LlamaConfig& c = model_->config();
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.d_ff, 96);
  EXPECT_EQ(c.vocab_size, vocab_);
  EXPECT_EQ(c.context_length, 64);
  ASSERT_NE(model_->tokenizer(), nullptr);
  EXPECT_EQ(model_->tokenizer()->vocab_size(), vocab_);
}

TEST_P(TinyLlamaTest, FullPrefillMatchesReference) {
  CheckQuery(RandomTokens(37, vocab_, 7), 0, {}, {});
}

TEST_P(TinyLlamaTest, PrefixThenQueryMatchesReference) {
  CheckQuery(RandomTokens(40, vocab_, 8), 29, {}, {});
}

TEST_P(TinyLlamaTest, QueryAgainstSharedKeptSubsetMatchesReference) {
  const std::vector<int32_t> tokens = RandomTokens(40, vocab_, 9);
  const int n_prefix = 30;
  // Layer 0 keeps a shared set, layer 1 keeps everything.
  const std::vector<int32_t> keep0 = {0, 1, 5, 6, 7, 13, 20, 28, 29};
  Kept kept(2, std::vector<std::set<int32_t>>(2));
  for (int g = 0; g < 2; ++g) {
    kept[0][g] = std::set<int32_t>(keep0.begin(), keep0.end());
    for (int j = 0; j < n_prefix; ++j) kept[1][g].insert(j);
  }
  PrefixSelection sel;
  sel.n_prefix = n_prefix;
  sel.layers = {LayerKeep::Shared(keep0), LayerKeep::All()};
  CheckQuery(tokens, n_prefix, kept, sel);
}

TEST_P(TinyLlamaTest, QueryAgainstPerKvHeadSubsetsMatchesReference) {
  const std::vector<int32_t> tokens = RandomTokens(45, vocab_, 10);
  const int n_prefix = 33;
  const std::vector<std::vector<std::vector<int32_t>>> sets = {
      {{0, 2, 4, 8, 16, 32}, {1, 3, 5, 7, 30, 31, 32}},
      {{}, {0, 10, 11, 12, 13}}};  // an empty set: that head sees only the query
  Kept kept(2, std::vector<std::set<int32_t>>(2));
  PrefixSelection sel;
  sel.n_prefix = n_prefix;
  for (int l = 0; l < 2; ++l) {
    for (int g = 0; g < 2; ++g) kept[l][g] = std::set<int32_t>(sets[l][g].begin(), sets[l][g].end());
    sel.layers.push_back(LayerKeep::PerKvHead(sets[l]));
  }
  CheckQuery(tokens, n_prefix, kept, sel);
}

TEST_P(TinyLlamaTest, SameEverywhereHelperSelectsInEveryLayer) {
  const std::vector<int32_t> tokens = RandomTokens(30, vocab_, 11);
  const std::vector<int32_t> keep = {3, 4, 9, 19};
  Kept kept(2, std::vector<std::set<int32_t>>(2, std::set<int32_t>(keep.begin(), keep.end())));
  CheckQuery(tokens, 20, kept, PrefixSelection::SameEverywhere(2, 20, keep));
}

TEST_P(TinyLlamaTest, IncrementalDecodeEqualsOnePrefill) {
  const std::vector<int32_t> tokens = RandomTokens(20, vocab_, 12);
  KvCache full;
  ForwardOptions all;
  all.all_logits = true;
  const ForwardResult one = model_->Prefill(tokens, &full, all);
  KvCache inc = model_->NewCache();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const ForwardResult r = model_->Forward(std::span(tokens).subspan(i, 1), &inc);
    const auto last = r.LastLogits(vocab_);
    for (int v = 0; v < vocab_; ++v) {
      ASSERT_NEAR(last[v], one.logits[i * vocab_ + v], 1e-4 * (1 + std::fabs(last[v])));
    }
  }
  ASSERT_EQ(inc.n_tokens, full.n_tokens);
  for (int l = 0; l < 2; ++l) {
    for (size_t e = 0; e < full.k[l].size(); ++e) ASSERT_NEAR(inc.k[l][e], full.k[l][e], 1e-4);
  }
}

TEST_P(TinyLlamaTest, NoCacheUpdateLeavesCacheAndTruncateRestores) {
  const std::vector<int32_t> tokens = RandomTokens(16, vocab_, 13);
  KvCache cache;
  model_->Prefill(std::span(tokens).first(10), &cache);
  ForwardOptions opt;
  opt.update_cache = false;
  const ForwardResult a = model_->Forward(std::span(tokens).subspan(10), &cache, {}, opt);
  EXPECT_EQ(cache.n_tokens, 10);
  const ForwardResult b = model_->Forward(std::span(tokens).subspan(10), &cache);
  EXPECT_EQ(cache.n_tokens, 16);
  EXPECT_EQ(a.logits, b.logits);
  cache.Truncate(10);
  EXPECT_EQ(cache.n_tokens, 10);
  const ForwardResult c = model_->Forward(std::span(tokens).subspan(10), &cache);
  EXPECT_EQ(c.logits, b.logits);
}

TEST_P(TinyLlamaTest, NextTokenLogProbsMatchLogSoftmaxOfLogits) {
  const std::vector<int32_t> tokens = RandomTokens(12, vocab_, 14);
  KvCache cache;
  ForwardOptions opt;
  opt.all_logits = true;
  const ForwardResult r = model_->Prefill(tokens, &cache, opt);
  const std::vector<double> lp = model_->NextTokenLogProbs(r, std::span(tokens).subspan(1));
  ASSERT_EQ(lp.size(), 11u);
  for (int i = 0; i < 11; ++i) {
    double mx = -1e30, s = 0;
    for (int v = 0; v < vocab_; ++v) mx = std::max<double>(mx, r.logits[i * vocab_ + v]);
    for (int v = 0; v < vocab_; ++v) s += std::exp(r.logits[i * vocab_ + v] - mx);
    EXPECT_NEAR(lp[i], r.logits[i * vocab_ + tokens[i + 1]] - mx - std::log(s), 1e-4);
  }
  double nll = 0;
  for (double x : lp) nll -= x;
  EXPECT_NEAR(model_->Perplexity(tokens), std::exp(nll / 11), 1e-6 * std::exp(nll / 11));
}

TEST_P(TinyLlamaTest, GenerateIsGreedy) {
  const std::vector<int32_t> prompt = RandomTokens(5, vocab_, 15);
  const std::vector<int32_t> out = model_->Generate(prompt, 4);
  ASSERT_EQ(out.size(), 4u);
  std::vector<int32_t> seq = prompt;
  for (int32_t t : out) {
    KvCache c;
    const ForwardResult r = model_->Prefill(seq, &c);
    EXPECT_EQ(t, ArgMax(r.LastLogits(vocab_)));
    seq.push_back(t);
  }
}

TEST_P(TinyLlamaTest, TextLongerThanContextIsInputError) {
  const std::vector<int32_t> tokens = RandomTokens(65, vocab_, 16);  // context is 64
  KvCache cache;
  try {
    model_->Prefill(tokens, &cache);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the context length 64"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
  // 60 cached + 5 new also passes the context.
  model_->Prefill(std::span(tokens).first(60), &cache);
  EXPECT_THROW(model_->Forward(std::span(tokens).subspan(60), &cache), InputError);
}

TEST_P(TinyLlamaTest, BadTokensAndSelectionsAreInputErrors) {
  KvCache cache;
  const std::vector<int32_t> bad = {1, vocab_};
  EXPECT_THROW(model_->Prefill(bad, &cache), InputError);
  const std::vector<int32_t> tokens = RandomTokens(12, vocab_, 17);
  model_->Prefill(std::span(tokens).first(8), &cache);
  const auto q = std::span(tokens).subspan(8);
  EXPECT_THROW(model_->Forward(q, &cache, PrefixSelection::SameEverywhere(2, 8, {3, 2})),
               InputError);  // not increasing
  EXPECT_THROW(model_->Forward(q, &cache, PrefixSelection::SameEverywhere(2, 8, {8})),
               InputError);  // outside the prefix
  EXPECT_THROW(model_->Forward(q, &cache, PrefixSelection::SameEverywhere(3, 8, {1})),
               InputError);  // wrong layer count
  EXPECT_THROW(model_->Forward(q, &cache, PrefixSelection::SameEverywhere(2, 9, {1})),
               InputError);  // n_prefix beyond the cache
  PrefixSelection per_head;
  per_head.n_prefix = 8;
  per_head.layers = {LayerKeep::PerKvHead({{1}}), LayerKeep::All()};  // 1 set for 2 KV heads
  EXPECT_THROW(model_->Forward(q, &cache, per_head), InputError);
}

INSTANTIATE_TEST_SUITE_P(Embeddings, TinyLlamaTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

}  // namespace
}  // namespace kvtier
