// The real SmolLM2-135M-Instruct (Q4_1 GGUF): config, tokenizer golden ids and round trips,
// "Paris", perplexity on a public-domain passage, and prefix selection on real attention.
// Skips unless the model file exists: $KVTIER_MODEL, else
// $HOME/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_model.sh puts it there).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <unordered_map>

#include "models/gguf.h"
#include "models/llama.h"

namespace kvtier {
namespace {

std::string ModelPath() {
  if (const char* p = std::getenv("KVTIER_MODEL"); p != nullptr && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");  // set by ctest
  return s ? s : KVTIER_TEST_SOURCE_DIR;             // set by tests/models/CMakeLists.txt
}

std::string ReadText(const std::string& path, size_t max_bytes = std::string::npos) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  return s.substr(0, std::min(max_bytes, s.size()));
}

class SmolLm2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::exists(ModelPath())) model_ = LlamaModel::Load(ModelPath()).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) {
      GTEST_SKIP() << "no model at " << ModelPath()
                   << " (run scripts/fetch_model.sh or set KVTIER_MODEL)";
    }
  }
  const Tokenizer& tok() const { return *model_->tokenizer(); }
  static LlamaModel* model_;
};
LlamaModel* SmolLm2Test::model_ = nullptr;

TEST_F(SmolLm2Test, ConfigFromMetadata) {
  const LlamaConfig& c = model_->config();
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.d_model, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0);
  ASSERT_NE(model_->tokenizer(), nullptr);
  EXPECT_EQ(tok().pre(), "smollm");
  EXPECT_EQ(tok().bos_id(), 1);
  EXPECT_EQ(tok().eos_id(), 2);
}

TEST_F(SmolLm2Test, GoldenTokenIds) {
  // Third-party vector for the SmolLM tokenizer; digits are split one by one.
  EXPECT_EQ(tok().Encode("Hello world! 123"),
            (std::vector<int32_t>{19556, 905, 17, 216, 33, 34, 35}));
  const std::vector<int32_t> chat = tok().Encode("<|im_start|>user\n<|im_end|>");
  ASSERT_GE(chat.size(), 3u);
  EXPECT_EQ(chat.front(), 1);  // <|im_start|> is one special token, matched before BPE
  EXPECT_EQ(chat.back(), 2);
  EXPECT_EQ(tok().Decode(std::span(chat).subspan(1, chat.size() - 2)), "user\n");
}

TEST_F(SmolLm2Test, TokenizerRoundTrips) {
  for (const char* name : {"pg11_alice_in_wonderland.txt", "pg972_devils_dictionary.txt",
                           "pg18_federalist_papers.txt"}) {
    const std::string path = SourceDir() + "/../shared/data/texts/" + name;
    const std::string alt = "/work/shared/data/texts/" + std::string(name);
    std::string text = ReadText(std::filesystem::exists(path) ? path : alt, 100000);
    if (text.empty()) continue;  // the shared corpus is optional; the excerpt below is not
    EXPECT_EQ(tok().Decode(tok().Encode(text)), text) << name;
  }
  const std::string excerpt = ReadText(SourceDir() + "/tests/data/alice_excerpt.txt");
  ASSERT_FALSE(excerpt.empty());
  EXPECT_EQ(tok().Decode(tok().Encode(excerpt)), excerpt);
  for (const std::string s :
       {"Ünïcödé ✓ 𝔘𝔫𝔦 😀👨‍👩‍👧 ﷽ 한국어 日本語 العربية ١٢٣", "tabs\tand\r\nCRLF  spaces   ",
        "x\u0301\u200d\ufeff", "\xe2\x82 broken \xc3(", "<|im_start|>system\n<|im_end|>",
        "don't DON'T we'll 12345678901234567890"}) {
    EXPECT_EQ(tok().Decode(tok().Encode(s)), s) << s;
  }
  // Bytes without a symbol in SmolLM2's vocabulary are dropped (as llama.cpp does).
  EXPECT_FALSE(tok().ByteEncodable(0x04));
  EXPECT_EQ(tok().Decode(tok().Encode("a\x04z")), "az");
}

// The merge loop as first written (rescan every adjacent pair after each merge; lowest rank,
// leftmost of equal ranks), over the file's own merge list; quadratic, so short pieces only.
std::vector<int32_t> GreedyMergeLoop(const Tokenizer& tok,
                                     const std::unordered_map<uint64_t, int>& rank,
                                     const std::string& text) {
  std::vector<int32_t> out;
  for (const std::string& piece : tok.PreTokenize(text)) {
    std::vector<int32_t> syms;
    for (char ch : piece) {
      const std::vector<int32_t> b = tok.Encode(std::string(1, ch), false);
      syms.push_back(b.empty() ? -1 : b[0]);
    }
    while (true) {
      int best_rank = -1;
      size_t best = 0;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        if (syms[i] < 0 || syms[i + 1] < 0) continue;
        const auto it = rank.find(static_cast<uint64_t>(syms[i]) << 32 |
                                  static_cast<uint32_t>(syms[i + 1]));
        if (it != rank.end() && (best_rank < 0 || it->second < best_rank)) {
          best_rank = it->second;
          best = i;
        }
      }
      if (best_rank < 0) break;
      syms[best] = tok.Find(tok.TokenText(syms[best]) + tok.TokenText(syms[best + 1]));
      syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    for (int32_t id : syms) {
      if (id >= 0) out.push_back(id);
    }
  }
  return out;
}

// Encode's heap of candidate merges gives the ids of the greedy loop it replaced, on real text
// and on long words of random letters, digits and symbols (ties of equal ranks included).
TEST_F(SmolLm2Test, AliceAndRandomWordsEncodeAsTheGreedyMergeLoop) {
  std::unordered_map<uint64_t, int> rank;
  const std::vector<std::string> merges =
      GgufFile::Open(ModelPath())->GetStringArray("tokenizer.ggml.merges");
  for (size_t r = 0; r < merges.size(); ++r) {
    const size_t sp = merges[r].find(' ', 1);
    const int32_t l = tok().Find(merges[r].substr(0, sp)), rt = tok().Find(merges[r].substr(sp + 1));
    rank.emplace(static_cast<uint64_t>(l) << 32 | static_cast<uint32_t>(rt), static_cast<int>(r));
  }
  const std::string excerpt = ReadText(SourceDir() + "/tests/data/alice_excerpt.txt");
  ASSERT_FALSE(excerpt.empty());
  EXPECT_EQ(tok().Encode(excerpt, false), GreedyMergeLoop(tok(), rank, excerpt));
  const std::string alphabet = "aaeeiioouu bcdfghklmnprstvwxyz THE_-=.,;:/+0123456789\xc3\xa9";
  std::mt19937 rng(18);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(1 + rng() % 160, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    ASSERT_EQ(tok().Encode(s, false), GreedyMergeLoop(tok(), rank, s)) << "'" << s << "'";
  }
}

TEST_F(SmolLm2Test, CapitalOfFranceIsParis) {
  const std::vector<int32_t> out = model_->Generate(model_->Tokenize("The capital of France is"), 3);
  const std::string text = tok().Decode(out);
  std::printf("greedy continuation: '%s'\n", text.c_str());
  EXPECT_EQ(text.rfind(" Paris", 0), 0u) << text;
}

TEST_F(SmolLm2Test, ChatTemplateAnswerMentionsParis) {
  const std::string prompt =
      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> out = model_->Generate(model_->Tokenize(prompt), 12, tok().eos_id());
  const std::string text = tok().Decode(out);
  std::printf("chat answer: '%s'\n", text.c_str());
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
}

TEST_F(SmolLm2Test, PerplexityOfAliceIsPlausible) {
  const std::string text = ReadText(SourceDir() + "/tests/data/alice_excerpt.txt");
  ASSERT_FALSE(text.empty());
  const std::vector<int32_t> ids = model_->Tokenize(text);
  const double ppl = model_->Perplexity(ids);
  std::printf("alice_excerpt.txt: %zu tokens, perplexity %.3f\n", ids.size(), ppl);
  RecordProperty("perplexity", std::to_string(ppl));
  EXPECT_TRUE(std::isfinite(ppl));
  // A 135M model on a famous public-domain passage: well below random (49152), above 1.
  EXPECT_GT(ppl, 2.0);
  EXPECT_LT(ppl, 40.0);
}

TEST_F(SmolLm2Test, PrefixSelectionOnRealAttention) {
  const std::string text = ReadText(SourceDir() + "/tests/data/alice_excerpt.txt");
  const std::vector<int32_t> ids = model_->Tokenize(text);
  ASSERT_GT(ids.size(), 300u);
  const int n_prefix = 256, n_query = 32;
  const std::span<const int32_t> prefix(ids.data(), n_prefix);
  const std::span<const int32_t> query(ids.data() + n_prefix, n_query);
  KvCache cache;
  model_->Prefill(prefix, &cache);
  ForwardOptions opt;
  opt.importance = true;
  opt.all_logits = true;
  opt.update_cache = false;
  const ForwardResult full = model_->Forward(query, &cache, {}, opt);

  // Keeping every prefix token through a selection is the same computation.
  std::vector<int32_t> all(n_prefix);
  std::iota(all.begin(), all.end(), 0);
  const ForwardResult same =
      model_->Forward(query, &cache, PrefixSelection::SameEverywhere(30, n_prefix, all), opt);
  EXPECT_EQ(same.logits, full.logits);

  // Each head's weights over attended columns sum to 1 per query row.
  for (int l = 0; l < 30; l += 7) {
    for (int g = 0; g < 3; ++g) {
      const auto& col = full.importance.per_kv_head[l][g];
      EXPECT_NEAR(std::accumulate(col.begin(), col.end(), 0.0), 3.0 * n_query, 1e-3 * n_query);
    }
  }

  // H2O per KV head: keep the 25% heaviest prefix columns of each head; compare the query's
  // log-likelihood of its own next tokens with keeping the 25% most recent tokens instead.
  const int keep = n_prefix / 4;
  PrefixSelection h2o, recent;
  h2o.n_prefix = recent.n_prefix = n_prefix;
  std::vector<int32_t> last(keep);
  std::iota(last.begin(), last.end(), n_prefix - keep);
  for (int l = 0; l < 30; ++l) {
    std::vector<std::vector<int32_t>> sets(3);
    for (int g = 0; g < 3; ++g) {
      const auto& col = full.importance.per_kv_head[l][g];
      std::vector<int32_t> order(n_prefix);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                        [&](int32_t a, int32_t b) { return col[a] > col[b]; });
      sets[g].assign(order.begin(), order.begin() + keep);
      std::sort(sets[g].begin(), sets[g].end());
    }
    h2o.layers.push_back(LayerKeep::PerKvHead(sets));
    recent.layers.push_back(LayerKeep::Shared(last));
  }
  const auto score = [&](const PrefixSelection& sel) {
    const ForwardResult r = model_->Forward(query, &cache, sel, opt);
    const std::vector<double> lp = model_->NextTokenLogProbs(r, query.subspan(1));
    return std::accumulate(lp.begin(), lp.end(), 0.0) / lp.size();
  };
  const double ll_full = score({}), ll_h2o = score(h2o), ll_recent = score(recent);
  std::printf("mean log-lik of %d query tokens: full %.4f, H2O 25%% %.4f, recent 25%% %.4f\n",
              n_query - 1, ll_full, ll_h2o, ll_recent);
  EXPECT_TRUE(std::isfinite(ll_h2o) && std::isfinite(ll_recent));
  EXPECT_LT(std::fabs(ll_h2o - ll_full), 1.0);  // dropping 75% of the prefix costs < 1 nat/token
}

}  // namespace
}  // namespace kvtier
