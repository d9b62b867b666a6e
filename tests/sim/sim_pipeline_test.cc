// Sanity of the simulated model on small configurations, parity of decisions between the
// SimGrid executor and the FakeExecutor, and determinism. SimGrid allows one engine per
// process, so tests that compare several simulations run each in a forked child.

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>

#include "analysis/results_db.h"
#include "core/pipeline.h"
#include "models/cost_model.h"
#include "sim/sim_executor.h"
#include "sim/simulate.h"
#include "tests/sim/sim_testutil.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"
#include "traces/generator.h"

namespace kvtier::sim {
namespace {

using kvtier::testing::FakeExecutor;
using kvtier::testing::ScriptedScores;

ModelSpec Model() { return kvtier::testing::SmallOptModel(); }

HardwareOptions Hw() {
  HardwareOptions h;  // the paper's A100 + PCIe 4.0 + 5 GB/s NVMe defaults
  h.gpu_flops = 312e12;
  h.gpu_efficiency = 0.6;
  return h;
}

SystemOptions System(const std::string& name) {
  SystemOptions s;
  s.name = name;
  s.chunk_tokens = 64;
  s.retention = 0.25;
  s.itf_options.retention = 0.25;
  s.cache.gpu_capacity = 0;
  s.cache.cpu_capacity = 0;
  if (name == "recomp") s.schedule = "recompute";
  if (name == "as") s.prefetch = PrefetchMode::kLayer;
  if (name == "as_h2o_lfu") s.select = "h2o", s.prefetch = PrefetchMode::kLayer,
                            s.cache_policy = "lfu";
  if (name == "spec") s.select = "itf", s.prefetch = PrefetchMode::kLayer,
                      s.cache_policy = "score";
  return s;
}

Request Prefix(RequestId id, std::int64_t tokens, std::uint64_t base, std::int64_t query = 32) {
  Request r;
  r.id = id;
  r.prefix.resize(std::size_t(tokens));
  std::iota(r.prefix.begin(), r.prefix.end(), base);
  r.query_tokens = query;
  return r;
}

// Heads agree; importance falls with the token index (ITF passes).
float Agreeing(const Request&, int, int, std::int64_t t) { return 1.0f / float(t + 1); }

// Runs `fn` in a forked child and returns the doubles it returns (one SimGrid engine each).
std::vector<double> InChild(const std::function<std::vector<double>()>& fn) {
  const std::string bytes = testing::InChildText([&] {
    const std::vector<double> v = fn();
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double));
  });
  std::vector<double> out(bytes.size() / sizeof(double));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(double));
  return out;
}

// TTFT of the second of two requests with the same prefix (the first stores it), for each
// prefix length; and SSD bytes of those second requests.
std::vector<double> ReuseTtfts(const std::string& system, const std::vector<std::int64_t>& lens,
                               bool ssd_bytes = false) {
  ModelSpec m = Model();
  SimExecutor ex(m, Hw());
  ScriptedScores scores(Agreeing);
  MemoryRunLog log;
  PipelineOptions o;
  o.system = System(system);
  Pipeline p(m, o, &ex, &scores, &log);
  ex.Run([&] {
    RequestId id = 1;
    for (std::size_t i = 0; i < lens.size(); ++i) {
      const std::uint64_t base = 1000000 * (i + 1);
      p.Run(Prefix(id++, lens[i], base));
      p.Finish();
      ex.Drain();  // the store finishes before the measured request
      p.Run(Prefix(id++, lens[i], base));
      ex.Drain();
    }
    p.Finish();
  });
  std::vector<double> out;
  for (std::size_t i = 1; i < log.requests.size(); i += 2) {
    out.push_back(ssd_bytes ? double(log.requests[i].ssd_read_bytes) : log.requests[i].ttft_s);
  }
  return out;
}

TEST(SimSanity, RecomputeGrowsSuperlinearlyAndSsdLoadingLinearly) {
  const std::vector<std::int64_t> lens = {1024, 2048, 4096, 8192};
  std::vector<double> recomp = InChild([&] { return ReuseTtfts("recomp", lens); });
  std::vector<double> as = InChild([&] { return ReuseTtfts("as", lens); });
  ASSERT_EQ(recomp.size(), 4u);
  ASSERT_EQ(as.size(), 4u);
  // Recompute: attention is quadratic, so doubling the prefix more than doubles the time.
  EXPECT_GT(recomp[3] / recomp[2], 2.0);
  EXPECT_GT(recomp[3] / recomp[0], 8.0 * 1.05);
  // Full loading from the SSD (caches off): bytes are linear, so time doubles within 10% once
  // the prefix dominates. At 1K tokens the per-layer costs that do not grow with the prefix
  // (staged_gather's one DMA per kind, the query's compute) are a visible share: 2.79 -> 4.89 ms
  // (x1.75), then x1.97 and x1.98.
  EXPECT_GT(as[1] / as[0], 1.5);
  for (int i = 2; i < 4; ++i) {
    EXPECT_NEAR(as[i] / as[i - 1], 2.0, 0.2) << "prefix " << lens[std::size_t(i)];
  }
}

TEST(SimSanity, WarmGpuCacheBeatsRecompute) {
  std::vector<double> r = InChild([] {
    ModelSpec m = Model();
    SimExecutor ex(m, Hw());
    ScriptedScores scores(Agreeing);
    MemoryRunLog log;
    PipelineOptions o;
    o.system = System("as");
    o.system.cache.gpu_capacity = 8ull << 30;
    Pipeline p(m, o, &ex, &scores, &log);
    ex.Run([&] {
      p.Prewarm(Prefix(1, 4096, 7));
      p.Run(Prefix(2, 4096, 7));
      p.Finish();
    });
    return std::vector<double>{log.requests[0].ttft_s, double(log.requests[0].ssd_read_bytes),
                               double(log.requests[0].gpu_hit_chunks)};
  });
  const double recompute = PrefixRecomputeSeconds(Model(), Hw(), 4096 + 32);
  EXPECT_EQ(r[1], 0.0) << "nothing read from the SSD";
  EXPECT_EQ(r[2], 64.0 * 4 * 2) << "every K and V chunk of every layer hits the GPU";
  EXPECT_LT(r[0], recompute);
}

TEST(SimSanity, SpecReadsLessThanH2oWhichReadsLessThanAs) {
  const std::vector<std::int64_t> lens = {4096};
  double as = InChild([&] { return ReuseTtfts("as", lens, true); }).at(0);
  double h2o = InChild([&] { return ReuseTtfts("as_h2o_lfu", lens, true); }).at(0);
  double spec = InChild([&] { return ReuseTtfts("spec", lens, true); }).at(0);
  EXPECT_LT(spec, h2o);
  EXPECT_LT(h2o, as);
}

// With ITF passing, identifying the important tokens reads the probe heads' keys instead of
// every head's: key bytes for identification fall by kv_heads / probe_heads (8 / 3 here).
TEST(SimSanity, ItfCutsIdentificationKeyBytesByHeadsOverProbeHeads) {
  std::vector<double> r = InChild([] {
    ModelSpec m = Model();
    SimExecutor ex(m, Hw());
    ScriptedScores scores(Agreeing);
    MemoryRunLog log;
    PipelineOptions o;
    o.system = System("spec");
    o.system.prefetch = PrefetchMode::kNone;
    Pipeline p(m, o, &ex, &scores, &log);
    ex.Run([&] {
      p.Run(Prefix(1, 4096, 3));
      p.Run(Prefix(2, 4096, 3));
      p.Finish();
    });
    double probe = 0;
    for (const auto& t : log.transfers) {
      if (t.request_id == 2 && t.purpose == Purpose::kProbe && t.kind == TransferKind::kSsdRead) {
        probe += double(t.bytes);
      }
    }
    return std::vector<double>{probe};
  });
  const ModelSpec m = Model();
  const double all_keys = 4096.0 * double(m.KBytesPerTokenLayer()) * m.layers;
  EXPECT_DOUBLE_EQ(all_keys / r[0], 8.0 / 3.0);
}

// The same requests through SimGrid and the FakeExecutor give identical decision rows: the
// pipeline's decisions never depend on the executor.
TEST(SimParity, SameDecisionsAsFakeExecutor) {
  auto run = [](Executor* ex, std::function<void(std::function<void()>)> drive) {
    ModelSpec m = Model();
    ScriptedScores scores([](const Request& r, int l, int h, std::int64_t t) {
      return float(((t * 2654435761u) ^ (r.id * 40503u) ^ (l * 7u) ^ (h * 3u)) % 1000);
    });
    MemoryRunLog log;
    PipelineOptions o;
    o.system = System("spec");
    o.system.cache.gpu_capacity = 4ull << 20;
    o.system.cache.cpu_capacity = 16ull << 20;
    // Reordering runs on executor time, so its passes are timing-dependent decisions
    // (logged as such); parity is about everything else.
    o.system.reorder = false;
    Pipeline p(m, o, ex, &scores, &log);
    drive([&] {
      for (RequestId id = 1; id <= 12; ++id) {
        p.Run(Prefix(id, 512 + 64 * std::int64_t(id % 4), 100 * (id % 3)));
      }
      p.Finish();
    });
    return log.decisions;
  };
  std::vector<DecisionRecord> fake_rows;
  {
    FakeExecutor fake({});
    fake_rows = run(&fake, [](std::function<void()> body) { body(); });
  }
  auto text = [](const std::vector<DecisionRecord>& rows) {
    std::string t;
    for (const auto& d : rows) {
      t += std::to_string(d.request_id) + "|" + std::to_string(d.layer) + "|" + d.kind + "|" +
           std::to_string(d.chunk) + "|" + d.detail + "\n";
    }
    return t;
  };
  // The SimGrid run in a child process (one engine per process), its decisions as text.
  const std::string sim_text = testing::InChildText([&] {
    SimExecutor ex(Model(), Hw());
    return text(run(&ex, [&](std::function<void()> body) { ex.Run(body); }));
  });
  const std::string fake_text = text(fake_rows);
  EXPECT_GT(fake_rows.size(), 20u);
  EXPECT_NE(fake_text.find("|itf|"), std::string::npos);
  EXPECT_EQ(sim_text, fake_text);
}

// spec_cake (Cake's schedule, rows from the importance history) makes the same decisions
// through SimGrid and the FakeExecutor where its meeting point is not close: I/O a million
// times faster than the GPU in both, so every Cake chunk but the first is loaded (which chunks,
// which rows and every cache move follow from the history and the caches, never the executor).
TEST(SimParity, SpecCakeSameDecisionsAsFakeExecutor) {
  auto run = [](Executor* ex, std::function<void(std::function<void()>)> drive) {
    ModelSpec m = Model();
    ScriptedScores scores([](const Request& r, int l, int h, std::int64_t t) {
      return float(((t * 2654435761u) ^ (r.id * 40503u) ^ (l * 7u) ^ (h * 3u)) % 1000);
    });
    MemoryRunLog log;
    PipelineOptions o;
    o.system = System("spec_cake");
    o.system.schedule = "cake";
    o.system.select = "history";
    o.system.cache_policy = "score";
    o.system.cake_chunk_tokens = 128;
    o.system.cache.gpu_capacity = 4ull << 20;
    o.system.cache.cpu_capacity = 16ull << 20;
    Pipeline p(m, o, ex, &scores, &log);
    drive([&] {
      for (RequestId id = 1; id <= 12; ++id) {
        p.Run(Prefix(id, 512 + 64 * std::int64_t(id % 4), 100 * (id % 3)));
      }
      p.Finish();
    });
    return log.decisions;
  };
  auto text = [](const std::vector<DecisionRecord>& rows) {
    std::string t;
    for (const auto& d : rows) {
      t += std::to_string(d.request_id) + "|" + std::to_string(d.layer) + "|" + d.kind + "|" +
           std::to_string(d.chunk) + "|" + d.detail + "\n";
    }
    return t;
  };
  kvtier::testing::FakeExecutorOptions fo;
  fo.ssd_read_bw = fo.ssd_write_bw = fo.h2d_bw = fo.d2h_bw = fo.gather_bw = 1e18;
  fo.compute_s = 1;
  FakeExecutor fake(fo);
  const std::string fake_text = text(run(&fake, [](std::function<void()> body) { body(); }));
  const std::string sim_text = testing::InChildText([&] {
    HardwareOptions hw = Hw();
    hw.gpu_flops = 1e9;  // a 128-token chunk of this model: seconds
    hw.ssd_read_bw = hw.ssd_write_bw = hw.pcie_h2d_bw = hw.pcie_d2h_bw = hw.cpu_gather_bw = 1e15;
    hw.ssd_latency = hw.pcie_latency = 0;
    SimExecutor ex(Model(), hw);
    return text(run(&ex, [&](std::function<void()> body) { ex.Run(body); }));
  });
  // Every meeting is far from close: the GPU computed the first chunk, I/O loaded the rest.
  int meets = 0;
  for (std::size_t at = 0; (at = fake_text.find("|cake_meet|", at)) != std::string::npos; ++at) {
    ++meets;
    EXPECT_EQ(fake_text.compare(at, 25, "|cake_meet|0|computed 1 l"), 0)
        << fake_text.substr(at, 40);
  }
  EXPECT_GE(meets, 9);  // the requests that reused a prefix
  EXPECT_NE(fake_text.find("|admit|"), std::string::npos);
  EXPECT_EQ(sim_text, fake_text);
}

// ssd.write_lanes against no limit on a backlog: a conversation of 30 turns
// served back to back, each reusing the last turn's prefix from the SSD and storing 2,048 new
// tokens (16 MiB at the 0.5 GB/s background cap: 34 ms, far longer than a turn's prefill), so
// the stores pile up. With at most 1 or 4 stores running at once (the rest in FIFO order) the
// foreground reads share the device with the same background total (the cap binds whether one
// or thirty stores run), so every request's decisions are the same and its times agree to
// rounding; what moves is when each store ends (FIFO, not all at once), and the last store ends
// when all of them ended before. Returns per request: ttft, ssd_read_bytes, gpu/cpu/ssd chunks;
// then every store's end; then the simulated end.
// The 30-turn backlog through `system`: its log and simulated end. poll: the Pipeline drives the
// executor through an ExecutorWrapper, which keeps no completion notices, so it polls Done.
// after(id) runs after request `id`.
double RunBacklog(const std::string& system, int write_lanes, bool poll, MemoryRunLog* log,
                  const std::function<void(RequestId)>& after = {}) {
  ModelSpec m = Model();
  HardwareOptions hw = Hw();
  hw.ssd_background_share = 0.25;
  hw.ssd_write_lanes = write_lanes;
  SimExecutor ex(m, hw);
  ExecutorWrapper polled(&ex);
  ScriptedScores scores([](const Request& r, int l, int h, std::int64_t t) {
    return float(((t * 2654435761u) ^ (r.id * 40503u) ^ (l * 7u) ^ (h * 3u)) % 1000);
  });
  PipelineOptions o;
  o.system = System(system);
  o.system.cache.gpu_capacity = 8ull << 20;
  o.system.cache.cpu_capacity = 32ull << 20;
  Pipeline p(m, o, poll ? static_cast<Executor*>(&polled) : &ex, &scores, log);
  ex.Run([&] {
    for (RequestId id = 1; id <= 30; ++id) {
      ASSERT_TRUE(p.Run(Prefix(id, 2048 * std::int64_t(id), 7)).ok());
      if (after) after(id);
    }
    ASSERT_TRUE(p.Finish().ok());
  });
  return ex.Now();
}

std::vector<double> BacklogRun(const std::string& system, int write_lanes) {
  MemoryRunLog log;
  const double end = RunBacklog(system, write_lanes, false, &log);
  std::vector<double> out;
  for (const RequestRecord& r : log.requests) {
    out.insert(out.end(), {r.ttft_s, double(r.ssd_read_bytes), double(r.gpu_hit_chunks),
                           double(r.cpu_hit_chunks), double(r.ssd_read_chunks)});
  }
  for (const TransferRecord& t : log.transfers) {
    if (t.purpose == Purpose::kStore && t.kind == TransferKind::kSsdWrite) out.push_back(t.end_s);
  }
  out.push_back(end);
  return out;
}

TEST(SimWriteLanes, ForegroundMatchesTheUnlimitedShareUnderABacklog) {
  for (const auto& [system, lanes] : std::vector<std::pair<std::string, int>>{
           {"as", 1}, {"as", 4}, {"spec", 1}, {"spec", 4}}) {
    SCOPED_TRACE(system + " with " + std::to_string(lanes) + " write lanes");
    const std::vector<double> exact = InChild([&] { return BacklogRun(system, 0); });
    const std::vector<double> fifo = InChild([&] { return BacklogRun(system, lanes); });
    ASSERT_EQ(exact.size(), fifo.size()) << system;
    ASSERT_EQ(exact.size(), 30u * 5 + 30 + 1) << system;
    double mean_exact = 0, mean_fifo = 0;
    for (std::size_t i = 0; i < 30; ++i) {
      const double a = exact[5 * i], b = fifo[5 * i];
      EXPECT_NEAR(a, b, 1e-9 * a) << system << " request " << i + 1 << " ttft";
      mean_exact += a / 30, mean_fifo += b / 30;
      for (std::size_t k = 1; k < 5; ++k) {
        EXPECT_EQ(exact[5 * i + k], fifo[5 * i + k]) << system << " request " << i + 1;
      }
    }
    EXPECT_NEAR(mean_exact, mean_fifo, 1e-9 * mean_exact) << system;
    // The stores: the backlog is real (the exact path's last store ends long after the last
    // request), they end at other times one by one, and the last one at the same time.
    std::size_t moved = 0;
    for (std::size_t i = 150; i < 180; ++i) moved += std::abs(exact[i] - fifo[i]) > 1e-6;
    EXPECT_GT(moved, 10u) << system;
    EXPECT_GT(exact.back(), 2 * exact[150]) << system;
    EXPECT_NEAR(exact.back(), fifo.back(), 1e-9 * exact.back()) << system;
    EXPECT_NEAR(*std::max_element(exact.begin() + 150, exact.begin() + 180),
                *std::max_element(fifo.begin() + 150, fifo.begin() + 180), 1e-9 * exact.back())
        << system;
  }
}

// The background transfers are found done through the executor's completion notices
// (Executor::Watch/TakeDone) instead of a Done poll of each before every request: the same
// transfers must be retired and logged at the same points, in the same order, with the same
// times. The backlog run above, through SimExecutor itself (notices) and through an
// ExecutorWrapper (which keeps none: the Pipeline polls), every transfer record and request
// compared bit for bit.
std::string BacklogLog(const std::string& system, int write_lanes, bool poll) {
  MemoryRunLog log;
  std::size_t stores_before_last = 0;
  const double end_s = RunBacklog(system, write_lanes, poll, &log, [&](RequestId id) {
    if (id != 29) return;
    for (const TransferRecord& t : log.transfers) {
      stores_before_last += t.purpose == Purpose::kStore && t.kind == TransferKind::kSsdWrite;
    }
  });
  std::string out;
  char line[256];
  // Some stores were retired between requests (not all at Finish), or this compares little.
  std::snprintf(line, sizeof line, "stores retired before the last request: %s\n",
                stores_before_last > 0 ? "some" : "none");
  out += line;
  for (const TransferRecord& t : log.transfers) {
    std::snprintf(line, sizeof line, "%llu %d %d %d %llu %u %a %a %a\n",
                  static_cast<unsigned long long>(t.request_id), t.layer, int(t.kind),
                  int(t.purpose), static_cast<unsigned long long>(t.bytes), t.ios, t.submit_s,
                  t.start_s, t.end_s);
    out += line;
  }
  for (const RequestRecord& r : log.requests) {
    std::snprintf(line, sizeof line, "request %a %llu\n", r.ttft_s,
                  static_cast<unsigned long long>(r.ssd_read_bytes));
    out += line;
  }
  std::snprintf(line, sizeof line, "end %a\n", end_s);
  return out + line;
}

TEST(SimBackgroundNotices, RetireTheSameTransfersInTheSameOrderAsPolling) {
  for (const auto& [system, lanes] : std::vector<std::pair<std::string, int>>{
           {"as", 1}, {"as", 0}, {"spec", 1}, {"spec", 4}}) {
    SCOPED_TRACE(system + " with " + std::to_string(lanes) + " write lanes");
    const std::string notices = testing::InChildText([&] { return BacklogLog(system, lanes, false); });
    const std::string polled = testing::InChildText([&] { return BacklogLog(system, lanes, true); });
    EXPECT_EQ(notices.rfind("stores retired before the last request: some\n", 0), 0u);
    EXPECT_GT(notices.size(), 1000u);
    EXPECT_EQ(notices, polled);
  }
}

}  // namespace
}  // namespace kvtier::sim
