// Importance model version 3 (traces/importance_model.h): the text and header forms round-trip,
// its keys are refused without model=v3, and each new component produces the structure it is
// there for: the loadings give a layer-pair structure (a depth profile), the focus makes two
// queries of one prefix differ by regions; the fit's layer factoring recovers a known matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/errors.h"
#include "tests/traces/test_paths.h"
#include "traces/hash.h"
#include "traces/importance_fit.h"
#include "traces/importance_model.h"
#include "traces/importance_stats.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

using testing_traces::TempPath;

ProceduralParams V3() {
  return ProceduralParams::Parse(
      "model=v3 seed=3 head_corr=0.7,0.5 layer_corr=0.6 query_dependence=0.1 sink_tokens=1 "
      "sink_boost=8 tail=2 persistent_query=0.05 smooth=0.5 smooth_tokens=4 head_spread=0.3 "
      "recency=2,1,0.5,0 focus=0.2 focus_tokens=32 factors=2 loadings=0.9,0,0.5,0.5,0,0.9",
      "test");
}

TEST(ImportanceModelV3, TextFormRoundTrips) {
  const ProceduralParams p = V3();
  EXPECT_EQ(p.model, 3);
  EXPECT_EQ(p.factors, 2);
  EXPECT_EQ(p.loadings, (std::vector<double>{0.9, 0, 0.5, 0.5, 0, 0.9}));
  EXPECT_DOUBLE_EQ(p.focus, 0.2);
  EXPECT_EQ(p.focus_tokens, 32);
  const ProceduralParams q = ProceduralParams::Parse(p.ToString(), "round trip");
  EXPECT_EQ(q.ToString(), p.ToString());
  EXPECT_NE(p.ToString().find(" model=v3 "), std::string::npos);
  EXPECT_EQ(p.ToString().find("persistent="), std::string::npos);  // a v2-only key
}

TEST(ImportanceModelV3, KeysOfOtherVersionsAreRefused) {
  auto error_of = [](const std::string& text) {
    try {
      ProceduralParams::Parse(text, "e.ini:4: workload.importance");
    } catch (const InputError& e) {  // ConfigError from Parse, InputError from Validate
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_of("model=v2 factors=1 loadings=0.5").find("need model=v3"), std::string::npos);
  EXPECT_NE(error_of("focus=0.2").find("e.ini:4: workload.importance: factors, loadings, focus"),
            std::string::npos);
  EXPECT_NE(error_of("model=v3 persistent=0.4").find("need model=v2"), std::string::npos);
  // Loadings: whole rows of `factors` values, each row of norm <= 1.
  EXPECT_NE(error_of("model=v3 factors=2 loadings=0.5,0.5,0.5").find("loadings: expected"),
            std::string::npos);
  EXPECT_NE(error_of("model=v3 factors=2 loadings=0.8,0.8").find("squared norm"),
            std::string::npos);
  EXPECT_NE(error_of("model=v3 focus=1").find("focus: must be in [0, 1)"), std::string::npos);
}

TEST(ImportanceModelV3, TraceHeaderRoundTrips) {
  const ProceduralParams p = V3();
  const std::string path = TempPath("v3header.kvt");
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
  EXPECT_EQ(r.header().procedural->model, 3);
  EXPECT_EQ(r.header().procedural->ToString(), p.ToString());
  EXPECT_EQ(r.header().procedural->loadings, p.loadings);
  std::remove(path.c_str());
}

std::vector<std::uint32_t> Keys(std::int64_t n) {
  std::vector<std::uint32_t> k(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) k[t] = hash::Hash32(std::uint32_t(t) * 2654435761u + 7);
  return k;
}

StructureStats Measure(const ProceduralParams& p, int layers, int heads, std::int64_t n,
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
  return *acc.Result().structure;
}

ProceduralParams Plain() {
  ProceduralParams p;
  p.model = 3;
  p.head_corr = {1.0};
  p.query_dependence = 0;
  p.sink_tokens = 0;
  p.layer_corr = 0;  // the residual chain: independent layers
  return p;
}

TEST(ImportanceModelV3, LoadingsGiveTheLayerPairStructure) {
  // Four layers, two fields: layers 0-1 load only on field 0, layers 2-3 only on field 1
  // (rows at relative depth 0, 1/3, 2/3, 1). Layers sharing a field keep the same tokens,
  // layers on different fields are as unrelated as random sets.
  ProceduralParams p = Plain();
  p.factors = 2;
  p.loadings = {1, 0, 1, 0, 0, 1, 0, 1};
  const ImportanceModel m(p, 4, 1);
  EXPECT_DOUBLE_EQ(m.loadings(1)[0], 1.0);
  EXPECT_DOUBLE_EQ(m.loadings(2)[1], 1.0);
  const StructureStats s = Measure(p, 4, 1, 1024, 2);
  EXPECT_DOUBLE_EQ(s.PairJaccard(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(s.PairJaccard(2, 3), 1.0);
  EXPECT_NEAR(s.PairJaccard(0, 2), s.random_jaccard, 0.05);
  EXPECT_NEAR(s.PairJaccard(1, 3), s.random_jaccard, 0.05);
  // The distance curve averages the pair matrix along its diagonals.
  EXPECT_NEAR(s.JaccardAt(2), (s.PairJaccard(0, 2) + s.PairJaccard(1, 3)) / 2, 1e-12);
  // No loadings: every layer its own residual field, near random at every distance.
  p.loadings = {0, 0};
  const StructureStats z = Measure(p, 4, 1, 1024, 2);
  for (int d = 1; d < 4; ++d) EXPECT_NEAR(z.JaccardAt(d), z.random_jaccard, 0.05) << d;
}

TEST(ImportanceModelV3, FocusMakesQueriesDifferByRegions) {
  // Without focus (no query part at all) two queries of one prefix are identical; with it,
  // each query favours its own regions of focus_tokens tokens: f minus the other query's f
  // is correlated along positions well below the knot spacing, not beyond it.
  ProceduralParams p = Plain();
  p.factors = 1;
  p.loadings = {0.9};
  const StructureStats none = Measure(p, 6, 1, 2048, 2);
  EXPECT_DOUBLE_EQ(none.f_pearson, 1.0);
  p.focus = 0.5;
  p.focus_tokens = 64;
  const StructureStats focus = Measure(p, 6, 1, 2048, 2);
  EXPECT_LT(focus.f_pearson, 0.95);
  ASSERT_EQ(focus.focus_lags, (std::vector<int>{1, 4, 16, 64, 256}));
  EXPECT_GT(focus.focus_autocorr[1], 0.5);              // lag 4
  EXPECT_LT(std::abs(focus.focus_autocorr[4]), 0.15);   // lag 256
}

TEST(ImportanceModelV3, FactoringRecoversAKnownLayerCorrelation) {
  // C = B B^T + sqrt(r r^T) chain(rho) for a known one-factor B (a depth profile: the first
  // layer loads weakly, the rest strongly) and rho = 0.5; the factoring finds a matrix as
  // close (it may rotate B, not change B B^T).
  const int L = 10;
  std::vector<double> b(L), c(std::size_t(L) * L);
  for (int l = 0; l < L; ++l) b[l] = l == 0 ? 0.3 : 0.6 + 0.02 * l;
  for (int i = 0; i < L; ++i) {
    for (int j = 0; j < L; ++j) {
      const double ri = 1 - b[i] * b[i], rj = 1 - b[j] * b[j];
      c[std::size_t(i) * L + j] =
          i == j ? 1.0 : b[i] * b[j] + std::sqrt(ri * rj) * ChainCorrelation(0.5, i, j);
    }
  }
  const LayerFactors f = FactorLayerCorrelation(c, L, 1);
  EXPECT_LT(f.error, 1e-3);
  EXPECT_NEAR(f.rho, 0.5, 0.1);
  for (int l = 0; l < L; ++l) EXPECT_NEAR(std::abs(f.loadings[l]), b[l], 0.05) << l;
}

}  // namespace
}  // namespace kvtier
