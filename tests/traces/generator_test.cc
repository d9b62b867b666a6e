// `trace gen` with target similarities reproduces them, as measured by `trace stats`, within
// the stated tolerance (traces/FORMAT.md §Generator): mean head Jaccard ±0.03, each layer's
// head Jaccard ±0.08, adjacent-layer Jaccard ±0.03, SPI recall ±0.03, all at the target
// retention. Also: generation is deterministic, and the workload shapes are as asked.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "core/errors.h"
#include "tests/traces/test_paths.h"
#include "traces/generator.h"
#include "traces/trace_io.h"
#include "traces/trace_stats.h"

namespace kvtier {
namespace {

using testing_traces::TempPath;

struct Case {
  std::vector<double> head_jaccard;
  double layer_jaccard, spi_recall, retention;
};

class GeneratorTargets : public ::testing::TestWithParam<Case> {};

TEST_P(GeneratorTargets, StatsReproduceTargets) {
  const Case c = GetParam();
  WorkloadParams w;
  w.requests = 120;
  w.prompts = 12;
  w.max_prefix_tokens = 3072;
  ImportanceTargets t;
  t.head_jaccard = c.head_jaccard;
  t.layer_jaccard = c.layer_jaccard;
  t.spi_recall = c.spi_recall;
  t.retention = c.retention;
  const ModelDescriptor m{"test-16x16", 16, 16, 16};
  const ProceduralParams p = Calibrate(t, m.layers, m.kv_heads, 3072, 5);
  const std::string path = TempPath("gen.kvt");
  GenerateTrace(path, w, m, t, p);
  TraceStatsOptions opt;
  opt.importance_requests = 48;
  opt.importance.retentions = {c.retention};
  const TraceStats st = ComputeTraceStats(path, opt);
  ASSERT_TRUE(st.importance);
  const ImportanceStats& im = *st.importance;
  ASSERT_GT(im.recall_samples, 10);
  double target_mean = 0;
  for (int l = 0; l < m.layers; ++l) {
    const double x = double(l) / (m.layers - 1) * double(c.head_jaccard.size() - 1);
    const std::size_t i = std::min<std::size_t>(std::size_t(x), c.head_jaccard.size() - 2);
    const double target = c.head_jaccard.size() == 1
                              ? c.head_jaccard[0]
                              : c.head_jaccard[i] + (x - double(i)) * (c.head_jaccard[i + 1] - c.head_jaccard[i]);
    target_mean += target / m.layers;
    EXPECT_NEAR(im.head_jaccard[0][l], target, 0.08) << "layer " << l;
  }
  EXPECT_NEAR(im.MeanHeadJaccard(0), target_mean, 0.03);
  EXPECT_NEAR(im.MeanLayerJaccard(0), c.layer_jaccard, 0.03);
  EXPECT_NEAR(im.MeanRecall(0), c.spi_recall, 0.03);
  EXPECT_GT(im.MeanHeadJaccard(0), im.MeanRandomJaccard(0));
  std::remove(path.c_str());
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  static const char* kNames[] = {"PaperDefaults", "HighSimilarity", "LowSimilarityAt25"};
  return kNames[info.index];
}

INSTANTIATE_TEST_SUITE_P(
    Targets, GeneratorTargets,
    ::testing::Values(Case{{0.78, 0.58}, 0.6, 0.8, 0.4},   // paper defaults (OPT-30B, §IV-B)
                      Case{{0.95}, 0.8, 0.9, 0.4},        // OPT-6.7B middle layer (Fig. 7b)
                      Case{{0.5, 0.3}, 0.4, 0.7, 0.25}),
    CaseName);

std::vector<char> Bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

TEST(Generator, DeterministicAcrossRuns) {
  WorkloadParams w;
  w.requests = 50;
  ImportanceTargets t;
  const ModelDescriptor m{"m", 8, 8, 8};
  const ProceduralParams p1 = Calibrate(t, 8, 8, 1024, 3);
  const ProceduralParams p2 = Calibrate(t, 8, 8, 1024, 3);
  EXPECT_EQ(p1.ToString(), p2.ToString());
  const std::string a = TempPath("det_a.kvt"), b = TempPath("det_b.kvt");
  GenerateTrace(a, w, m, t, p1);
  GenerateTrace(b, w, m, t, p2);
  EXPECT_EQ(Bytes(a), Bytes(b));
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(Generator, FewShotDefaultsMatchThePaperSetup) {
  WorkloadParams w;  // 2-10 examples, ~830 tokens each
  w.requests = 400;
  ImportanceTargets t;
  t.importance = "none";
  const std::string path = TempPath("fs.kvt");
  GenerateTrace(path, w, ModelDescriptor{"opt-13b", 40, 40, 40}, t, ProceduralParams{});
  const TraceStats st = ComputeTraceStats(path);
  EXPECT_EQ(st.requests, 400);
  EXPECT_EQ(st.by_kind[0], 400);
  EXPECT_NEAR(st.prefix_tokens.Mean(), 5000, 1200);  // SPEC §VI-A: 4.8K-5.7K average
  EXPECT_LE(st.prefix_tokens.Max(), 10240);
  EXPECT_GT(st.IdealReuseRatio(), 0.8);  // 32 shared prompts, 400 requests
  std::remove(path.c_str());
}

TEST(Generator, RagClosedLoop) {
  WorkloadParams w;
  w.kind = "rag";
  w.arrival = "closed";
  w.clients = 4;
  w.requests = 300;
  ImportanceTargets t;
  t.importance = "none";
  const std::string path = TempPath("rag.kvt");
  GenerateTrace(path, w, ModelDescriptor{"m", 4, 4, 4}, t, ProceduralParams{});
  TraceReader r(path);
  EXPECT_EQ(r.header().Meta("arrival"), "closed:4");
  const TraceStats st = ComputeTraceStats(path);
  EXPECT_NEAR(st.prefix_tokens.Mean(), 4500, 600);
  EXPECT_GT(st.IdealReuseRatio(), 0.02);  // Zipf: the popular documents lead the prefix
  EXPECT_LT(st.IdealReuseRatio(), 0.9);
  std::remove(path.c_str());
}

// Regression (issue 18's class, found probing trace gen with extreme values): a typo ran for
// ever or was silently wrong. Each is now an InputError naming the parameter; nothing is
// allocated for it.
TEST(Generator, ExampleTokensOfTenToTheFifteenAndOtherHugeWorkloadsAreInputErrors) {
  const auto message = [](const WorkloadParams& w) {
    try {
      ValidateWorkload(w);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  WorkloadParams w;
  w.example_tokens = 1e15;  // allocated 8.7 GB of example tokens before the prefix cap
  EXPECT_NE(message(w).find("example_tokens: at most 1e9 tokens, got 1e+15"), std::string::npos)
      << message(w);
  w = WorkloadParams{};
  w.example_tokens = 1e300;  // rounded to 16-token examples, exit 0
  EXPECT_NE(message(w).find("example_tokens: at most 1e9"), std::string::npos) << message(w);
  w = WorkloadParams{};
  w.max_prefix_tokens = 2'000'000'000;
  EXPECT_NE(message(w).find("max_prefix_tokens: at most 2^24"), std::string::npos) << message(w);
  w = WorkloadParams{};
  w.prompts = 1'000'000;  // every prompt's prefix is kept: 80 GB
  EXPECT_NE(message(w).find("more than 2^28 tokens to keep in memory"), std::string::npos)
      << message(w);
  w = WorkloadParams{};
  w.kind = "rag";
  w.docs = 2'000'000'000;  // 16 GB of weights and lengths
  EXPECT_NE(message(w).find("docs: at most 10,000,000"), std::string::npos) << message(w);
  w = WorkloadParams{};
  w.kind = "rag";
  w.zipf = 1e300;  // only document 1 had a weight: the draw of 3 distinct documents never ended
  EXPECT_NE(message(w).find("zipf: 1e+300 is too steep for docs_per_request = 3"),
            std::string::npos)
      << message(w);
  w.zipf = 3;  // steep but drawable
  EXPECT_EQ(message(w), "no error");
  w = WorkloadParams{};
  EXPECT_EQ(message(w), "no error");
}

TEST(Generator, BadWorkloadIsInputError) {
  WorkloadParams w;
  w.kind = "chat";
  EXPECT_THROW(ValidateWorkload(w), InputError);
  w = WorkloadParams{};
  w.examples_min = 5;
  w.examples_max = 2;
  EXPECT_THROW(ValidateWorkload(w), InputError);
}

}  // namespace
}  // namespace kvtier
