// Decode top-k statistics (traces/decode_stats.h) on hand-built sets whose answers are worked
// out in the comments: the step Jaccard by lag and k, the step hit, the speculative hit, the
// random levels, exact quantiles, sets shorter than k, empty sets, the leading share; and the
// same numbers through a trace file (`trace stats`'s path), where a trace without decode sets
// gets no decode block.
#include "traces/decode_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "tests/traces/test_paths.h"
#include "traces/trace_io.h"
#include "traces/trace_stats.h"

namespace kvtier {
namespace {

using testing_traces::TempPath;

// One layer, one KV head, k = 4, 10 candidates at every step:
//   step  output O_s        prefetched P_s
//   0     0 1 2 3           0 1 2 9
//   1     1 0 5 6           0 1 2 3
//   2     5 6 7 8           6 5 9 8
DecodeTopKSets HandSets() {
  DecodeTopKSets d;
  d.steps = 3;
  d.k = 4;
  d.layers = 1;
  d.kv_heads = 1;
  d.context = {20, 21, 22};
  d.candidates = {10, 10, 10};
  d.output = {{0, 1, 2, 3}, {1, 0, 5, 6}, {5, 6, 7, 8}};
  d.prefetched = {{0, 1, 2, 9}, {0, 1, 2, 3}, {6, 5, 9, 8}};
  return d;
}

TEST(DecodeStats, DefaultKsArePowersOfTwoBelowTheRecordedKAndK) {
  EXPECT_EQ(DefaultDecodeKs(64), (std::vector<int>{8, 16, 32, 64}));
  EXPECT_EQ(DefaultDecodeKs(100), (std::vector<int>{8, 16, 32, 64, 100}));
  EXPECT_EQ(DefaultDecodeKs(8), (std::vector<int>{8}));
  EXPECT_EQ(DefaultDecodeKs(5), (std::vector<int>{5}));
}

TEST(DecodeStats, PrefixIntersectionCountsCommonPositionsOfTwoPrefixes) {
  const std::vector<std::int64_t> x = {5, 1, 9, 3}, y = {3, 9, 7, 5};
  EXPECT_EQ(PrefixIntersection(x, 2, y, 2), 0);  // {5,1} vs {3,9}
  EXPECT_EQ(PrefixIntersection(x, 3, y, 2), 1);  // {5,1,9} vs {3,9}
  EXPECT_EQ(PrefixIntersection(x, 4, y, 4), 3);  // 5, 9, 3
  EXPECT_EQ(PrefixIntersection(x, 9, y, 9), 3);  // prefixes clipped to the sets
}

TEST(DecodeStats, HandBuiltSetsGiveTheWorkedOutOverlaps) {
  DecodeStatsOptions o;
  o.ks = {2, 4};
  o.lags = {1, 2};
  DecodeStatsAccumulator acc(o);
  acc.Add(HandSets());
  const DecodeStats& st = acc.Result();
  ASSERT_EQ(st.ks, (std::vector<int>{2, 4}));
  ASSERT_EQ(st.lags, (std::vector<int>{1, 2}));
  EXPECT_EQ(st.records, 1);
  EXPECT_EQ(st.steps, 3);
  EXPECT_TRUE(st.has_prefetched);
  EXPECT_DOUBLE_EQ(st.candidates_mean, 10.0);
  // k = 2: O = {0,1}, {1,0}, {5,6}. Lag 1: J = 1 (steps 0,1) and 0 (1,2) -> 0.5; hit the same.
  // Lag 2: J({0,1}, {5,6}) = 0. Spec: P = {0,1}, {0,1}, {6,5}: every P equals its O -> 1.
  EXPECT_EQ(st.step_jaccard[0][0].samples, 2);
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][0].Mean(), 0.5);
  EXPECT_DOUBLE_EQ(st.step_hit[0].Mean(), 0.5);
  EXPECT_EQ(st.step_jaccard[0][1].samples, 1);
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][1].Mean(), 0.0);
  EXPECT_DOUBLE_EQ(st.spec_hit[0].Mean(), 1.0);
  // k = 4: |O0 ∩ O1| = |{0,1}| = 2 -> J = 2/6; |O1 ∩ O2| = |{5,6}| = 2 -> 2/6; hit 2/4 both.
  // Lag 2: O0 ∩ O2 = {} -> 0. Spec: |P0 ∩ O0| = 3 (0,1,2), |P1 ∩ O1| = 2 (0,1),
  // |P2 ∩ O2| = 3 (5,6,8) -> 0.75, 0.5, 0.75, mean 2/3.
  EXPECT_DOUBLE_EQ(st.step_jaccard[1][0].Mean(), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(st.step_hit[1].Mean(), 0.5);
  EXPECT_DOUBLE_EQ(st.step_jaccard[1][1].Mean(), 0.0);
  EXPECT_DOUBLE_EQ(st.spec_hit[1].Mean(), 2.0 / 3.0);
  // Random levels at k = 4 of 10: E|A ∩ B| = 16/10 = 1.6, J = 1.6 / (8 - 1.6) = 0.25;
  // hit a/n = 0.4; spec the same 0.4.
  EXPECT_DOUBLE_EQ(st.step_jaccard[1][0].RandomMean(), 0.25);
  EXPECT_DOUBLE_EQ(st.step_hit[1].RandomMean(), 0.4);
  EXPECT_DOUBLE_EQ(st.spec_hit[1].RandomMean(), 0.4);
  // Exact quantiles of {0.5, 0.75, 0.75}: p10 -> rank 1, p50 -> rank 2, p90 -> rank 3.
  EXPECT_DOUBLE_EQ(st.spec_hit[1].Quantile(0.1), 0.5);
  EXPECT_DOUBLE_EQ(st.spec_hit[1].Quantile(0.5), 0.75);
  EXPECT_DOUBLE_EQ(st.spec_hit[1].Quantile(0.9), 0.75);
  EXPECT_EQ(st.spec_hit[1].Histogram(), (std::vector<std::int64_t>{0, 0, 0, 0, 0, 1, 0, 2, 0, 0}));
  EXPECT_DOUBLE_EQ(st.spec_hit[1].LayerMean(0), 2.0 / 3.0);
  // Leading share at k = 2: position 0 and 1 in steps 0 and 1 (2 of 3 sets), 5 and 6 in step 2.
  EXPECT_DOUBLE_EQ(st.leading_share[0][0], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(st.leading_share[0][1], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(st.leading_share[0][2], 0.0);
  EXPECT_DOUBLE_EQ(st.leading_share[0][5], 1.0 / 3.0);
}

TEST(DecodeStats, SetsShorterThanKAndEmptySets) {
  // Step 0 has no candidates (an empty set: skipped), step 1 three (a set of 3 < k = 4),
  // step 2 five.
  DecodeTopKSets d;
  d.steps = 3;
  d.k = 4;
  d.layers = 1;
  d.kv_heads = 1;
  d.context = {60, 61, 62};
  d.candidates = {0, 3, 5};
  d.output = {{}, {2, 0, 1}, {4, 2, 0, 3}};
  DecodeStatsOptions o;
  o.ks = {4};
  o.lags = {1};
  DecodeStatsAccumulator acc(o);
  acc.Add(d);
  const DecodeStats& st = acc.Result();
  EXPECT_FALSE(st.has_prefetched);
  EXPECT_EQ(st.empty_sets, 1);
  EXPECT_EQ(st.spec_hit[0].samples, 0);
  EXPECT_TRUE(std::isnan(st.spec_hit[0].Mean()));
  // One pair (1, 2): |{2,0,1} ∩ {4,2,0,3}| = 2, J = 2 / (3 + 4 - 2) = 0.4, hit 2/4.
  // Random: E = 3 * 4 / 5 = 2.4, J = 2.4 / (7 - 2.4); hit 3/5.
  ASSERT_EQ(st.step_jaccard[0][0].samples, 1);
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][0].Mean(), 0.4);
  EXPECT_DOUBLE_EQ(st.step_hit[0].Mean(), 0.5);
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][0].RandomMean(), 2.4 / 4.6);
  EXPECT_DOUBLE_EQ(st.step_hit[0].RandomMean(), 0.6);
}

TEST(DecodeStats, KsAboveTheRecordedKAreDroppedAndLayersAreSeparate) {
  DecodeTopKSets d = HandSets();
  d.layers = 2;  // layer 1: the same sets shifted by one step (O1, O2, O0)
  DecodeTopKSets two = d;
  two.output.clear();
  two.prefetched.clear();
  for (int s = 0; s < 3; ++s) {
    two.output.push_back(d.output[s]);
    two.output.push_back(d.output[(s + 1) % 3]);
    two.prefetched.push_back(d.prefetched[s]);
    two.prefetched.push_back(d.output[(s + 1) % 3]);  // layer 1: P = O, hit 1
  }
  DecodeStatsOptions o;
  o.ks = {4, 8};
  o.lags = {1};
  DecodeStatsAccumulator acc(o);
  acc.Add(two);
  const DecodeStats& st = acc.Result();
  EXPECT_EQ(st.ks, (std::vector<int>{4}));
  EXPECT_DOUBLE_EQ(st.spec_hit[0].LayerMean(0), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(st.spec_hit[0].LayerMean(1), 1.0);
  // Layer 1 pairs: (O1, O2) = 1/3, (O2, O0) = 0.
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][0].LayerMean(1), 1.0 / 6.0);
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][0].Mean(), (1.0 / 3 + 1.0 / 3 + 1.0 / 3 + 0) / 4);
}

TraceHeader OneLayerHeader() {
  TraceHeader h;
  h.producer = "decode_stats_test";
  h.model = {"tiny", 1, 2, 1};
  return h;
}

TraceRecord Record(RequestId id, bool with_sets) {
  TraceRecord r;
  r.request.id = id;
  r.request.arrival_s = double(id);
  r.request.tokens_per_symbol = 1;
  for (int i = 0; i < 16; ++i) r.request.prefix.push_back(std::uint64_t(100 + i));
  r.request.query_tokens = 4;
  r.request.output_tokens = 3;
  if (with_sets) r.decode_sets = HandSets();
  return r;
}

TEST(DecodeStats, TraceStatsMeasuresDecodeSetsOfATraceFile) {
  const std::string path = TempPath("decode_stats.kvt");
  {
    TraceWriter w(path, OneLayerHeader());
    w.Write(Record(0, true));
    w.Write(Record(1, false));  // a record without sets is not measured
    w.Write(Record(2, true));
    w.Close();
  }
  TraceStatsOptions o;
  o.decode.ks = {2, 4};
  o.decode.lags = {1, 2};
  const TraceStats st = ComputeTraceStats(path, o);
  ASSERT_TRUE(st.decode);
  EXPECT_EQ(st.decode->records, 2);
  EXPECT_EQ(st.decode->step_jaccard[1][0].samples, 4);
  EXPECT_DOUBLE_EQ(st.decode->spec_hit[1].Mean(), 2.0 / 3.0);
  const std::string json = FormatStatsJson(st);
  EXPECT_NE(json.find("\"decode\": {"), std::string::npos) << json;
  EXPECT_NE(json.find("\"spec_hit\": {\"samples\": 6, \"mean\": 0.6667"), std::string::npos)
      << json;
  const std::string table = FormatStatsTable(st);
  EXPECT_NE(table.find("decode top-k sets (2 records, 6 steps"), std::string::npos) << table;

  {  // A trace without decode sets has no decode block.
    TraceWriter w(path, OneLayerHeader());
    w.Write(Record(0, false));
    w.Close();
  }
  const TraceStats none = ComputeTraceStats(path, o);
  EXPECT_FALSE(none.decode);
  EXPECT_EQ(FormatStatsJson(none).find("\"decode\""), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvtier
