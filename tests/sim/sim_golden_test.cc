// Golden test: one reused request through the whole pipeline on SimGrid, with its TTFT derived
// by hand from bytes, bandwidths and latencies (the compute steps come from the cost model,
// which has its own hand-calculation tests).

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/pipeline.h"
#include "models/cost_model.h"
#include "models/layer_table.h"
#include "sim/sim_executor.h"
#include "tests/sim/sim_testutil.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier::sim {
namespace {

using kvtier::testing::GoldenHw;
using kvtier::testing::GoldenModel;

TEST(SimGolden, OneLayerAsRequestFromSsd) {
  const ModelSpec m = GoldenModel();
  const HardwareOptions hw = GoldenHw();
  SystemOptions sys;
  sys.name = "as";
  sys.chunk_tokens = 64;
  sys.cache.gpu_capacity = 0;  // everything comes from the SSD
  sys.cache.cpu_capacity = 0;
  PipelineOptions options;
  options.system = sys;

  SimExecutor ex(m, hw);
  testing::ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
  MemoryRunLog log;
  Pipeline p(m, options, &ex, &scores, &log);
  Request r;
  r.prefix.resize(128);
  std::iota(r.prefix.begin(), r.prefix.end(), 1);
  r.query_tokens = 1;
  ex.Run([&] {
    r.id = 1;
    p.Run(r);    // computes and stores the prefix
    p.Finish();  // the store ends before the measured request
    ex.Drain();
    r.id = 2;
    p.Run(r);
    p.Finish();
  });
  ASSERT_EQ(log.requests.size(), 2u);
  const RequestRecord& q = log.requests[1];
  EXPECT_EQ(q.reused_tokens, 128);
  // K and V of 128 tokens: 2 chunks of 64 * 128 B = 8 KiB each, per kind.
  // SSD: K and V reads (16384 B, 2 I/Os each: one wave of 80 us at QD 32) run concurrently, so
  //   each gets 2.5 GB/s for (16384 + 80e-6 * 5e9) B = 416384 B -> 166.5536 us.
  // staged_gather (the default): the CPU gathers each kind's 2 runs (2 whole chunks) into
  //   staging: K and V gathers of (16384 + 2 runs * 100 ns * 8e9 B/s = 17984 B) share
  //   8 GB/s -> 4.496 us;
  // PCIe: then one DMA per kind: K and V copies (16384 B + 1 copy * 10 us * 25e9 B/s =
  //   266384 B each) share 25 GB/s -> 21.31072 us.
  const double io = 166.5536e-6 + 4.496e-6 + 21.31072e-6;
  ComputeOp layer;
  layer.kind = ComputeKind::kLayerPrefill;
  layer.layer = 0;
  layer.new_tokens = 1;
  layer.context_tokens = 129;
  ComputeOp output;
  output.kind = ComputeKind::kOutputLayer;
  output.new_tokens = 1;
  output.context_tokens = 1;
  const double compute = ComputeSeconds(m, hw, layer) + ComputeSeconds(m, hw, output);
  EXPECT_NEAR(q.ttft_s, io + compute, 1e-12);
  EXPECT_NEAR(q.io_stall_s, io, 1e-12);
  EXPECT_EQ(q.ssd_read_bytes, 32768u);
  EXPECT_EQ(q.pcie_h2d_bytes, 32768u);
  EXPECT_EQ(q.ssd_read_chunks, 4);
}

// gpu.layer_table: a one-layer model recomputing one request (prefix 128 + query 1: one
// layer_prefill of n = m = 129, then the output layer) takes exactly the table's times,
// whatever the roofline says. Each test builds one SimGrid engine (one per process).
double RecomputeTtftWithTable(const std::string& rows) {
  const ModelSpec m = GoldenModel();
  const std::filesystem::path csv = std::filesystem::temp_directory_path() /
                                    ("kvtier_golden_layers_" + std::to_string(::getpid()) + ".csv");
  std::ofstream(csv) << "# model = golden\nkind,new_tokens,context_tokens,heads,seconds\n" << rows;
  HardwareOptions hw;
  hw.gpu_layer_table = csv.string();
  SystemOptions sys;
  sys.name = "recomp";
  sys.schedule = "recompute";
  sys.chunk_tokens = 64;
  sys.cache.gpu_capacity = 0;
  sys.cache.cpu_capacity = 0;
  sys.store_new = false;
  PipelineOptions options;
  options.system = sys;
  SimExecutor ex(m, hw);
  std::filesystem::remove(csv);
  testing::ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
  MemoryRunLog log;
  Pipeline p(m, options, &ex, &scores, &log);
  Request r;
  r.id = 1;
  r.prefix.resize(128);
  std::iota(r.prefix.begin(), r.prefix.end(), 1);
  r.query_tokens = 1;
  ex.Run([&] {
    p.Run(r);
    p.Finish();
  });
  EXPECT_EQ(log.requests.size(), 1u);
  return log.requests.empty() ? -1.0 : log.requests[0].ttft_s;
}

TEST(SimGolden, OneLayerRecomputeTakesTheMeasuredTableTimes) {
  EXPECT_NEAR(RecomputeTtftWithTable("layer_prefill,129,129,0,0.002\noutput_layer,1,1,0,500us\n"),
              0.0025, 1e-12);
}

// Without an output_layer row that step falls back to the roofline exactly.
TEST(SimGolden, TableWithoutOutputRowUsesTheRooflineForIt) {
  const ModelSpec m = GoldenModel();
  ComputeOp output;
  output.kind = ComputeKind::kOutputLayer;
  output.new_tokens = 1;
  output.context_tokens = 1;
  EXPECT_NEAR(RecomputeTtftWithTable("layer_prefill,129,129,0,0.002\n"),
              0.002 + ComputeSeconds(m, HardwareOptions{}, output), 1e-12);
}

}  // namespace
}  // namespace kvtier::sim
