// workload.h2o_selection = sampled through the simulator: the H2O baseline's TTFT distribution
// and bytes on a small conversation trace (model-generated importance, seed=1 as the Mooncake
// bench) with the sampled selection against the exact one, within the tolerances stated below
// (the selection-level comparison is tests/traces/h2o_sampling_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/pipeline.h"
#include "core/run_log.h"
#include "sim/sim_executor.h"
#include "tests/sim/sim_testutil.h"
#include "traces/score_source.h"

namespace kvtier::sim {
namespace {

ModelSpec Model() {  // OPT-shaped, 32 KV heads, 8 layers
  ModelSpec m;
  m.name = "opt-small32";
  m.family = ModelFamily::kOpt;
  m.layers = 8;
  m.hidden = 2048;
  m.heads = 32;
  m.kv_heads = 32;
  m.head_dim = 64;
  m.ffn = 8192;
  m.vocab = 50272;
  m.max_context = 16384;
  return m;
}

struct Outcome {
  std::vector<double> ttft;
  double ssd_bytes = 0, h2d_bytes = 0;
};

// as_h2o_lfu over 8 conversations of 6 turns (each turn's prefix is the previous turn's plus
// ~600 tokens; 2,000-5,000-token prefixes), the GPU cache too small for more than a few turns.
Outcome RunH2o(bool sampled) {
  const std::string bytes = testing::InChildText([&] {
    const ModelSpec m = Model();
    HardwareOptions hw;
    hw.gpu_flops = 312e12;
    hw.gpu_efficiency = 0.6;
    SimExecutor ex(m, hw);
    TraceHeader header;
    header.model = {m.name, m.layers, m.heads, m.kv_heads};
    TraceScoreSource scores(header, m, ProceduralParams::Parse("seed=1", "test"));
    scores.SampleH2o(sampled);
    MemoryRunLog log;
    PipelineOptions o;
    o.system.name = "as_h2o_lfu";
    o.system.select = "h2o";
    o.system.prefetch = PrefetchMode::kLayer;
    o.system.cache_policy = "lfu";
    o.system.chunk_tokens = 64;
    o.system.retention = 0.25;
    o.system.cache.gpu_capacity = 64 << 20;
    o.system.cache.cpu_capacity = 256 << 20;
    Pipeline p(m, o, &ex, &scores, &log);
    ex.Run([&] {
      RequestId id = 1;
      for (int turn = 0; turn < 6; ++turn) {
        for (int conv = 0; conv < 8; ++conv) {
          TraceRecord rec;
          rec.request.id = id++;
          rec.request.prefix.resize(std::size_t(2000 + 600 * turn + 37 * conv));
          std::iota(rec.request.prefix.begin(), rec.request.prefix.end(),
                    std::uint64_t(1000000) * std::uint64_t(conv + 1));
          rec.request.query_tokens = 64;
          rec.importance = ImportanceKind::kNone;
          scores.Add(rec);
          p.Run(rec.request);
          p.Finish();
          ex.Drain();
          scores.Release(rec.request.id);
        }
      }
      p.Finish();
    });
    std::string out;
    for (const RequestRecord& r : log.requests) {
      const double v[3] = {r.ttft_s, double(r.ssd_read_bytes), double(r.pcie_h2d_bytes)};
      out.append(reinterpret_cast<const char*>(v), sizeof v);
    }
    return out;
  });
  Outcome o;
  for (std::size_t i = 0; i + 3 * sizeof(double) <= bytes.size(); i += 3 * sizeof(double)) {
    double v[3];
    std::memcpy(v, bytes.data() + i, sizeof v);
    o.ttft.push_back(v[0]);
    o.ssd_bytes += v[1];
    o.h2d_bytes += v[2];
  }
  return o;
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::size_t(q * double(v.size() - 1))];
}

TEST(SimH2oSampling, TtftsAndBytesFollowTheExactSelection) {
  const Outcome exact = RunH2o(false), sampled = RunH2o(true);
  ASSERT_EQ(exact.ttft.size(), 48u);
  ASSERT_EQ(sampled.ttft.size(), 48u);
  const double mean_e = std::accumulate(exact.ttft.begin(), exact.ttft.end(), 0.0) / 48;
  const double mean_s = std::accumulate(sampled.ttft.begin(), sampled.ttft.end(), 0.0) / 48;
  std::printf(
      "as_h2o_lfu, 48 requests: TTFT mean %.4f / %.4f s, p50 %.4f / %.4f, p90 %.4f / %.4f "
      "(exact / sampled); SSD read %.1f / %.1f MB; H2D %.1f / %.1f MB\n",
      mean_e, mean_s, Quantile(exact.ttft, 0.5), Quantile(sampled.ttft, 0.5),
      Quantile(exact.ttft, 0.9), Quantile(sampled.ttft, 0.9), exact.ssd_bytes / 1e6,
      sampled.ssd_bytes / 1e6, exact.h2d_bytes / 1e6, sampled.h2d_bytes / 1e6);
  // Tolerances: the bytes (sums over heads and tokens) within 1%, the TTFT mean within 2%, its
  // median and 90th percentile within 3% -- the exact path keeps exactly k tokens per head, the
  // draw k on average, and other tokens.
  EXPECT_NEAR(sampled.h2d_bytes / exact.h2d_bytes, 1.0, 0.01);
  if (exact.ssd_bytes > 0) {
    EXPECT_NEAR(sampled.ssd_bytes / exact.ssd_bytes, 1.0, 0.01);
  }
  EXPECT_NEAR(mean_s / mean_e, 1.0, 0.02);
  EXPECT_NEAR(Quantile(sampled.ttft, 0.5) / Quantile(exact.ttft, 0.5), 1.0, 0.03);
  EXPECT_NEAR(Quantile(sampled.ttft, 0.9) / Quantile(exact.ttft, 0.9), 1.0, 0.03);
  // And it is not the exact path by accident: some request differs.
  EXPECT_NE(exact.ttft, sampled.ttft);
}

}  // namespace
}  // namespace kvtier::sim
