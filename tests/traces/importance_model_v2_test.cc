// Importance model version 2 (traces/importance_model.h): the text and header forms are
// versioned so version-1 strings and traces read (and score) as before, and each v2 component
// produces the structure it is there for.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/errors.h"
#include "tests/traces/test_paths.h"
#include "traces/hash.h"
#include "traces/importance_model.h"
#include "traces/importance_stats.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

using testing_traces::TempPath;

ProceduralParams V2() {
  ProceduralParams p = ProceduralParams::Parse(
      "model=v2 seed=3 head_corr=0.7,0.5 layer_corr=0.6 query_dependence=0.1 sink_tokens=1 "
      "sink_boost=8 tail=2 persistent=0.4 persistent_corr=0.999 persistent_query=0.05 slow=0.7 "
      "slow_corr=0.98 smooth=0.5 smooth_tokens=4 head_spread=0.3 recency=2,1,0.5,0",
      "test");
  return p;
}

TEST(ImportanceModelV2, TextFormRoundTripsAndVersionOneStaysAsItWas) {
  const ProceduralParams p = V2();
  EXPECT_EQ(p.model, 2);
  const ProceduralParams q = ProceduralParams::Parse(p.ToString(), "round trip");
  EXPECT_EQ(q.ToString(), p.ToString());
  EXPECT_EQ(q.recency, (std::vector<double>{2, 1, 0.5, 0}));
  EXPECT_DOUBLE_EQ(q.persistent_corr, 0.999);
  // A version-1 string (every workload.importance written before versions) parses to version 1
  // and prints exactly the keys it always printed.
  const ProceduralParams v1 = ProceduralParams::Parse("seed=2 head_corr=0.8 layer_corr=0.9", "v1");
  EXPECT_EQ(v1.model, 1);
  EXPECT_EQ(v1.ToString(), "seed=2 head_corr=0.8 layer_corr=0.9 query_dependence=0.2 "
                           "sink_tokens=4 sink_boost=6 tail=1.5");
}

TEST(ImportanceModelV2, VersionTwoKeysNeedModelV2) {
  try {
    ProceduralParams::Parse("seed=1 persistent=0.3", "e.ini:3: workload.importance");
    FAIL() << "accepted a v2 key without model=v2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("e.ini:3: workload.importance: persistent"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ProceduralParams::Parse("model=v5", "x"), ConfigError);  // no such version
}

TEST(ImportanceModelV2, TraceHeaderRoundTripsBothVersions) {
  for (const ProceduralParams& p : {ProceduralParams{}, V2()}) {
    const std::string path = TempPath("v2header.kvt");
    TraceHeader h;
    h.producer = "test";
    h.model = {"m", 4, 2, 2};
    h.procedural = p;
    {
      TraceWriter w(path, h);
      w.Close();
    }
    TraceReader r(path);
    ASSERT_TRUE(r.header().procedural);
    EXPECT_EQ(r.header().procedural->model, p.model);
    EXPECT_EQ(r.header().procedural->ToString(), p.ToString());
    std::remove(path.c_str());
  }
}

std::vector<std::uint32_t> Keys(std::int64_t n) {
  std::vector<std::uint32_t> k(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) k[t] = hash::Hash32(std::uint32_t(t) * 2654435761u + 7);
  return k;
}

TEST(ImportanceModelV2, ScoresOfTheFirstTokensDoNotDependOnHowManyAreAsked) {
  // A cache that reuses fewer tokens must see the same scores for them (smoothing reads the
  // knot after the last token, recency the prefix end, not n).
  const ImportanceModel m(V2(), 6, 2);
  const auto keys = Keys(301);
  const int heads[] = {0, 1};
  std::vector<float> a(2 * 100), b(2 * 301);
  for (int l : {0, 3, 5}) {
    m.Scores(keys, 42, l, heads, 100, a.data(), 301);
    m.Scores(keys, 42, l, heads, 301, b.data(), 301);
    for (int j = 0; j < 2; ++j) {
      for (int t = 0; t < 100; ++t) ASSERT_EQ(a[j * 100 + t], b[j * 301 + t]) << l << " " << t;
    }
  }
}

ImportanceStats Measure(const ProceduralParams& p, int layers, int heads, std::int64_t n,
                        int requests) {
  const ImportanceModel m(p, layers, heads);
  ImportanceStatsOptions o;
  o.retentions = {0.25};
  o.structure.itf_probe_heads = heads;
  ImportanceAccumulator acc(layers, heads, o);
  const auto keys = Keys(n);
  for (int q = 0; q < requests; ++q) {
    acc.AddRequest(1, n, [&](int l, std::span<const int> hs, float* out) {
      m.Scores(keys, DefaultQueryKey(p.seed, RequestId(q)), l, hs, n, out, n);
    });
  }
  return acc.Result();
}

TEST(ImportanceModelV2, APersistentFieldKeepsTheSameTokensInEveryLayer) {
  ProceduralParams p;
  p.model = 2;
  p.head_corr = {1.0};
  p.query_dependence = 0;
  p.sink_tokens = 0;
  p.persistent = 1;  // the whole shared field is P, the same in every layer
  const StructureStats s = *Measure(p, 8, 2, 512, 2).structure;
  for (int d = 1; d < 8; ++d) EXPECT_DOUBLE_EQ(s.JaccardAt(d), 1.0) << d;
  EXPECT_NEAR(s.dispersion, 8.0, 1e-9);  // f is 0 or 1: var p(1-p), L times the binomial
  EXPECT_DOUBLE_EQ(s.f_pearson, 1.0);    // no query part
  // Without it (version 1's structure, layer_corr 0.5) layers far apart are near random.
  p.persistent = 0;
  p.layer_corr = 0.5;
  const StructureStats v = *Measure(p, 8, 2, 512, 2).structure;
  EXPECT_LT(v.JaccardAt(6), v.random_jaccard + 0.05);
}

TEST(ImportanceModelV2, RecencyRaisesTheLastTokens) {
  ProceduralParams p;
  p.model = 2;
  p.sink_tokens = 0;
  p.recency = {3, 3, 0, 0};
  const StructureStats s = *Measure(p, 6, 2, 256, 1).structure;
  EXPECT_GT(s.f_by_distance[0], 0.95);
  EXPECT_LT(s.f_by_distance[3], 0.25);
}

TEST(ImportanceModelV2, HeadSpreadMakesItfFallBackInSomeLayers) {
  ProceduralParams p;
  p.model = 2;
  p.head_corr = {0.55};
  p.sink_tokens = 0;
  const StructureStats fixed = *Measure(p, 12, 3, 512, 8).structure;
  p.head_spread = 2.0;
  const StructureStats spread = *Measure(p, 12, 3, 512, 8).structure;
  EXPECT_GT(spread.itf_similarity_within_var, 4 * fixed.itf_similarity_within_var);
  EXPECT_GT(spread.FallbackRate(), fixed.FallbackRate() + 0.05);
}

TEST(ImportanceModelV2, SmoothingClustersImportantTokens) {
  ProceduralParams p;
  p.model = 2;
  p.sink_tokens = 0;
  p.persistent = 0.5;
  ImportanceStatsOptions o;
  const StructureStats flat = *Measure(p, 6, 2, 1024, 2).structure;
  p.smooth = 0.9;
  const StructureStats smooth = *Measure(p, 6, 2, 1024, 2).structure;
  ASSERT_FALSE(flat.chunks_stored.empty());
  EXPECT_LT(smooth.chunks_stored[0], 0.9 * flat.chunks_stored[0]);  // chunk 16
}

}  // namespace
}  // namespace kvtier
