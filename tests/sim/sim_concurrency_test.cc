// Concurrent prefills (gpu.concurrent_prefills, sim/serve.h): golden times of two requests
// served one at a time and two at once, derived by hand from the bandwidths and latencies (the
// compute steps come from the cost model, which has its own hand-calculation tests), and
// determinism of a loaded run with three at once. Each TEST builds one SimGrid engine (one per
// process); the determinism test forks a child per simulation.

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <numeric>
#include <string>

#include "core/pipeline.h"
#include "models/cost_model.h"
#include "sim/serve.h"
#include "sim/sim_executor.h"
#include "tests/sim/sim_testutil.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier::sim {
namespace {

using kvtier::testing::GoldenHw;
using kvtier::testing::GoldenModel;
using kvtier::testing::InChildText;

Request Prefix128(RequestId id, Seconds arrival) {
  Request r;
  r.id = id;
  r.arrival_s = arrival;
  r.prefix.resize(128);
  std::iota(r.prefix.begin(), r.prefix.end(), 1);
  r.query_tokens = 1;
  return r;
}

// Request 1 (at 0) computes and stores the 128-token prefix; requests 2 and 3 reuse all of it
// from the SSD (no cache), arriving at `a2` and `a3`; served by `workers` prefills.
MemoryRunLog ServeThree(int workers, Seconds a2, Seconds a3) {
  const ModelSpec m = GoldenModel();
  SystemOptions sys;
  sys.name = "as";
  sys.chunk_tokens = 64;
  sys.cache.gpu_capacity = 0;  // everything comes from the SSD
  sys.cache.cpu_capacity = 0;
  // The times below are derived for one DMA per whole chunk (every row is needed, so per_chunk
  // moves exactly the needed bytes); SimGolden pins staged_gather, the default.
  sys.transfer_strategy = TransferStrategy::kPerChunk;
  PipelineOptions options;
  options.system = sys;
  options.max_in_flight = workers;
  SimExecutor ex(m, GoldenHw());
  testing::ScriptedScores scores([](const Request&, int, int, std::int64_t) { return 1.0f; });
  MemoryRunLog log;
  Pipeline p(m, options, &ex, &scores, &log);
  const std::vector<Request> requests = {Prefix128(1, 0), Prefix128(2, a2), Prefix128(3, a3)};
  std::size_t next = 0;
  ServeRequests(
      ex, p, workers,
      [&](ServeItem* item) {
        if (next == requests.size()) return false;
        item->request = requests[next++];
        return true;
      },
      [](const ServeItem&, const Status& st) { EXPECT_TRUE(st.ok()) << st.ToString(); });
  return log;
}

// What one of the measured requests does alone (SimGolden.OneLayerAsRequestFromSsd):
//   SSD: K and V reads of 16384 B + one 80 us latency wave, concurrent: 2 x 416384 B at 5 GB/s;
//   PCIe: K and V copies of 16384 B + 2 copies x 10 us, concurrent: 2 x 516384 B at 25 GB/s;
//   then the layer (1 new token over 129) and the output layer on the GPU.
constexpr double kSsdAlone = 2 * 416384 / 5e9;    // 166.5536 us
constexpr double kPcieAlone = 2 * 516384 / 25e9;  // 41.31072 us

double LayerSeconds() {
  ComputeOp layer;
  layer.kind = ComputeKind::kLayerPrefill;
  layer.layer = 0;
  layer.new_tokens = 1;
  layer.context_tokens = 129;
  return ComputeSeconds(GoldenModel(), GoldenHw(), layer);
}

double OutputSeconds() {
  ComputeOp output;
  output.kind = ComputeKind::kOutputLayer;
  output.new_tokens = 1;
  output.context_tokens = 1;
  return ComputeSeconds(GoldenModel(), GoldenHw(), output);
}

// Both measured requests arrive at t = 1 s (the store of request 1 is long done).
// One prefill at a time: request 2 runs alone, request 3 starts when it ends and runs alone.
TEST(SimConcurrencyGolden, TwoRequestsAtOnceOnePrefillQueueTheSecond) {
  const MemoryRunLog log = ServeThree(1, 1.0, 1.0);
  ASSERT_EQ(log.requests.size(), 3u);
  const double alone = kSsdAlone + kPcieAlone + LayerSeconds() + OutputSeconds();
  const RequestRecord& r2 = log.requests[1];
  const RequestRecord& r3 = log.requests[2];
  ASSERT_EQ(r2.request_id, 2u);
  ASSERT_EQ(r3.request_id, 3u);
  EXPECT_DOUBLE_EQ(r2.start_s, 1.0);
  EXPECT_NEAR(r2.ttft_s, alone, 1e-12);
  EXPECT_NEAR(r3.start_s, 1.0 + alone, 1e-12);
  EXPECT_NEAR(r3.start_s - r3.arrival_s, alone, 1e-12) << "queueing";
  EXPECT_NEAR(r3.ttft_s, alone, 1e-12);
  EXPECT_NEAR(r3.ttft_arrival_s, 2 * alone, 1e-12);
}

// Two prefills at once: both start at 1 s and do the same work side by side, so every stage is
// shared two ways: four SSD reads at 1.25 GB/s each, four copies at 6.25 GB/s each, and the
// two layer steps, then the two output steps, at half the GPU each (one core: compute is
// shared, not duplicated). Request 3 no longer queues, but each request takes twice as long:
// 2 x (SSD + PCIe + layer + output) from arrival, the same as request 3's with one prefill.
TEST(SimConcurrencyGolden, TwoRequestsAtOnceTwoPrefillsShareEveryResource) {
  const MemoryRunLog log = ServeThree(2, 1.0, 1.0);
  ASSERT_EQ(log.requests.size(), 3u);
  const double shared = 2 * (kSsdAlone + kPcieAlone + LayerSeconds() + OutputSeconds());
  for (std::size_t i : {1u, 2u}) {
    const RequestRecord& r = log.requests[i];
    SCOPED_TRACE("request " + std::to_string(r.request_id));
    EXPECT_DOUBLE_EQ(r.start_s, 1.0);
    EXPECT_DOUBLE_EQ(r.start_s - r.arrival_s, 0.0) << "no queueing";
    EXPECT_NEAR(r.ttft_s, shared, 1e-12);
    EXPECT_NEAR(r.ttft_arrival_s, shared, 1e-12);
  }
  // The layer step ran alongside the other request's: twice its time alone.
  ASSERT_EQ(log.layers.size(), 3u);
  for (std::size_t i : {1u, 2u}) {
    EXPECT_NEAR(log.layers[i].end_s - log.layers[i].start_s, 2 * LayerSeconds(), 1e-12);
  }
  // The SSD reads of both requests overlapped: each K or V read took 4 x 416384 B / 5 GB/s.
  int reads = 0;
  for (const TransferRecord& t : log.transfers) {
    if (t.request_id < 2 || t.kind != TransferKind::kSsdRead) continue;
    ++reads;
    EXPECT_NEAR(t.end_s - t.start_s, 2 * kSsdAlone, 1e-12);
  }
  EXPECT_EQ(reads, 4);
}

// Request 3 arrives when request 2's loads end: with two prefills its loads overlap request
// 2's compute (different resources, nothing shared), so it starts at its arrival and takes its
// time alone; with one it waits for request 2's compute first.
TEST(SimConcurrencyGolden, SecondPrefillOverlapsItsLoadsWithTheFirstsCompute) {
  const double io = kSsdAlone + kPcieAlone;
  const double compute = LayerSeconds() + OutputSeconds();
  ASSERT_LT(compute, io) << "the derivation below assumes request 2 computes while 3 loads";
  const double a3 = 1.0 + io;
  const MemoryRunLog one = ServeThree(1, 1.0, a3);
  ASSERT_EQ(one.requests.size(), 3u);
  EXPECT_NEAR(one.requests[2].start_s - a3, compute, 1e-12) << "queued behind 2's compute";
  EXPECT_NEAR(one.requests[2].ttft_arrival_s, compute + io + compute, 1e-12);
}

TEST(SimConcurrencyGolden, SecondPrefillOverlapsItsLoadsWithTheFirstsComputeTwoAtOnce) {
  const double io = kSsdAlone + kPcieAlone;
  const double compute = LayerSeconds() + OutputSeconds();
  const double a3 = 1.0 + io;
  const MemoryRunLog two = ServeThree(2, 1.0, a3);
  ASSERT_EQ(two.requests.size(), 3u);
  EXPECT_NEAR(two.requests[1].ttft_s, io + compute, 1e-12) << "request 2 is not slowed";
  EXPECT_NEAR(two.requests[2].start_s, a3, 1e-12);
  EXPECT_NEAR(two.requests[2].ttft_arrival_s, io + compute, 1e-12);
}

// ---- determinism ---------------------------------------------------------------------------------

// A loaded spec run (small caches, reordering, layer prefetch; requests every 0.2 ms sharing
// three prefixes) served three at a time: every request, layer, transfer and decision row.
std::string LoadedRunRows(int workers) {
  const ModelSpec m = testing::SmallOptModel();
  HardwareOptions hw;
  hw.gpu_flops = 312e12;
  SystemOptions sys;
  sys.name = "spec";
  sys.chunk_tokens = 64;
  sys.select = "itf";
  sys.prefetch = PrefetchMode::kLayer;
  sys.cache_policy = "score";
  sys.cache.gpu_capacity = 2ull << 20;
  sys.cache.cpu_capacity = 8ull << 20;
  sys.reorder = true;
  sys.reorder_interval = 1e-3;
  sys.reorder_min_accesses = 1;
  PipelineOptions options;
  options.system = sys;
  options.max_in_flight = workers;
  SimExecutor ex(m, hw);
  // A token's importance persists across requests and layers (its hash), with a smaller
  // per-request, per-layer and per-head part: the reorderer's evidence sees what packing saves
  // and repacks (importance that is noise from request to request saves nothing: no repack).
  testing::ScriptedScores scores([](const Request& r, int l, int h, std::int64_t t) {
    return float((t * 2654435761u) % 1000 + ((r.id * 40503u) ^ (l * 7u) ^ (h * 3u)) % 100);
  });
  MemoryRunLog log;
  Pipeline p(m, options, &ex, &scores, &log);
  RequestId id = 0;
  ServeRequests(
      ex, p, workers,
      [&](ServeItem* item) {
        if (id == 24) return false;
        ++id;
        Request r;
        r.id = id;
        r.arrival_s = 2e-4 * double(id);
        r.prefix.resize(std::size_t(512 + 64 * (id % 4)));
        std::iota(r.prefix.begin(), r.prefix.end(), std::uint64_t(100 * (id % 3)));
        r.query_tokens = 32;
        item->request = std::move(r);
        return true;
      },
      [](const ServeItem&, const Status& st) { EXPECT_TRUE(st.ok()) << st.ToString(); });
  std::string text;
  char buf[256];
  int overlapping = 0;
  for (std::size_t i = 0; i < log.requests.size(); ++i) {
    const RequestRecord& r = log.requests[i];
    std::snprintf(buf, sizeof buf, "R %llu %.17g %.17g %.17g %lld %lld %lld\n",
                  (unsigned long long)r.request_id, r.start_s, r.end_s, r.ttft_arrival_s,
                  (long long)r.reused_tokens, (long long)r.gpu_hit_chunks,
                  (long long)r.ssd_read_bytes);
    text += buf;
    for (std::size_t j = 0; j < log.requests.size(); ++j) {
      if (j != i && log.requests[j].start_s < r.start_s && r.start_s < log.requests[j].end_s) {
        ++overlapping;
        break;
      }
    }
  }
  for (const LayerRecord& l : log.layers) {
    std::snprintf(buf, sizeof buf, "L %llu %d %.17g %.17g\n", (unsigned long long)l.request_id,
                  l.layer, l.start_s, l.end_s);
    text += buf;
  }
  for (const TransferRecord& t : log.transfers) {
    std::snprintf(buf, sizeof buf, "T %llu %d %d %d %llu %.17g %.17g\n",
                  (unsigned long long)t.request_id, t.layer, int(t.kind), int(t.purpose),
                  (unsigned long long)t.bytes, t.start_s, t.end_s);
    text += buf;
  }
  for (const DecisionRecord& d : log.decisions) {
    text += "D " + std::to_string(d.request_id) + " " + std::to_string(d.layer) + " " + d.kind +
            " " + std::to_string(d.chunk) + " " + d.detail + "\n";
  }
  text += "overlapping " + std::to_string(overlapping) + " requests " +
          std::to_string(log.requests.size()) + "\n";
  return text;
}

TEST(SimConcurrency, ThreePrefillsAtOnceAreDeterministic) {
  const std::string a = InChildText([] { return LoadedRunRows(3); });
  const std::string b = InChildText([] { return LoadedRunRows(3); });
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("requests 24\n"), std::string::npos);
  // The run is loaded enough that requests really overlap (else the test proves little).
  const std::size_t at = a.find("overlapping ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stoi(a.substr(at + 12)), 4) << a.substr(at);
  // Reordering ran (a pass repacks segments other requests may be reading: they are skipped).
  EXPECT_NE(a.find(" reorder "), std::string::npos);
}

// The same loaded run one prefill at a time: nothing overlaps, and the mean TTFT from arrival
// is higher than with three at once.
TEST(SimConcurrency, MorePrefillsCutTheQueueingOfALoadedRun) {
  auto mean_arrival_ttft = [](const std::string& rows) {
    double sum = 0;
    int n = 0;
    std::size_t pos = 0;
    while ((pos = rows.find("R ", pos)) != std::string::npos) {
      if (pos > 0 && rows[pos - 1] != '\n') {
        ++pos;
        continue;
      }
      unsigned long long id;
      double start, end, ttft_arrival;
      if (std::sscanf(rows.c_str() + pos, "R %llu %lg %lg %lg", &id, &start, &end,
                      &ttft_arrival) == 4) {
        sum += ttft_arrival;
        ++n;
      }
      ++pos;
    }
    return n > 0 ? sum / n : -1;
  };
  const std::string one = InChildText([] { return LoadedRunRows(1); });
  const std::string three = InChildText([] { return LoadedRunRows(3); });
  EXPECT_NE(one.find("overlapping 0 "), std::string::npos);
  EXPECT_LT(mean_arrival_ttft(three), mean_arrival_ttft(one));
}

}  // namespace
}  // namespace kvtier::sim
