// The vendored Mooncake conversation trace imports completely; its request count and ideal
// reuse ratio (prefix-contiguous, unbounded cache) are pinned (cross-checked with a Python
// one-liner over the JSON lines: 105,584 of 276,469 full prefix blocks).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/traces/test_paths.h"
#include "traces/mooncake.h"
#include "traces/trace_io.h"
#include "traces/trace_stats.h"

namespace kvtier {
namespace {

TEST(Mooncake, ConversationTraceImportsCompletely) {
  const std::string in = testing_traces::SourceDir() + "/data/mooncake/conversation_trace.jsonl";
  const std::string out = testing_traces::TempPath("conv.kvt");
  MooncakeImportOptions opt;
  opt.chunk_tokens = 64;
  const MooncakeImportSummary s = ImportMooncake(in, out, opt);
  EXPECT_EQ(s.records, 12031);
  const TraceStats st = ComputeTraceStats(out);
  EXPECT_EQ(st.requests, 12031);
  EXPECT_EQ(st.by_kind[0], 12031);
  EXPECT_EQ(st.reusable_symbols, 105584 * 8);
  EXPECT_EQ(st.prefix_symbols, 276469 * 8);
  EXPECT_EQ(st.total_prefix_tokens, 276469LL * 512);
  EXPECT_NEAR(st.IdealReuseRatio(), 0.381902, 1e-6);
  EXPECT_EQ(st.input_tokens.Max(), 126195);
  EXPECT_NEAR(st.input_tokens.Mean(), 12035.1, 0.05);
  EXPECT_NEAR(st.last_arrival_s, 3536.999, 1e-9);
  TraceReader r(out);
  EXPECT_EQ(r.header().chunk_tokens, 64);
  TraceRecord rec;
  ASSERT_TRUE(r.Next(&rec));
  // Line 1: input 6758 -> 13 full blocks (ids 0..12) as prefix, 102 query tokens.
  EXPECT_EQ(rec.request.prefix.size(), 13u * 8);
  EXPECT_EQ(rec.request.tokens_per_symbol, 64);
  EXPECT_EQ(rec.request.query_tokens, 6758 - 13 * 512);
  EXPECT_EQ(rec.request.output_tokens, 500);
  std::remove(out.c_str());
}

}  // namespace
}  // namespace kvtier
