// The decode tasks and their scoring (models/decode_eval.h) on the tiny self-written GGUF: the
// samples are cut from the texts as documented (the needle after a sentence end, exact prompt
// lengths, deterministic digits), the 16-bit row's perplexity is the model's own next-token
// log-likelihood of the text, a SpeCache fetching every low-bit position scores like the 16-bit
// cache, and bad task options are input errors.

#include "models/decode_eval.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "tests/models/tiny_model.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

class DecodeEvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvtier_decode_eval_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "texts");
    testing::TinySpec spec;
    spec.context_length = 256;
    testing::WriteTinyLlama((dir_ / "tiny.gguf").string(), spec);
    model_ = LlamaModel::Load((dir_ / "tiny.gguf").string());
    for (const char* name : {"a.txt", "b.txt"}) {
      std::ofstream f(dir_ / "texts" / name);
      for (int i = 0; i < 40; ++i) {
        f << "Here the " << name[0] << " text says hello world number " << i << ".\n";
      }
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  DecodeTaskOptions SmallTasks() const {
    DecodeTaskOptions o;
    o.ppl_context = 40;
    o.ppl_tokens = 8;
    o.gen_prompt = 30;
    o.gen_tokens = 5;
    o.niah_lengths = {200};
    o.niah_depths = {0, 0.5, 1};
    o.niah_answer_tokens = 4;
    o.niah_text = "a.txt";
    return o;
  }

  fs::path dir_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(DecodeEvalTest, SamplesAreCutAsDocumented) {
  const DecodeTaskOptions o = SmallTasks();
  const std::vector<DecodeSample> s = BuildDecodeSamples(*model_, (dir_ / "texts").string(), o);
  ASSERT_EQ(s.size(), 2u + 2u + 3u);
  const std::vector<int32_t> a = model_->Tokenize("Here the a text says hello world number 0.\n");
  // texts: the first 40 tokens, then 8 + 1 teacher-forced.
  EXPECT_EQ(s[0].task, "texts");
  EXPECT_EQ(s[0].name, "a.txt");
  EXPECT_EQ(s[0].prompt.size(), 40u);
  EXPECT_EQ(s[0].forced.size(), 9u);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), s[0].prompt.begin()));
  EXPECT_EQ(s[2].task, "greedy");
  EXPECT_EQ(s[2].prompt.size(), 30u);
  EXPECT_EQ(s[2].generate, 5);
  const std::vector<int32_t> question = model_->Tokenize(
      "\n\nWhat is the secret number of the archive? The secret number of the archive is");
  for (int i = 0; i < 3; ++i) {
    const DecodeSample& n = s[4 + i];
    EXPECT_EQ(n.task, "niah");
    ASSERT_EQ(n.prompt.size(), 200u) << n.name;
    EXPECT_EQ(n.answer.size(), 7u);
    EXPECT_TRUE(std::equal(question.begin(), question.end(), n.prompt.end() - question.size()));
    const std::vector<int32_t> needle =
        model_->Tokenize(" The secret number of the archive is " + n.answer + ".");
    const auto at = std::search(n.prompt.begin(), n.prompt.end(), needle.begin(), needle.end());
    ASSERT_NE(at, n.prompt.end()) << n.name;
    const size_t pos = at - n.prompt.begin();
    if (i == 0) {
      EXPECT_EQ(pos, 0u);  // depth 0
    }
    if (i == 2) {
      EXPECT_EQ(pos + needle.size() + question.size(), 200u);  // depth 1
    }
    if (i == 1) {  // after a sentence end (the text's lines end ".\n", unwrapped to ". ")
      EXPECT_EQ(model_->tokenizer()->Decode(std::span(n.prompt).subspan(pos - 1, 1)), ".");
    }
  }
  EXPECT_NE(s[4].answer, s[5].answer);
  // Deterministic.
  const std::vector<DecodeSample> again = BuildDecodeSamples(*model_, (dir_ / "texts").string(), o);
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(again[i].prompt, s[i].prompt);
}

TEST_F(DecodeEvalTest, FullRowIsTheModelsOwnLikelihoodAndCompleteFetchMatchesIt) {
  DecodeTaskOptions t = SmallTasks();
  t.tasks = {"texts", "greedy"};
  const std::vector<DecodeSample> samples =
      BuildDecodeSamples(*model_, (dir_ / "texts").string(), t);
  DecodeEvalOptions o;
  o.bits = {2};
  o.ks = {1000};  // more than every low-bit position: SpeCache reads all KV in 16 bits
  o.group = 4;
  o.residual = 8;
  o.kivi_residual = 8;
  o.ablation_k = 0;
  o.threads = 2;
  int calls = 0;
  o.progress = [&](int done, int total) {
    ++calls;
    EXPECT_LE(done, total);
  };
  const DecodeEvalSummary r = EvaluateDecode(*model_, samples, o);
  // Grid: full, kivi, specache k=1000, specache_nospec k=1000; per task.
  ASSERT_EQ(r.rows.size(), 2u * 4u);
  EXPECT_EQ(calls, static_cast<int>(samples.size() * 4));

  // The 16-bit perplexity of the continuation, from one prefill of prompt + continuation.
  double nll = 0;
  int n = 0;
  for (const DecodeSample& s : samples) {
    if (s.task != "texts") continue;
    std::vector<int32_t> all = s.prompt;
    all.insert(all.end(), s.forced.begin(), s.forced.end());
    KvCache cache;
    const ForwardResult f = model_->Prefill(all, &cache);
    const std::vector<double> lp =
        model_->NextTokenLogProbs(f, std::span<const int32_t>(all).subspan(1));
    for (size_t i = s.prompt.size(); i + 1 < all.size(); ++i, ++n) nll -= lp[i];
  }
  const DecodeAccuracyRow& full = r.rows[0];
  EXPECT_EQ(full.task, "texts");
  EXPECT_EQ(full.items, n);
  EXPECT_NEAR(full.perplexity(), std::exp(nll / n), 1e-4 * std::exp(nll / n));
  EXPECT_EQ(full.token_agreement(), 1.0);
  EXPECT_EQ(full.kv_size_ratio(), 1.0);
  for (int c : {2, 3}) {  // specache, specache_nospec with a complete fetch
    const DecodeAccuracyRow& x = r.rows[c];
    EXPECT_NEAR(x.perplexity(), full.perplexity(), 1e-4 * full.perplexity());
    EXPECT_EQ(x.token_agreement(), 1.0);
    EXPECT_NEAR(x.hit_rate(), 1.0, 1e-6);
    EXPECT_NEAR(x.mean_kept_fraction(), 1.0, 1e-9);
  }
  const DecodeAccuracyRow& kivi = r.rows[1];
  EXPECT_LT(kivi.mean_kept_fraction(), 1.0);
  EXPECT_LT(kivi.kv_size_ratio(), 1.0);
  // greedy: the 16-bit row agrees with itself everywhere.
  const DecodeAccuracyRow& g = r.rows[4];
  EXPECT_EQ(g.task, "greedy");
  EXPECT_EQ(g.items, 2);
  EXPECT_EQ(g.correct, 2);
  EXPECT_EQ(g.compared, 10);
  EXPECT_EQ(r.rows[6].correct, 2);  // complete-fetch SpeCache generates the same tokens
}

TEST_F(DecodeEvalTest, BadTaskOptionsAreInputErrors) {
  const std::string texts = (dir_ / "texts").string();
  DecodeTaskOptions o = SmallTasks();
  o.tasks = {"texts", "summaries"};
  EXPECT_THROW(BuildDecodeSamples(*model_, texts, o), InputError);
  o = SmallTasks();
  o.ppl_context = 100000;  // longer than the texts
  EXPECT_THROW(BuildDecodeSamples(*model_, texts, o), InputError);
  o = SmallTasks();
  o.niah_lengths = {252};  // 252 + 4 steps + the speculative token's position > 256
  EXPECT_THROW(BuildDecodeSamples(*model_, texts, o), InputError);
  o = SmallTasks();
  o.niah_depths = {1.5};
  EXPECT_THROW(BuildDecodeSamples(*model_, texts, o), InputError);
  EXPECT_THROW(BuildDecodeSamples(*model_, (dir_ / "none").string(), SmallTasks()), InputError);
}

}  // namespace
}  // namespace kvtier
