// Recorder and accuracy evaluation on the tiny self-written GGUF (tests/models/tiny_model.h):
// the recorded trace reads back and its scores are the forward pass's H2O column sums (within
// 16-bit log quantization); every selector keeps exactly RetainedTokens tokens per layer (and KV
// head); full-KV scoring equals the model's own log-likelihoods; task data loading and its
// errors.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "core/errors.h"
#include "core/itf.h"
#include "models/decode.h"
#include "models/eval.h"
#include "models/llama.h"
#include "models/recorder.h"
#include "tests/models/tiny_model.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

fs::path TempPath(const std::string& name) {
  return fs::temp_directory_path() / ("kvtier_receval_" + std::to_string(::getpid()) + "_" + name);
}

class TinyModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf_ = TempPath("tiny.gguf").string();
    testing::TinySpec spec;
    spec.n_layers = 2;
    spec.n_heads = 4;
    spec.n_kv_heads = 2;
    spec.context_length = 64;
    vocab_ = testing::WriteTinyLlama(gguf_, spec);
    model_ = LlamaModel::Load(gguf_);
  }
  void TearDown() override {
    fs::remove(gguf_);
    fs::remove(TempPath("t.kvt"));
  }
  std::vector<int32_t> Tokens(int n, int salt) const {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 11 + 5) % vocab_;
    return t;
  }

  std::string gguf_;
  int vocab_ = 0;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(TinyModelTest, RecordedScoresAreTheForwardColumnSumsAndReadBack) {
  std::vector<PromptGroup> groups(2);
  groups[0].prefix = Tokens(20, 1);
  groups[0].queries = {Tokens(5, 2), Tokens(7, 3)};
  groups[1].prefix = Tokens(13, 4);
  groups[1].queries = {Tokens(4, 5), Tokens(6, 6)};
  RecordOptions o;
  o.model_name = "tiny";
  o.rate = 5;
  o.decode_steps = 3;
  o.decode_k = 4;
  const std::string path = TempPath("t.kvt").string();
  const RecordSummary s = RecordTrace(*model_, groups, o, path);
  EXPECT_EQ(s.records, 4);
  EXPECT_EQ(s.prefix_tokens, 33);
  EXPECT_EQ(s.query_tokens, 22);
  EXPECT_EQ(s.decode_tokens, 12);
  EXPECT_GT(s.tokens_per_s(), 0);

  TraceReader reader(path);
  EXPECT_EQ(reader.header().model.name, "tiny");
  EXPECT_EQ(reader.header().model.layers, 2);
  EXPECT_EQ(reader.header().model.heads, 4);
  EXPECT_EQ(reader.header().model.kv_heads, 2);
  EXPECT_EQ(reader.header().Meta("arrival"), "poisson");
  TraceRecord rec;
  double last_arrival = 0;
  int n = 0;
  std::set<std::pair<int, int>> seen;
  while (reader.Next(&rec)) {
    ++n;
    EXPECT_GT(rec.request.arrival_s, last_arrival);
    last_arrival = rec.request.arrival_s;
    // Which (group, query) is this? Match prefix and query ids.
    int g = -1, q = -1;
    for (int gi = 0; gi < 2; ++gi) {
      if (rec.request.prefix.size() != groups[gi].prefix.size() ||
          !std::equal(rec.request.prefix.begin(), rec.request.prefix.end(), groups[gi].prefix.begin())) {
        continue;
      }
      for (int qi = 0; qi < 2; ++qi) {
        const auto& want = groups[gi].queries[qi];
        if (rec.query_ids.size() == want.size() &&
            std::equal(rec.query_ids.begin(), rec.query_ids.end(), want.begin())) {
          g = gi;
          q = qi;
        }
      }
    }
    ASSERT_GE(g, 0) << "record " << n << " matches no prompt";
    seen.insert({g, q});
    EXPECT_EQ(rec.request.query_tokens, static_cast<int64_t>(groups[g].queries[q].size()));
    ASSERT_EQ(rec.importance, ImportanceKind::kExplicit);
    ASSERT_EQ(rec.explicit_scores.bits, 16);
    const int n_prefix = static_cast<int>(groups[g].prefix.size());
    ASSERT_EQ(rec.explicit_scores.tokens, n_prefix);

    // The reference: the same query against the full prefix KV.
    KvCache cache = model_->NewCache();
    model_->Prefill(groups[g].prefix, &cache);
    ForwardOptions fo;
    fo.importance = true;
    fo.update_cache = false;
    const ForwardResult r = model_->Forward(groups[g].queries[q], &cache, {}, fo);
    std::vector<float> row(n_prefix);
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        rec.explicit_scores.Row(l, h, n_prefix, row.data());
        const size_t ri = static_cast<size_t>(l) * 2 + h;
        const double half_step = (rec.explicit_scores.hi[ri] - rec.explicit_scores.lo[ri]) / 65534 / 2;
        const double rel = std::exp2(half_step) - 1;
        double total = 0;
        for (int t = 0; t < n_prefix; ++t) {
          const float want = r.importance.per_kv_head[l][h][t];
          total += want;
          // 16-bit log2 codes: at most half a step (range/65534 in log2) of relative error.
          EXPECT_NEAR(row[t], want, 1.01 * rel * want + 1e-6 * want) << "layer " << l << " head " << h << " t " << t;
        }
        EXPECT_GT(total, 0);
      }
    }
    ASSERT_TRUE(rec.decode_topk.has_value());
    EXPECT_EQ(rec.decode_topk->steps, 3);
    EXPECT_EQ(rec.decode_topk->k, 4);
    EXPECT_EQ(rec.request.output_tokens, 3);
  }
  EXPECT_EQ(n, 4);
  EXPECT_EQ(seen.size(), 4u);
}

// The decode extensions hold what an independent Decoder (SpeCache, 2-bit) does on the same
// prompt: per step and (layer, KV head) the output token's exact top-k and the fetched set, in
// rank order, the step's context and candidates, and extension 1's summed top-k.
TEST_F(TinyModelTest, RecordedDecodeSetsAreTheDecodersSets) {
  std::vector<PromptGroup> groups(1);
  groups[0].prefix = Tokens(40, 1);
  groups[0].queries = {Tokens(8, 2)};
  RecordOptions o;
  o.model_name = "tiny";
  o.decode_steps = 4;
  o.decode_k = 3;
  o.decode_bits = 2;
  o.decode_quant.group = 4;
  o.decode_quant.residual = 8;
  const std::string path = TempPath("t.kvt").string();
  RecordTrace(*model_, groups, o, path);
  TraceReader reader(path);
  EXPECT_EQ(reader.header().Meta("decode_method"), "specache");
  EXPECT_EQ(reader.header().Meta("decode_bits"), "2");
  EXPECT_EQ(reader.header().Meta("decode_residual"), "8");
  TraceRecord rec;
  ASSERT_TRUE(reader.Next(&rec));
  ASSERT_TRUE(rec.decode_sets.has_value());
  const DecodeTopKSets& sets = *rec.decode_sets;
  EXPECT_EQ(sets.steps, 4);
  EXPECT_EQ(sets.k, 3);

  KvCache cache;
  model_->Prefill(groups[0].prefix, &cache);
  const ForwardResult q = model_->Forward(groups[0].queries[0], &cache);
  DecodeOptions d;
  d.method = DecodeMethod::kSpeCache;
  d.quant = o.decode_quant;
  d.k = 3;
  d.measure = true;
  d.keep_exact_scores = true;
  Decoder dec(*model_, cache, d);
  int32_t next = ArgMax(q.LastLogits(model_->config().vocab_size));
  for (int s = 0; s < 4; ++s) {
    next = ArgMax(dec.Step(next));
    const DecodeStepInfo& info = dec.last();
    EXPECT_EQ(sets.context[s], 48 + s);
    EXPECT_EQ(sets.candidates[s], info.low_bit);
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        const auto& out = sets.output[sets.Index(s, l, h)];
        const auto& pre = sets.prefetched[sets.Index(s, l, h)];
        EXPECT_EQ(std::vector<int32_t>(out.begin(), out.end()), info.exact[l][h]);
        EXPECT_EQ(std::vector<int32_t>(pre.begin(), pre.end()), info.fetched[l][h]);
        EXPECT_EQ(out.size(), 3u);
      }
    }
    // Extension 1: top-3 of the exact attention summed over layers and heads, sorted.
    std::vector<float> agg(info.context + 1, 0.f);
    for (const auto& layer : info.exact_scores) {
      for (const auto& head : layer) {
        for (int j = 0; j <= info.context; ++j) agg[j] += head[j];
      }
    }
    const TokenSet top = TopK(agg, 3);
    ASSERT_TRUE(rec.decode_topk.has_value());
    EXPECT_EQ(std::vector<std::int64_t>(rec.decode_topk->positions.begin() + 3 * s,
                                        rec.decode_topk->positions.begin() + 3 * s + 3),
              std::vector<std::int64_t>(top.begin(), top.end()));
  }
}

TEST_F(TinyModelTest, RecordRejectsPromptsLongerThanTheContext) {
  std::vector<PromptGroup> groups(1);
  groups[0].prefix = Tokens(60, 1);
  groups[0].queries = {Tokens(8, 2)};
  try {
    RecordTrace(*model_, groups, {}, TempPath("t.kvt").string());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the context"), std::string::npos) << e.what();
  }
}

// Importance with structure: per (layer, head) random scores, heads of a layer correlated.
AttentionImportance RandomImportance(int layers, int kv_heads, int n, double head_noise,
                                     uint32_t seed) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<float> base(0, 1.5);
  std::normal_distribution<float> noise(0, head_noise);
  AttentionImportance imp;
  imp.n_columns = n + 4;
  imp.per_kv_head.assign(layers, std::vector<std::vector<float>>(kv_heads, std::vector<float>(n + 4)));
  for (int l = 0; l < layers; ++l) {
    std::vector<float> b(n);
    for (auto& x : b) x = base(rng);
    for (int h = 0; h < kv_heads; ++h) {
      for (int t = 0; t < n; ++t) imp.per_kv_head[l][h][t] = b[t] * std::exp(noise(rng));
    }
  }
  return imp;
}

TEST(EvalSelectionTest, EverySelectorKeepsExactlyRetainedTokens) {
  const int layers = 6, kv = 3, n = 97;
  // Low noise: ITF passes; high noise: it falls back (both branches are checked).
  for (double noise : {0.05, 3.0}) {
    const AttentionImportance imp = RandomImportance(layers, kv, n, noise, 7);
    const AttentionImportance other = RandomImportance(layers, kv, n, noise, 8);
    for (double r : {0.5, 0.25, 0.1, 0.05}) {
      const int64_t k = RetainedTokens(r, n);
      for (Selector s : {Selector::kItf, Selector::kH2o, Selector::kStatic, Selector::kRandom}) {
        for (double alpha : {0.0, 0.6, 2.0}) {
          SelectionStats st;
          const PrefixSelection sel =
              BuildSelection({s, r, alpha}, imp, &other, n, /*probe_heads=*/2, 11, &st);
          ASSERT_EQ(sel.layers.size(), static_cast<size_t>(layers));
          EXPECT_EQ(sel.n_prefix, n);
          EXPECT_NEAR(st.kept_fraction, double(k) / n, 1e-12);
          int fallbacks = 0;
          for (const LayerKeep& lk : sel.layers) {
            if (lk.mode == LayerKeep::Mode::kShared) {
              EXPECT_EQ(static_cast<int64_t>(lk.shared.size()), k);
              EXPECT_TRUE(std::is_sorted(lk.shared.begin(), lk.shared.end()));
            } else {
              ASSERT_EQ(lk.mode, LayerKeep::Mode::kPerKvHead);
              ASSERT_EQ(lk.per_kv_head.size(), static_cast<size_t>(kv));
              for (const auto& h : lk.per_kv_head) EXPECT_EQ(static_cast<int64_t>(h.size()), k);
              fallbacks += s == Selector::kItf;
            }
          }
          EXPECT_EQ(st.fallback_layers, fallbacks);
          if (s == Selector::kH2o) {  // H2O = each head's own top-k
            for (int l = 0; l < layers; ++l) {
              for (int h = 0; h < kv; ++h) {
                EXPECT_EQ(sel.layers[l].per_kv_head[h],
                          TopK(std::span<const float>(imp.per_kv_head[l][h]).first(n), k));
              }
            }
          }
          if (s == Selector::kStatic) {  // SPI = the other query's top-k
            EXPECT_EQ(sel.layers[0].per_kv_head[1],
                      TopK(std::span<const float>(other.per_kv_head[0][1]).first(n), k));
          }
          if (s == Selector::kItf && alpha == 0.0 && noise > 1) {
            EXPECT_EQ(st.fallback_layers, layers) << "alpha 0: threshold 1, distinct sets fall back";
          }
        }
      }
    }
  }
  // ITF passes on nearly identical heads at alpha 0.6 (threshold j^0.6 is low).
  SelectionStats st;
  BuildSelection({Selector::kItf, 0.25, 0.6}, RandomImportance(layers, kv, n, 0.01, 3), nullptr, n,
                 2, 1, &st);
  EXPECT_EQ(st.fallback_layers, 0);
  // Full keeps everything.
  const PrefixSelection full =
      BuildSelection({Selector::kFull, 1, 0}, RandomImportance(layers, kv, n, 1, 3), nullptr, n, 2, 1, &st);
  EXPECT_TRUE(full.empty());
  EXPECT_EQ(st.kept_fraction, 1);
}

TEST_F(TinyModelTest, FullKvScoresEqualTheModelsOwnLogLikelihoods) {
  const std::vector<int32_t> prefix = Tokens(18, 1);
  EvalItem item;
  item.context = Tokens(5, 2);
  item.choices = {Tokens(4, 3), Tokens(1, 4), Tokens(6, 5)};
  KvCache cache = model_->NewCache();
  model_->Prefill(prefix, &cache);
  const QueryScore q = ScoreQuery(*model_, &cache, {}, item);
  EXPECT_EQ(cache.n_tokens, 18) << "cache restored to the prefix";
  ASSERT_EQ(q.loglik.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    // One forward over prefix + context + choice, log-softmax by hand.
    std::vector<int32_t> all = prefix;
    all.insert(all.end(), item.context.begin(), item.context.end());
    const size_t start = all.size();
    all.insert(all.end(), item.choices[c].begin(), item.choices[c].end());
    KvCache fresh = model_->NewCache();
    ForwardOptions fo;
    fo.all_logits = true;
    const ForwardResult r = model_->Prefill(all, &fresh, fo);
    double want = 0;
    for (size_t i = start; i < all.size(); ++i) {
      const float* row = r.logits.data() + (i - 1) * vocab_;
      double mx = row[0], z = 0;
      for (int v = 0; v < vocab_; ++v) mx = std::max<double>(mx, row[v]);
      for (int v = 0; v < vocab_; ++v) z += std::exp(row[v] - mx);
      want += row[all[i]] - mx - std::log(z);
    }
    EXPECT_NEAR(q.loglik[c], want, 1e-3 * std::max(1.0, std::abs(want))) << "choice " << c;
    if (c == 0) {
      const float* row = r.logits.data() + (start - 1) * vocab_;
      EXPECT_EQ(q.first_token, ArgMax(std::span<const float>(row, vocab_)));
    }
  }
  // A selection changes the answer's log-likelihoods, and the cache is still restored.
  SelectionStats st;
  AttentionImportance imp;
  imp.per_kv_head.assign(2, std::vector<std::vector<float>>(2, std::vector<float>(18, 1.f)));
  const QueryScore sel = ScoreQuery(
      *model_, &cache, BuildSelection({Selector::kH2o, 0.25, 0}, imp, nullptr, 18, 2, 1, &st), item);
  EXPECT_EQ(cache.n_tokens, 18);
  EXPECT_NE(sel.loglik[0], q.loglik[0]);
}

TEST_F(TinyModelTest, EvaluateGroupsFullRowMatchesScoreQueryAndCountsItems) {
  std::vector<EvalGroup> groups(2);
  for (int g = 0; g < 2; ++g) {
    groups[g].prefix = Tokens(16 + g, g);
    for (int i = 0; i < 3; ++i) {
      EvalItem it;
      it.index = g * 3 + i;
      it.context = Tokens(3 + i, 10 * g + i);
      it.choices = {Tokens(2, 40 + i), Tokens(3, 50 + i)};
      it.label = i % 2;
      groups[g].items.push_back(it);
    }
  }
  EvalOptions o;
  o.retentions = {0.5, 0.25};
  o.alphas = {0, 0.6};
  o.threads = 2;
  const EvalSummary s = EvaluateGroups(*model_, "tiny", groups, o);
  ASSERT_EQ(s.rows.size(), EvalGrid(o).size());
  ASSERT_EQ(s.rows.size(), 1u + 2 * 2 + 3 * 2);
  int correct = 0;
  for (const EvalGroup& g : groups) {
    KvCache c = model_->NewCache();
    model_->Prefill(g.prefix, &c);
    for (const EvalItem& it : g.items) correct += ScoreQuery(*model_, &c, {}, it).predicted == it.label;
  }
  EXPECT_EQ(s.rows[0].config.selector, Selector::kFull);
  EXPECT_EQ(s.rows[0].correct, correct);
  EXPECT_EQ(s.rows[0].first_token_agree, 6);
  for (const AccuracyRow& r : s.rows) {
    EXPECT_EQ(r.items, 6);
    EXPECT_LE(r.mean_kept_fraction(), 1.0);
    if (r.config.selector != Selector::kFull) {
      EXPECT_GE(r.mean_kept_fraction(), r.config.retention - 1e-9);
      EXPECT_LE(r.mean_kept_fraction(), r.config.retention + 1.0 / 16);
    }
  }
}

std::string SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");
  return s ? s : KVTIER_TEST_SOURCE_DIR;
}

TEST(EvalDataTest, RepositorySamplesLoadWithTheirSplits) {
  const McTask piqa = LoadMcTask("piqa", SourceDir() + "/data", "/nonexistent");
  EXPECT_EQ(piqa.items.size(), 200u);
  EXPECT_EQ(piqa.shot_pool.size(), 100u);
  EXPECT_EQ(piqa.items[0].context,
            "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:");
  EXPECT_EQ(piqa.items[0].choices.size(), 2u);
  EXPECT_EQ(piqa.items[0].choices[0].substr(0, 9), " Provide ");
  const McTask copa = LoadMcTask("copa", SourceDir() + "/data", "/nonexistent");
  EXPECT_EQ(copa.items.size(), 100u);
  EXPECT_EQ(copa.shot_pool.size(), 400u);
  EXPECT_EQ(copa.shot_pool[0].context, "My body cast a shadow over the grass because");
  EXPECT_EQ(copa.shot_pool[0].choices[0], " the sun was rising.");
  EXPECT_EQ(copa.shot_pool[0].label, 0);
}

// Regression (issue 18's class, in the task data reader): a line of 10^5 nested arrays overflowed
// the recursive JSON reader's stack (`kvtier eval`: SIGSEGV), and a bare "-" or a number out of
// double's range escaped std::stod as an "internal error" (exit 1). Each is an InputError
// naming the file and line.
TEST(EvalDataTest, ATaskLineOfTenToTheFiveNestedArraysOrABadNumberIsAnInputErrorNamingTheLine) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kvtier_eval_bad_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "piqa");
  const std::string good = R"({"goal": "g", "sol1": "a", "sol2": "b"})";
  const std::pair<std::string, std::string> cases[] = {
      {std::string(100000, '[') + std::string(100000, ']'), "nested deeper than 64 levels"},
      {R"({"goal": "g", "sol1": "a", "sol2": "b", "x": -})", "bad number '-'"},
      {R"({"goal": "g", "sol1": "a", "sol2": "b", "x": 1e99999})", "number '1e99999' out of range"},
      {R"({"goal": "g", "sol1": "a", "sol2": "b", "x": 1.2.3})", "bad number '1.2.3'"}};
  for (const auto& [line, what] : cases) {
    std::ofstream(dir / "piqa" / "valid.jsonl") << good << "\n" << line << "\n";
    std::ofstream(dir / "piqa" / "valid-labels.lst") << "0\n1\n";
    try {
      LoadMcTask("piqa", dir.string(), "/nonexistent");
      ADD_FAILURE() << "no InputError for " << line.substr(0, 60);
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("piqa/valid.jsonl:2: " + what), std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(EvalDataTest, UnknownTaskAndMissingExternalDataAreClearErrors) {
  try {
    LoadMcTask("hellaswag", SourceDir() + "/data", "/nonexistent");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown task 'hellaswag'"), std::string::npos);
  }
  try {
    LoadMcTask("rte", SourceDir() + "/data", "/nonexistent");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/rte/val.jsonl"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(McTaskIsExternal("rte"));
  EXPECT_TRUE(McTaskIsExternal("openbookqa"));
  EXPECT_FALSE(McTaskIsExternal("piqa"));
}

TEST(EvalDataTest, ExternalTasksLoadWhenTheSharedDataIsPresent) {
  const std::string shared = SourceDir() + "/../shared/data";
  if (!fs::is_directory(shared + "/rte") || !fs::is_directory(shared + "/openbookqa")) {
    GTEST_SKIP() << "no " << shared << " (RTE and OpenBookQA are never committed)";
  }
  const McTask rte = LoadMcTask("rte", SourceDir() + "/data", shared);
  EXPECT_EQ(rte.items.size(), 277u);
  EXPECT_EQ(rte.items[0].label, 1);  // not_entailment -> " False"
  EXPECT_EQ(rte.items[0].choices[1], " False");
  const McTask obqa = LoadMcTask("openbookqa", SourceDir() + "/data", shared);
  EXPECT_EQ(obqa.items.size(), 500u);
  EXPECT_EQ(obqa.items[0].choices.size(), 4u);
  EXPECT_EQ(obqa.items[0].label, 1);  // answerKey B
}

}  // namespace
}  // namespace kvtier
