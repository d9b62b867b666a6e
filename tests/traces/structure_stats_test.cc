// The structure statistics of `trace stats` (traces/importance_stats.h) on hand-built importance
// with answers derived by hand: layer-set Jaccard by layer distance, layer-share dispersion,
// the share of tokens kept by no layer, recency, cross-query correlation, history/own packing
// savings and the ITF fallback rate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include "tests/traces/test_paths.h"
#include "traces/importance_stats.h"
#include "traces/trace_io.h"
#include "traces/trace_stats.h"

namespace kvtier {
namespace {

using testing_traces::TempPath;

constexpr std::int64_t kN = 128;  // tokens; retention 0.25 keeps k = 32

ImportanceStatsOptions Options() {
  ImportanceStatsOptions o;
  o.retentions = {0.25};
  o.structure.retention = 0.25;
  o.structure.chunk_sizes = {16, 32, 64, 128};
  o.structure.itf_probe_heads = 2;
  return o;
}

// Every head of layer l scores 2 for tokens in set(l), 1 elsewhere (so set(l) is the top-k).
ImportanceAccumulator::ScoreFn SetScores(std::function<bool(int layer, std::int64_t t)> in_set) {
  return [in_set](int layer, std::span<const int> heads, float* out) {
    for (std::size_t j = 0; j < heads.size(); ++j) {
      for (std::int64_t t = 0; t < kN; ++t) out[j * kN + t] = in_set(layer, t) ? 2.0f : 1.0f;
    }
  };
}

// Layer l keeps the window [8l, 8l + 32): windows d layers apart share 32 - 8d tokens.
bool Window(int layer, std::int64_t t) { return t >= 8 * layer && t < 8 * layer + 32; }

TEST(StructureStats, JaccardByLayerDistanceOfShiftedWindows) {
  ImportanceAccumulator acc(6, 1, Options());
  acc.AddRequest(1, kN, SetScores(Window));
  const StructureStats s = *acc.Result().structure;
  ASSERT_EQ(s.jaccard_by_distance.size(), 5u);
  EXPECT_DOUBLE_EQ(s.JaccardAt(1), 24.0 / 40.0);  // |A∩B| = 24, |A∪B| = 40
  EXPECT_DOUBLE_EQ(s.JaccardAt(2), 16.0 / 48.0);
  EXPECT_DOUBLE_EQ(s.JaccardAt(3), 8.0 / 56.0);
  EXPECT_DOUBLE_EQ(s.JaccardAt(4), 0.0);
  EXPECT_DOUBLE_EQ(s.JaccardAt(5), 0.0);
  EXPECT_TRUE(std::isnan(s.JaccardAt(6)));
  // The pair matrix: every pair d apart has the curve's value; 1 on the diagonal, symmetric.
  ASSERT_EQ(s.layers, 6);
  EXPECT_DOUBLE_EQ(s.PairJaccard(3, 3), 1.0);
  EXPECT_DOUBLE_EQ(s.PairJaccard(0, 1), 24.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.PairJaccard(4, 3), 24.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.PairJaccard(1, 4), 8.0 / 56.0);
  EXPECT_DOUBLE_EQ(s.PairJaccard(5, 0), 0.0);
  EXPECT_NEAR(s.random_jaccard, (32.0 * 32 / 128) / (64 - 32.0 * 32 / 128), 1e-12);
}

TEST(StructureStats, DispersionAgainstTheBinomial) {
  // Windows: token t is kept by the layers l with 8l <= t < 8l + 32. Counted by hand:
  // f*6 = 1,2,3,4 for t in [0,8),[8,16),[16,24),[24,32); 4 for [32,48); 3,2,1 for
  // [48,56),[56,64),[64,72); 0 for [72,128). Sum of c^2 = 8*(1+4+9+16) + 16*16 + 8*(9+4+1) = 608.
  ImportanceAccumulator acc(6, 1, Options());
  acc.AddRequest(1, kN, SetScores(Window));
  const StructureStats s = *acc.Result().structure;
  const double p = 0.25, var = 608.0 / 128 / 36 - p * p;
  EXPECT_NEAR(s.f_mean_var, var, 1e-12);
  EXPECT_NEAR(s.dispersion, var / (p * (1 - p) / 6), 1e-12);
  // Every layer keeping the same set: f is 0 or 1, var = p(1-p), dispersion = L.
  ImportanceAccumulator same(6, 1, Options());
  same.AddRequest(1, kN, SetScores([](int, std::int64_t t) { return t < 32; }));
  EXPECT_NEAR(same.Result().structure->dispersion, 6.0, 1e-12);
}

TEST(StructureStats, KeptByNoneCountsTokensNoLayerKeeps) {
  // Windows: layers 0..5 keep [0, 72) between them, so tokens [72, 128) are kept by none.
  ImportanceAccumulator acc(6, 1, Options());
  acc.AddRequest(1, kN, SetScores(Window));
  EXPECT_NEAR(acc.Result().structure->kept_by_none, 56.0 / 128, 1e-12);
  // Every layer keeping the same 32 tokens: 96 kept by none. Two requests: the mean.
  ImportanceAccumulator two(6, 1, Options());
  two.AddRequest(1, kN, SetScores(Window));
  two.AddRequest(2, kN, SetScores([](int, std::int64_t t) { return t < 32; }));
  EXPECT_NEAR(two.Result().structure->kept_by_none, (56.0 + 96.0) / 128 / 2, 1e-12);
  // Each layer keeping its own 32 tokens (4 layers cover all 128): none left.
  ImportanceAccumulator cover(4, 1, Options());
  cover.AddRequest(1, kN, SetScores([](int l, std::int64_t t) { return t / 32 == l; }));
  EXPECT_DOUBLE_EQ(cover.Result().structure->kept_by_none, 0.0);
}

TEST(StructureStats, RecencyBinsByDistanceFromTheEnd) {
  // Every layer keeps the last 32 tokens: f = 1 at distances 0-31, 0 beyond. Bins [0,2],
  // [3,14], [15,62], [63,254]: 1, 1, 17/48, 0.
  ImportanceAccumulator acc(4, 1, Options());
  acc.AddRequest(1, kN, SetScores([](int, std::int64_t t) { return t >= kN - 32; }));
  const StructureStats s = *acc.Result().structure;
  ASSERT_EQ(s.f_by_distance.size(), 4u);
  EXPECT_DOUBLE_EQ(s.f_by_distance[0], 1.0);
  EXPECT_DOUBLE_EQ(s.f_by_distance[1], 1.0);
  EXPECT_DOUBLE_EQ(s.f_by_distance[2], 17.0 / 48.0);
  EXPECT_DOUBLE_EQ(s.f_by_distance[3], 0.0);
}

TEST(StructureStats, CrossQueryAndPackingOfIdenticalRequests) {
  // Two requests on one prefix keep every 4th token in every layer. Stored order touches every
  // chunk; packing by the other's f puts the 32 kept tokens first: 2 of 8 chunks of 16,
  // 1 of 4 of 32, 1 of 2 of 64, 1 of 1 of 128.
  ImportanceAccumulator acc(4, 1, Options());
  auto every4 = SetScores([](int, std::int64_t t) { return t % 4 == 0; });
  acc.AddRequest(7, kN, every4);
  acc.AddRequest(7, kN, every4);
  const StructureStats s = *acc.Result().structure;
  EXPECT_EQ(s.pairs, 1);
  EXPECT_DOUBLE_EQ(s.f_pearson, 1.0);
  EXPECT_DOUBLE_EQ(s.f_topk_jaccard, 1.0);
  EXPECT_EQ(s.history_requests, 2);
  const double stored[] = {8, 4, 2, 1}, packed[] = {2, 1, 1, 1};
  for (std::size_t c = 0; c < 4; ++c) {
    EXPECT_DOUBLE_EQ(s.chunks_stored[c], stored[c]) << s.chunk_sizes[c];
    EXPECT_DOUBLE_EQ(s.chunks_history[c], packed[c]) << s.chunk_sizes[c];
    EXPECT_DOUBLE_EQ(s.chunks_own[c], packed[c]) << s.chunk_sizes[c];
    EXPECT_DOUBLE_EQ(s.HistorySaving(c), 1 - packed[c] / stored[c]);
  }
}

TEST(StructureStats, CrossQueryAndPackingOfDisjointRequests) {
  // A keeps t % 4 == 0, B keeps t % 4 == 2. Pearson of two disjoint indicators with p = 1/4:
  // -p^2 / (p(1-p)) = -1/3; their top-k sets are disjoint. Packing A by B's f puts B's tokens
  // at 0..31 and A's token 4j at 32 + 3j (A's tokens are every third of the rest), so A touches
  // positions 32..125: chunks 2..7 of 16 (6 of 8). B by A's f is the mirror image: B's token
  // 4j+2 is the (3j+1)-th of the rest, at 33 + 3j: positions 33..126, chunks 2..7 too.
  ImportanceAccumulator acc(4, 1, Options());
  acc.AddRequest(7, kN, SetScores([](int, std::int64_t t) { return t % 4 == 0; }));
  acc.AddRequest(7, kN, SetScores([](int, std::int64_t t) { return t % 4 == 2; }));
  const StructureStats s = *acc.Result().structure;
  EXPECT_NEAR(s.f_pearson, -1.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.f_topk_jaccard, 0.0);
  EXPECT_DOUBLE_EQ(s.chunks_stored[0], 8.0);
  EXPECT_DOUBLE_EQ(s.chunks_history[0], 6.0);
  EXPECT_DOUBLE_EQ(s.chunks_own[0], 2.0);
  EXPECT_DOUBLE_EQ(s.HistorySaving(0), 0.25);
  EXPECT_DOUBLE_EQ(s.OwnSaving(0), 0.75);
  // Focus: A's count minus B's is +4 at t % 4 == 0, -4 at t % 4 == 2, 0 elsewhere (mean 0,
  // variance 8); shifted by 1 it never meets itself (0), by a multiple of 4 it is itself (1);
  // no request is longer than 256 tokens (NaN).
  ASSERT_EQ(s.focus_lags, (std::vector<int>{1, 4, 16, 64, 256}));
  EXPECT_DOUBLE_EQ(s.focus_autocorr[0], 0.0);
  EXPECT_DOUBLE_EQ(s.focus_autocorr[1], 1.0);
  EXPECT_DOUBLE_EQ(s.focus_autocorr[2], 1.0);
  EXPECT_DOUBLE_EQ(s.focus_autocorr[3], 1.0);
  EXPECT_TRUE(std::isnan(s.focus_autocorr[4]));
}

TEST(StructureStats, ItfFallbackRateUsesSelectItfOnTheProbeHeads) {
  // Two KV heads. Even layers: identical rows (similarity 1, pass). Odd layers: head 0 keeps
  // [0, 32), head 1 keeps [96, 128) (similarity 0 < j^0.6, fallback).
  ImportanceAccumulator acc(4, 2, Options());
  acc.AddRequest(1, kN, [](int layer, std::span<const int> heads, float* out) {
    for (std::size_t j = 0; j < heads.size(); ++j) {
      for (std::int64_t t = 0; t < kN; ++t) {
        const bool kept = layer % 2 == 0 ? t < 32 : (heads[j] == 0 ? t < 32 : t >= 96);
        out[j * kN + t] = kept ? 2.0f : 1.0f;
      }
    }
  });
  const StructureStats s = *acc.Result().structure;
  EXPECT_EQ(s.itf_probe_heads, 2);
  EXPECT_EQ(s.itf_layers, 4);
  EXPECT_EQ(s.itf_fallbacks, 2);
  EXPECT_DOUBLE_EQ(s.FallbackRate(), 0.5);
  EXPECT_DOUBLE_EQ(s.itf_similarity_mean, 0.5);
  EXPECT_DOUBLE_EQ(s.itf_similarity_within_var, 0.0);  // each layer is the same every time
}

TEST(StructureStats, PackingOfWhatItfLoads) {
  // Two KV heads (both probe heads), 4 layers, two identical requests on one prefix. Even
  // layers: both heads keep E = {t % 4 == 0} (pass; voted set E). Odd layers: head 0 keeps
  // [0, 32), head 1 [96, 128) (fallback: every key, the values of U = [0, 32) u [96, 128)).
  // ITF history per token (the other request's): 2 per even layer's E, 1/2 per head on the
  // odd layers, so 3 on E n U (16 tokens), 2 on E \ U (16), 1 on U \ E (48), 0 elsewhere: packed
  // at positions 0-15, 16-31, 32-79, 80-127. Chunks of 16/32/64/128 (of 8/4/2/1):
  //   pass layer   stored 8/4/2/1 (E is everywhere), packed 2/1/1/1 (positions 0-31);
  //   fallback     stored U 4/2/2/1, packed U (0-15, 32-79) 4/3/2/1; counted (all + U) / 2:
  //                stored 6/3/2/1, packed 6/3.5/2/1.
  // Per layer: stored (8+6)/2 = 7, 3.5, 2, 1; packed (2+6)/2 = 4, 2.25, 1.5, 1.
  ImportanceAccumulator acc(4, 2, Options());
  auto scores = [](int layer, std::span<const int> heads, float* out) {
    for (std::size_t j = 0; j < heads.size(); ++j) {
      for (std::int64_t t = 0; t < kN; ++t) {
        const bool kept = layer % 2 == 0 ? t % 4 == 0 : (heads[j] == 0 ? t < 32 : t >= 96);
        out[j * kN + t] = kept ? 2.0f : 1.0f;
      }
    }
  };
  acc.AddRequest(7, kN, scores);
  acc.AddRequest(7, kN, scores);
  const StructureStats s = *acc.Result().structure;
  EXPECT_EQ(s.itf_fallbacks, 4);
  const double stored[] = {7, 3.5, 2, 1}, packed[] = {4, 2.25, 1.5, 1};
  for (std::size_t c = 0; c < 4; ++c) {
    EXPECT_DOUBLE_EQ(s.chunks_itf_stored[c], stored[c]) << s.chunk_sizes[c];
    EXPECT_DOUBLE_EQ(s.chunks_itf_history[c], packed[c]) << s.chunk_sizes[c];
    EXPECT_DOUBLE_EQ(s.ItfHistorySaving(c), 1 - packed[c] / stored[c]) << s.chunk_sizes[c];
  }
  // Without probe heads nothing is measured.
  ImportanceStatsOptions o = Options();
  o.structure.itf_probe_heads = 0;
  ImportanceAccumulator none(4, 2, o);
  none.AddRequest(7, kN, scores);
  none.AddRequest(7, kN, scores);
  const StructureStats n = *none.Result().structure;
  EXPECT_TRUE(std::isnan(n.ItfHistorySaving(0)));
  EXPECT_FALSE(std::isnan(n.HistorySaving(0)));
}

TEST(StructureStats, ShortRequestsAreNotMeasured) {
  ImportanceStatsOptions o = Options();
  o.structure.min_tokens = 200;
  ImportanceAccumulator acc(4, 1, o);
  acc.AddRequest(1, kN, SetScores(Window));
  const ImportanceStats s = acc.Result();
  EXPECT_EQ(s.requests, 1);
  EXPECT_EQ(s.structure->requests, 0);
  EXPECT_TRUE(std::isnan(s.structure->JaccardAt(1)));
  EXPECT_TRUE(std::isnan(s.structure->FallbackRate()));
}

TEST(StructureStats, TraceStatsOfAnExplicitTraceMatchTheHandDerivation) {
  // The same windows as explicit scores in a trace file, through ComputeTraceStats and the
  // JSON writer.
  const std::string path = TempPath("structure.kvt");
  TraceHeader h;
  h.producer = "test";
  h.model = {"hand", 6, 1, 1};
  {
    TraceWriter w(path, h);
    for (int i = 0; i < 2; ++i) {
      TraceRecord rec;
      rec.request.id = RequestId(i);
      rec.request.arrival_s = i;
      for (std::int64_t t = 0; t < kN; ++t) rec.request.prefix.push_back(std::uint64_t(t + 5));
      rec.request.query_tokens = 4;
      rec.importance = ImportanceKind::kExplicit;
      std::vector<float> scores(6 * kN);
      for (int l = 0; l < 6; ++l) {
        for (std::int64_t t = 0; t < kN; ++t) scores[l * kN + t] = Window(l, t) ? 2.0f : 1.0f;
      }
      rec.explicit_scores = ExplicitScores::Quantize(6, 1, kN, scores);
      w.Write(rec);
    }
    w.Close();
  }
  TraceStatsOptions opt;
  opt.importance = Options();
  const TraceStats st = ComputeTraceStats(path, opt);
  ASSERT_TRUE(st.importance && st.importance->structure);
  const StructureStats& s = *st.importance->structure;
  EXPECT_EQ(s.requests, 2);
  EXPECT_DOUBLE_EQ(s.JaccardAt(1), 0.6);
  EXPECT_DOUBLE_EQ(s.f_pearson, 1.0);
  EXPECT_EQ(s.itf_layers, 12);  // one KV head: one probe head, which never falls back
  EXPECT_EQ(s.itf_fallbacks, 0);
  const std::string json = FormatStatsJson(st);
  EXPECT_NE(json.find("\"jaccard_by_distance\": [0.6000, 0.3333, 0.1429, 0.0000, 0.0000]"),
            std::string::npos)
      << json;
  EXPECT_NE(FormatStatsTable(st).find("layer-share dispersion"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvtier
