// Pipeline contracts, over FakeExecutor (scripted FIFO resources) and ScriptedScores.

#include "core/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <numeric>
#include <random>
#include <tuple>

#include "core/request_run.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"
#include "tests/testutil/tiny_model.h"

namespace kvtier {
namespace {

using testing::Agreeing;  // every head ranks tokens the same way: ITF passes
using testing::FakeExecutor;
using testing::FakeExecutorOptions;
using testing::ScriptedScores;
using testing::TinyModel;  // K (or V) of one token in one layer: 4 heads * 4 * 2 = 32 B

SystemOptions System(const std::string& name) {
  SystemOptions s;
  s.name = name;
  s.chunk_tokens = 4;
  s.retention = 0.25;
  s.itf_options.retention = 0.25;
  s.itf_options.probe_heads = 3;
  s.cache.gpu_capacity = 0;
  s.cache.cpu_capacity = 0;
  if (name == "recomp") s.schedule = "recompute";
  if (name == "as") s.prefetch = PrefetchMode::kLayer;
  if (name == "as_h2o_lfu") {
    s.select = "h2o";
    s.prefetch = PrefetchMode::kLayer;
    s.cache_policy = "lfu";
  }
  if (name == "impress" || name == "spec") {
    s.select = "itf";
    s.reorder = true;
    s.cache_policy = "score";
    s.prefetch = name == "spec" ? PrefetchMode::kLayer : PrefetchMode::kNone;
  }
  if (name == "cake") s.schedule = "cake";
  return s;
}

Request MakeRequest(RequestId id, std::int64_t prefix_tokens, std::int64_t query) {
  Request r;
  r.id = id;
  r.prefix.resize(std::size_t(prefix_tokens));
  std::iota(r.prefix.begin(), r.prefix.end(), 1000);
  r.query_tokens = query;
  return r;
}

// The first tokens matter most, identically in every head and layer.
float Stable(const Request&, int, int, std::int64_t t) { return float(1000 - t); }
// Each head prefers a different quarter of the prefix (disagreeing probes -> fallback).
float Disagreeing(const Request&, int, int head, std::int64_t t) {
  return (t % 4) == head ? 10.0f + float(t % 7) : float(t % 3) * 0.01f;
}

struct Harness {
  Harness(const ModelSpec& model, const SystemOptions& system, ScriptedScores::Fn scores,
          FakeExecutorOptions exec = {})
      : executor(std::move(exec)), source(std::move(scores)) {
    PipelineOptions options;
    options.system = system;
    pipeline = std::make_unique<Pipeline>(model, options, &executor, &source, &log);
  }
  FakeExecutor executor;
  ScriptedScores source;
  MemoryRunLog log;
  std::unique_ptr<Pipeline> pipeline;

  std::vector<TransferRecord> TransfersOf(RequestId id) const {
    std::vector<TransferRecord> out;
    for (const auto& t : log.transfers) {
      if (t.request_id == id) out.push_back(t);
    }
    return out;
  }
};

TEST(PipelineTest, RecompReadsNothing) {
  Harness h(TinyModel(3), System("recomp"), Agreeing);
  for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(h.pipeline->Run(MakeRequest(id, 64, 8)).ok());
  h.pipeline->Finish();
  EXPECT_TRUE(h.log.transfers.empty());
  ASSERT_EQ(h.log.requests.size(), 3u);
  for (const auto& r : h.log.requests) {
    EXPECT_EQ(r.reused_tokens, 0);
    EXPECT_EQ(r.ssd_read_bytes, 0u);
    EXPECT_EQ(r.pcie_h2d_bytes, 0u);
  }
  // Three layers and the output layer per request; every compute sees the whole prefix.
  int computes = 0;
  for (const auto& s : h.executor.history()) {
    if (s.is_transfer) continue;
    ++computes;
    if (s.compute.kind == ComputeKind::kLayerPrefill) {
      EXPECT_EQ(s.compute.context_tokens, 72);
    }
  }
  EXPECT_EQ(computes, 3 * 4);
}

TEST(PipelineTest, AsLoadsEveryKeyAndValueFromSsd) {
  const ModelSpec model = TinyModel(2);
  Harness h(model, System("as"), Agreeing);
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(1, 64, 8)).ok());
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(2, 64, 8)).ok());
  h.pipeline->Finish();
  const RequestRecord& second = h.log.requests[1];
  EXPECT_EQ(second.reused_tokens, 64);
  // 64 tokens * 32 B * (K + V) * 2 layers, all from SSD (caches are disabled).
  EXPECT_EQ(second.ssd_read_bytes, 64u * 32 * 2 * 2);
  EXPECT_EQ(second.pcie_h2d_bytes, 64u * 32 * 2 * 2);
  EXPECT_EQ(second.ssd_read_chunks, 16 * 2 * 2);
}

TEST(PipelineTest, H2oLoadsAllKeysButOnlyImportantValues) {
  const ModelSpec model = TinyModel(1);
  Harness h(model, System("as_h2o_lfu"), Agreeing);
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(1, 64, 8)).ok());
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(2, 64, 8)).ok());
  h.pipeline->Finish();
  Bytes h2d = 0;
  for (const auto& t : h.TransfersOf(2)) {
    if (t.kind == TransferKind::kH2D && t.purpose == Purpose::kDemand) h2d += t.bytes;
  }
  // All keys (64 * 32 B) plus k = 16 value rows per head (16 * 4 heads * 8 B).
  EXPECT_EQ(h2d, 64u * 32 + 16u * 4 * 8);
}

// With ITF falling back, a layer loads every head's keys (SPEC §IV-B, Fig. 9); passing, it
// loads the probe heads' keys and then K and V rows of the voted tokens only.
TEST(PipelineTest, ItfFallbackLoadsEveryHeadsKeys) {
  const ModelSpec model = TinyModel(1);
  auto run = [&](ScriptedScores::Fn fn) {
    Harness h(model, System("impress"), fn);
    EXPECT_TRUE(h.pipeline->Run(MakeRequest(1, 64, 8)).ok());
    EXPECT_TRUE(h.pipeline->Run(MakeRequest(2, 64, 8)).ok());
    h.pipeline->Finish();
    Bytes h2d = 0;
    for (const auto& t : h.TransfersOf(2)) {
      if (t.kind == TransferKind::kH2D && t.purpose != Purpose::kPromote) h2d += t.bytes;
    }
    return std::make_tuple(h.log.requests[1], h.log.layers.back(), h2d);
  };
  auto [pass, pass_layer, pass_h2d] = run(Stable);
  auto [fallback, fallback_layer, fallback_h2d] = run(Disagreeing);
  EXPECT_FALSE(pass_layer.itf_fallback);
  EXPECT_TRUE(fallback_layer.itf_fallback);
  EXPECT_EQ(pass.itf_fallback_layers, 0);
  EXPECT_EQ(fallback.itf_fallback_layers, 1);
  const Bytes probe_rows = 64u * 3 * 8;  // 64 tokens x 3 probe heads x 8 B
  const Bytes k = 16;                    // 25% of 64
  EXPECT_EQ(pass_h2d, probe_rows + k * 32 + k * 32);          // K and V of voted rows
  EXPECT_EQ(fallback_h2d, probe_rows + 64u * 32 + k * 4 * 8);  // all keys, per-head values
  // The voted tokens are the first 16: 4 of 16 chunks for K and for V, plus every probe chunk.
  EXPECT_EQ(pass.ssd_read_bytes, probe_rows + 4u * 128 * 2);
  EXPECT_EQ(fallback.ssd_read_bytes, probe_rows + 64u * 32 + 64u * 32);
}

// SPEC §IV-C: layer l+1's prefetch is submitted while layer l computes, not after.
TEST(PipelineTest, SpecPrefetchesNextLayerBeforeCurrentComputeEnds) {
  const ModelSpec model = TinyModel(4);
  FakeExecutorOptions exec;
  exec.compute_s = 5e-3;
  Harness h(model, System("spec"), Stable, exec);
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(1, 64, 8)).ok());
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(2, 64, 8)).ok());
  h.pipeline->Finish();
  std::vector<LayerRecord> layers;
  for (const auto& l : h.log.layers) {
    if (l.request_id == 2) layers.push_back(l);
  }
  ASSERT_EQ(layers.size(), 4u);
  for (int l = 0; l + 1 < 4; ++l) {
    Seconds first_prefetch = 1e9;
    for (const auto& t : h.TransfersOf(2)) {
      if (t.purpose == Purpose::kPrefetch && t.layer == l + 1) {
        first_prefetch = std::min(first_prefetch, t.submit_s);
      }
    }
    EXPECT_LT(first_prefetch, layers[std::size_t(l)].end_s) << "layer " << l;
  }
  // With agreeing heads every layer keeps the same tokens, so every prefetched chunk is used.
  EXPECT_GT(h.pipeline->totals().prefetched_chunks, 0);
  EXPECT_EQ(h.pipeline->totals().prefetch_used_chunks, h.pipeline->totals().prefetched_chunks);
}

TEST(PipelineTest, ImpressDoesNotOverlapIoAcrossLayers) {
  const ModelSpec model = TinyModel(3);
  Harness h(model, System("impress"), Agreeing);
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(1, 64, 8)).ok());
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(2, 64, 8)).ok());
  h.pipeline->Finish();
  std::vector<LayerRecord> layers;
  for (const auto& l : h.log.layers) {
    if (l.request_id == 2) layers.push_back(l);
  }
  for (const auto& t : h.TransfersOf(2)) {
    if (t.layer >= 1 && t.purpose != Purpose::kPromote && t.purpose != Purpose::kDemote) {
      EXPECT_GE(t.start_s, layers[std::size_t(t.layer - 1)].end_s) << "layer " << t.layer;
    }
  }
}

// Cake (Appendix A): compute of chunk i costs i+1 units (later chunks attend to more), loading
// any chunk costs 3 units. I/O loads 7, 6, 5 (done at 3, 6, 9) and starts 4 at 9; compute does
// 0..3 by 10, and chunk 4 is not in memory yet, so the GPU computes it (10..15) and its load is
// abandoned: they meet after computing 5 and loading 3 of 8 chunks, at 15 units (compute-only
// would take 1+2+...+8 = 36, load-only 8 * 3 = 24).
TEST(PipelineTest, CakeMeetsWhereComputeAndLoadRatesSay) {
  ModelSpec model = TinyModel(2);
  const std::int64_t C = 16;
  SystemOptions sys = System("cake");
  sys.cake_chunk_tokens = int(C);
  const Bytes chunk_bytes = Bytes(C) * model.KvBytesPerToken();
  FakeExecutorOptions exec;
  exec.ssd_read_bw = double(chunk_bytes) / 3.0;  // one chunk's KV (all layers) in 3 s
  exec.h2d_bw = 1e18;
  exec.ssd_write_bw = 1e18;  // request 1's background store must not delay request 2
  exec.d2h_bw = 1e18;
  exec.compute = [C](const ComputeOp& op) -> Seconds {
    if (op.kind == ComputeKind::kChunkPrefill) {
      return double(op.new_tokens) * double(op.context_tokens) / double(C * C);
    }
    return 0;
  };
  Harness h(model, sys, Agreeing, exec);
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(1, 8 * C, 0)).ok());
  ASSERT_TRUE(h.pipeline->Run(MakeRequest(2, 8 * C, 0)).ok());
  h.pipeline->Finish();
  std::string meet;
  for (const auto& d : h.log.decisions) {
    if (d.request_id == 2 && d.kind == "cake_meet") meet = d.detail;
  }
  EXPECT_EQ(meet, "computed 5 loaded 3 of 8");
  EXPECT_NEAR(h.log.requests[1].ttft_s, 15.0, 1e-9);
}

// spec_cake: Cake's schedule with the history selector (retention 0.25), costs as in Cake's
// test but loading a whole Cake chunk (all layers' K and V) takes 2.8 units. Request 1 stores
// the prefix; request 2 reuses it with no history yet, so it loads every row as Cake does:
// loads of 7, 6, 5 end at 2.8, 5.6, 8.4, load 4 starts at 8.4; compute does chunks 0..3 by 10
// (1+2+3+4), takes chunk 4 (10..15) and abandons its load: "computed 5 loaded 3 of 8" at 15.
// Request 2's attention (Stable: earlier tokens matter more) leaves a history in which the
// first quarter of R was kept by every layer and the rest by none: each Cake chunk of request
// 3 then keeps its first 4 of 16 tokens by history (ties -> the earlier token), one stored
// 4-token chunk per layer and kind, a quarter of the bytes: 0.7 units. Loads of 7..3 end at
// 0.7, 1.4, 2.1, 2.8, 3.5; compute does chunk 0 (0..1), 1 (1..3) and 2 (3..6), when chunk 3
// is loaded: "computed 3 loaded 5 of 8" at 6. Request 3's own scores rank the other way
// (later tokens first): the rows come from the history, never from the request's query.
TEST(PipelineTest, SpecCakeMeetsWhereTheHistoryShrinksItsLoads) {
  ModelSpec model = TinyModel(2);
  const std::int64_t C = 16;
  SystemOptions sys = System("cake");
  sys.select = "history";
  sys.cache_policy = "score";
  sys.cake_chunk_tokens = int(C);
  const Bytes chunk_bytes = Bytes(C) * model.KvBytesPerToken();
  FakeExecutorOptions exec;
  exec.ssd_read_bw = double(chunk_bytes) / 2.8;
  exec.h2d_bw = 1e18;
  exec.ssd_write_bw = 1e18;
  exec.d2h_bw = 1e18;
  exec.gather_bw = 1e18;
  exec.compute = [C](const ComputeOp& op) -> Seconds {
    if (op.kind == ComputeKind::kChunkPrefill) {
      return double(op.new_tokens) * double(op.context_tokens) / double(C * C);
    }
    return 0;
  };
  auto scores = [](const Request& r, int, int, std::int64_t t) {
    return r.id == 3 ? float(t) : float(1000 - t);
  };
  Harness h(model, sys, scores, exec);
  for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(h.pipeline->Run(MakeRequest(id, 8 * C, 0)).ok());
  h.pipeline->Finish();
  std::map<RequestId, std::string> meet;
  for (const auto& d : h.log.decisions) {
    if (d.kind == "cake_meet") meet[d.request_id] = d.detail;
  }
  EXPECT_EQ(meet[2], "computed 5 loaded 3 of 8");
  EXPECT_EQ(meet[3], "computed 3 loaded 5 of 8");
  ASSERT_EQ(h.log.requests.size(), 3u);
  EXPECT_NEAR(h.log.requests[1].ttft_s, 15.0, 1e-9);
  EXPECT_NEAR(h.log.requests[2].ttft_s, 6.0, 1e-9);
  // Request 3 read the first stored chunk of each of the five Cake chunks it loaded.
  EXPECT_EQ(h.log.requests[2].ssd_read_bytes, 5 * chunk_bytes / 4);
  for (const auto& s : h.executor.history()) {
    if (!s.is_transfer || s.transfer.request != 3 || s.transfer.kind != TransferKind::kSsdRead) {
      continue;
    }
    for (const ChunkIo& c : s.transfer.chunks) EXPECT_EQ(c.chunk.index() % 4, 0u);
  }
  // NR and the query attend to 3 computed chunks and 5 * 4 loaded rows, in every layer.
  EXPECT_EQ(h.log.requests[2].important_tokens, (3 * C + 5 * 4) * 2);
}

// Cake's loads go through the same submission as every layer's: a chunk partly inside a Cake
// chunk is read whole and its needed rows gathered on the CPU before the copy, and cache moves
// name the chunks they move (an executor that moves real bytes needs both). Cake used to keep
// a copy of the submission that did neither.
TEST(PipelineTest, CakeLoadsGatherPartlyNeededChunksAndNameTheChunksOfCacheMoves) {
  const ModelSpec model = TinyModel(2);
  SystemOptions sys = System("cake");
  sys.cake_chunk_tokens = 6;            // Cake chunks straddle the 4-token stored chunks
  sys.cache.gpu_capacity = 8 * 4 * 32;  // eight stored chunks: loads demote GPU victims
  sys.cache.cpu_capacity = 1 << 20;
  Harness h(model, sys, Agreeing);
  for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(h.pipeline->Run(MakeRequest(id, 64, 8)).ok());
  h.pipeline->Finish();
  int gathers = 0, demotes = 0, promotes = 0;
  for (const auto& s : h.executor.history()) {
    if (!s.is_transfer) continue;
    const TransferOp& t = s.transfer;
    if (t.purpose != Purpose::kCakeLoad && t.purpose != Purpose::kPromote &&
        t.purpose != Purpose::kDemote) {
      continue;
    }
    ASSERT_FALSE(t.chunks.empty()) << TransferKindName(t.kind) << " " << PurposeName(t.purpose);
    Bytes sum = 0;
    for (const ChunkIo& c : t.chunks) sum += c.bytes;
    EXPECT_EQ(sum, t.bytes) << TransferKindName(t.kind) << " " << PurposeName(t.purpose);
    if (t.kind == TransferKind::kCpuGather) {
      // staged_gather (the default) gathers every loaded chunk; a stored chunk the Cake chunk
      // straddles contributes only its rows inside the Cake chunk.
      for (const ChunkIo& c : t.chunks) {
        EXPECT_FALSE(c.rows.empty());
        EXPECT_LE(c.rows.size(), 4u);
        gathers += c.rows.size() < 4u;
      }
    }
    demotes += t.purpose == Purpose::kDemote;
    promotes += t.purpose == Purpose::kPromote;
  }
  EXPECT_GT(gathers, 0);
  EXPECT_GT(demotes, 0);
  EXPECT_GT(promotes, 0);
}

// H2O's per-head sets reach the pipeline as their union with per-token head counts
// (Selection::kCounted, what a selection memo stores). Every load, record and reorder decision
// is the one the per-head sets themselves give: the same rows per chunk, the same bytes (one
// head's row per head keeping a token), the same importance history (each head's share added
// once per head keeping the token).
TEST(PipelineTest, H2oCountedSetsLoadAndRecordExactlyAsThePerHeadSets) {
  struct PerHeadScores : ScriptedScores {
    using ScriptedScores::ScriptedScores;
    Selection TopKPerHead(const Request& request, int layer, std::int64_t n,
                          std::span<const int> heads, std::int64_t k) override {
      std::vector<float> scores;
      Scores(request, layer, n, heads, &scores);
      Selection s;
      s.kind = Selection::Kind::kPerHead;
      s.per_head = SelectPerHead(scores, int(heads.size()), n, k);
      return s;
    }
  };
  // Heads that partly agree: some tokens kept by every head, some by a few.
  auto fn = [](const Request& r, int layer, int head, std::int64_t t) {
    const std::uint64_t x = std::uint64_t(t) * 2654435761u ^ (std::uint64_t(head) * 40503u) ^
                            (r.id * 97u) ^ (std::uint64_t(layer) * 7919u);
    return float((t * 13) % 17) + float(x % 7);
  };
  auto run = [&](bool per_head) {
    SystemOptions sys = System("as_h2o_lfu");
    sys.reorder = true;  // the importance history decides repacks
    sys.reorder_interval = 0;
    sys.cache.gpu_capacity = 3000;
    sys.cache.cpu_capacity = 6000;
    Harness h(TinyModel(3), sys, fn);
    PerHeadScores per_head_scores(fn);
    PipelineOptions options;
    options.system = sys;
    ScoreSource* source = per_head ? static_cast<ScoreSource*>(&per_head_scores) : &h.source;
    Pipeline p(TinyModel(3), options, &h.executor, source, &h.log);
    for (RequestId id = 1; id <= 12; ++id) {
      EXPECT_TRUE(p.Run(MakeRequest(id, 48 + 8 * std::int64_t(id % 4), 8)).ok());
    }
    EXPECT_TRUE(p.Finish().ok());
    std::string text;
    for (const TransferRecord& t : h.log.transfers) {
      text += std::to_string(t.request_id) + " " + std::to_string(t.layer) + " " +
              std::to_string(int(t.kind)) + " " + std::to_string(int(t.purpose)) + " " +
              std::to_string(t.bytes) + " " + std::to_string(t.ios) + " " +
              std::to_string(t.descriptors) + " " + std::to_string(t.start_s) + " " +
              std::to_string(t.end_s) + "\n";
    }
    for (const LayerRecord& l : h.log.layers) {
      text += "layer " + std::to_string(l.request_id) + " " + std::to_string(l.layer) + " " +
              std::to_string(l.selected_tokens) + " " + std::to_string(l.loaded_chunks) + "\n";
    }
    for (const RequestRecord& r : h.log.requests) {
      text += "request " + std::to_string(r.request_id) + " " + std::to_string(r.ttft_s) + " " +
              std::to_string(r.important_tokens) + " " + std::to_string(r.pcie_h2d_bytes) + "\n";
    }
    return std::make_pair(text, h.log.decisions);
  };
  const auto counted = run(false), per_head = run(true);
  EXPECT_EQ(counted.first, per_head.first);
  EXPECT_EQ(counted.second, per_head.second);
  bool repacked = false;
  for (const DecisionRecord& d : counted.second) repacked |= d.kind == "reorder";
  EXPECT_TRUE(repacked) << "the importance history was exercised";
}

// AddCountedShares groups tokens by head count and advances many tokens' adds side by side;
// each token must still get w added c times in sequence, so the sums equal the plain per-token
// loop bit for bit: for 1 to 64 heads (w not a power of two for most), counts from 1 to heads
// in blocks of every size around the 32 lanes (lone tokens, partial blocks), starting values
// zero, small, large (w below half an ulp: the adds change nothing) and accumulated over
// several layers as a request's are.
TEST(PipelineTest, CountedSharesAddExactlyAsTheSequentialLoop) {
  std::mt19937 rng(7);
  for (int heads : {1, 2, 3, 7, 32, 40, 64}) {
    const std::size_t n = 3000;
    std::vector<float> fast(n), slow(n);
    std::uniform_real_distribution<float> start(0.0f, 64.0f);
    for (std::size_t t = 0; t < n; ++t) {
      fast[t] = slow[t] = t % 5 == 0 ? 0.0f : t % 5 == 1 ? 3e7f + float(t) : start(rng);
    }
    for (int layer = 0; layer < 6; ++layer) {
      std::vector<std::uint16_t> of(n, 0);
      for (std::size_t t = 0; t < n; ++t) {
        const std::uint32_t r = rng();
        // Skewed like H2O's: most tokens kept by none or a few heads, some by all.
        if (r % 3 == 0) continue;
        of[t] = std::uint16_t(r % 7 == 0 ? heads : 1 + (r >> 8) % std::uint32_t(heads));
      }
      // A count with exactly 1, 31, 32 and 33 tokens: blocks of every boundary size.
      if (heads >= 4) {
        for (std::size_t t = 0; t < n; ++t) of[t] = of[t] >= 2 && of[t] <= 4 ? 1 : of[t];
        std::size_t t = 0;
        for (int c = 2; c <= 4; ++c) {
          const std::size_t m = c == 2 ? 1 : c == 3 ? 31 : 33;
          for (std::size_t i = 0; i < m; ++i, t += 11) of[t] = std::uint16_t(c);
        }
      }
      const Selection sel = Selection::FromCounts(of, heads);
      AddCountedShares(sel, fast);
      const float w = 1.0f / float(heads);
      for (std::size_t i = 0; i < sel.shared.size(); ++i) {
        float& f = slow[std::size_t(sel.shared[i])];
        for (int c = 0; c < sel.counts[i]; ++c) f += w;
      }
      for (std::size_t t = 0; t < n; ++t) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(fast[t]), std::bit_cast<std::uint32_t>(slow[t]))
            << "heads " << heads << " layer " << layer << " token " << t << ": " << fast[t]
            << " vs " << slow[t];
      }
    }
  }
}

TEST(PipelineTest, SameInputsSameDecisions) {
  auto run = [] {
    Harness h(TinyModel(3), System("spec"), Agreeing);
    for (RequestId id = 1; id <= 6; ++id) {
      EXPECT_TRUE(h.pipeline->Run(MakeRequest(id, 64 + 8 * std::int64_t(id % 3), 8)).ok());
    }
    h.pipeline->Finish();
    return h.log.decisions;
  };
  EXPECT_EQ(run(), run());
}

// Reordering reads the old segment's chunks and writes the repacked segment's chunks, naming
// them, so an executor that stores real bytes (hw) keeps its chunk store in step with the tree.
TEST(PipelineTest, ReorderWritesTheRepackedSegmentsChunks) {
  SystemOptions sys = System("spec");
  sys.reorder_interval = 1e-9;  // a pass before every request
  sys.reorder_min_accesses = 1;
  Harness h(TinyModel(2), sys, [](const Request&, int, int, std::int64_t t) {
    return float((t * 37) % 11);  // important tokens scattered: repacking changes the order
  });
  // Nothing cached (no cache capacity): a repack reads and writes the whole segment (22,528 B),
  // so it takes several reuses' worth of saved chunks (256 B of K and V each) to pay for it.
  for (RequestId id = 1; id <= 10; ++id) {
    ASSERT_TRUE(h.pipeline->Run(MakeRequest(id, 64, 8)).ok());
  }
  h.pipeline->Finish();
  ASSERT_GT(h.pipeline->totals().repacked_segments, 0);
  int reorder_writes = 0;
  for (const auto& s : h.executor.history()) {
    if (!s.is_transfer || s.transfer.purpose != Purpose::kReorder) continue;
    ASSERT_FALSE(s.transfer.chunks.empty());
    Bytes sum = 0;
    for (const ChunkIo& c : s.transfer.chunks) sum += c.bytes;
    EXPECT_EQ(sum, s.transfer.bytes);
    // One I/O per chunk read or written, one memcpy per run gathered (a run listed per entry).
    if (s.transfer.kind != TransferKind::kH2D) {
      EXPECT_EQ(s.transfer.ios, s.transfer.chunks.size());
    }
    if (s.transfer.kind == TransferKind::kSsdWrite) ++reorder_writes;
  }
  EXPECT_EQ(reorder_writes, h.pipeline->totals().repacked_segments);
  // The repacked segment is the one the tree serves now.
  Match m = h.pipeline->tree().Lookup(MakeRequest(9, 64, 8).prefix);
  bool written = false;
  for (const auto& s : h.executor.history()) {
    if (s.is_transfer && s.transfer.purpose == Purpose::kReorder &&
        s.transfer.kind == TransferKind::kSsdWrite) {
      written |= s.transfer.chunks.front().chunk.segment() == m.pieces.front().segment;
    }
  }
  EXPECT_TRUE(written);
}

// ---- repacks (SPEC §IV-D1): from cached copies, with inherited statistics -----------------

// The important tokens of P are scattered ((t * 37) % 11 ranks them), the same for every query,
// so packing pays; a repack becomes due after a few reuses. Between the reuses of P, a request
// with a prefix of its own (D) runs: the passes before it are where repacks happen, and it
// touches none of P's chunks, so the caches after D are what the repack left.
float Scattered(const Request&, int, int, std::int64_t t) { return float((t * 37) % 11); }

struct RepackHarness {
  explicit RepackHarness(SystemOptions sys, bool prewarm)
      : h(TinyModel(2), Configure(std::move(sys)), Scattered) {
    if (prewarm) h.pipeline->Prewarm(P(0));
  }
  static SystemOptions Configure(SystemOptions sys) {
    sys.reorder_interval = 1e-9;  // a pass before every request
    sys.reorder_min_accesses = 1;
    return sys;
  }
  static Request P(RequestId id) { return MakeRequest(id, 64, 8); }
  static Request D(RequestId id) {
    Request r = MakeRequest(id, 4, 8);
    for (auto& s : r.prefix) s += 50000 + 100 * id;  // a path of its own: never reused
    return r;
  }
  std::uint32_t SegmentOfP() const {
    return h.pipeline->tree().Lookup(P(0).prefix).pieces.front().segment;
  }

  // What the caches know of P's chunks.
  struct ChunkState {
    Tier tier;
    bool has_stats;
    ChunkStats stats;
  };
  std::map<std::uint64_t, ChunkState> Snapshot(std::uint32_t segment) const {
    std::map<std::uint64_t, ChunkState> out;
    const Segment* seg = h.pipeline->tree().FindSegment(segment);
    for (std::uint32_t l = 0; l < 2; ++l) {
      for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
        for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kProbeKey}) {
          const ChunkId id = ChunkId::Make(segment, kind, l, c);
          const std::optional<ChunkStats> s = h.pipeline->cache().Stats(id);
          out[id.value] = {h.pipeline->cache().Where(id), s.has_value(), s.value_or(ChunkStats{})};
        }
      }
    }
    return out;
  }

  // Runs P, D, P, D, ... until a pass before a D repacks P's segment; returns the state of P's
  // chunks just before that D and the ops that D's pass submitted.
  struct Repack {
    std::uint32_t old_id = 0, new_id = 0;
    std::map<std::uint64_t, ChunkState> before;
    std::vector<TransferOp> ops;  // purpose kReorder
  };
  Repack RunUntilRepacked() {
    Repack out;
    for (RequestId id = 1; id < 40; id += 2) {
      EXPECT_TRUE(h.pipeline->Run(P(id)).ok());
      out.old_id = SegmentOfP();
      out.before = Snapshot(out.old_id);
      const std::size_t submitted = h.executor.history().size();
      const std::int64_t repacked = h.pipeline->totals().repacked_segments;
      EXPECT_TRUE(h.pipeline->Run(D(id + 1)).ok());
      if (h.pipeline->totals().repacked_segments == repacked) continue;
      for (std::size_t i = submitted; i < h.executor.history().size(); ++i) {
        const auto& s = h.executor.history()[i];
        if (s.is_transfer && s.transfer.purpose == Purpose::kReorder) out.ops.push_back(s.transfer);
      }
      out.new_id = SegmentOfP();
      return out;
    }
    ADD_FAILURE() << "P's segment was never repacked";
    return out;
  }

  Harness h;
};

std::vector<TransferOp> OpsOf(const std::vector<TransferOp>& ops, TransferKind kind) {
  std::vector<TransferOp> out;
  for (const TransferOp& op : ops) {
    if (op.kind == kind) out.push_back(op);
  }
  return out;
}

// Prewarmed, P's chunks all sit in GPU memory: the repack reads nothing from the SSD. It copies
// every old chunk to host memory (one DMA each), gathers the rows into the new layout, copies
// the new chunks that take the GPU room back (staged_gather: from their own gather, one DMA per
// kind) and writes the whole repacked segment.
TEST(PipelineTest, RepackFromCachedCopiesReadsNoSsd) {
  SystemOptions sys = System("spec");
  sys.cache.gpu_capacity = 1 << 20;
  sys.cache.cpu_capacity = 1 << 20;
  RepackHarness rh(sys, /*prewarm=*/true);
  const RepackHarness::Repack r = rh.RunUntilRepacked();
  ASSERT_NE(r.new_id, 0u);
  ASSERT_NE(r.new_id, r.old_id);
  for (const auto& [id, state] : r.before) ASSERT_EQ(state.tier, Tier::kGpu);
  const Bytes segment_bytes = 64 * 2 * (32 + 32 + 24);  // tokens x layers x (K + V + PK)
  EXPECT_TRUE(OpsOf(r.ops, TransferKind::kSsdRead).empty()) << "every chunk was cached";
  const auto d2h = OpsOf(r.ops, TransferKind::kD2H);
  ASSERT_EQ(d2h.size(), 1u);
  EXPECT_EQ(d2h[0].ios, 16u * 2 * 3);
  EXPECT_EQ(d2h[0].bytes, segment_bytes);
  const auto gathers = OpsOf(r.ops, TransferKind::kCpuGather);
  ASSERT_EQ(gathers.size(), 1u) << "every new chunk takes GPU room: one gather, for the GPU";
  EXPECT_EQ(gathers[0].bytes, segment_bytes);
  // One listed piece per run: consecutive rows of one old chunk.
  EXPECT_EQ(gathers[0].ios, gathers[0].chunks.size());
  EXPECT_GT(gathers[0].ios, 16u * 2 * 3) << "the rows come from many places";
  for (const ChunkIo& run : gathers[0].chunks) {
    EXPECT_EQ(run.chunk.segment(), r.old_id);
    ASSERT_FALSE(run.rows.empty());
    for (std::size_t i = 1; i < run.rows.size(); ++i) EXPECT_EQ(run.rows[i], run.rows[i - 1] + 1);
  }
  const auto h2d = OpsOf(r.ops, TransferKind::kH2D);
  ASSERT_EQ(h2d.size(), 1u);
  EXPECT_TRUE(h2d[0].staged);
  EXPECT_EQ(h2d[0].ios, 3u) << "one DMA per kind";
  EXPECT_EQ(h2d[0].bytes, segment_bytes);
  const auto writes = OpsOf(r.ops, TransferKind::kSsdWrite);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].bytes, segment_bytes);
  EXPECT_EQ(writes[0].ios, 16u * 2 * 3);
  // The new chunks took the GPU room back, and their statistics are their rows' old ones: the
  // probe keys are read whole by every request, so all of a layer's old probe-key chunks have
  // the same statistics, and so has every new one.
  const Segment* seg = rh.h.pipeline->tree().FindSegment(r.new_id);
  int inherited_first = 0;
  for (std::uint32_t l = 0; l < 2; ++l) {
    for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kProbeKey}) {
        const ChunkId id = ChunkId::Make(r.new_id, kind, l, c);
        EXPECT_EQ(rh.h.pipeline->cache().Where(id), Tier::kGpu);
        const std::optional<ChunkStats> s = rh.h.pipeline->cache().Stats(id);
        // A chunk made only of rows no request ever needed (prewarmed, never accessed) has no
        // statistics to inherit; the others inherit.
        if (kind != KvKind::kProbeKey && !s.has_value()) continue;
        ASSERT_TRUE(s.has_value()) << "inherited, not restarted";
        if (kind == KvKind::kKey && c == 0) ++inherited_first;
        std::uint64_t lo = ~0ull, hi = 0, last = 0;
        for (std::uint32_t o = 0; o < 16; ++o) {
          const auto& old = r.before.at(ChunkId::Make(r.old_id, kind, l, o).value);
          const std::uint64_t f = old.has_stats ? old.stats.frequency : 0;
          lo = std::min(lo, f);
          hi = std::max(hi, f);
          if (old.has_stats) last = std::max(last, old.stats.last_access);
        }
        EXPECT_GE(s->frequency, lo);
        EXPECT_LE(s->frequency, hi);
        EXPECT_LE(s->last_access, last);
        if (kind == KvKind::kProbeKey) {
          const auto& old = r.before.at(ChunkId::Make(r.old_id, kind, l, c).value);
          ASSERT_TRUE(old.has_stats);
          EXPECT_EQ(s->frequency, old.stats.frequency);
          EXPECT_DOUBLE_EQ(s->important_ratio, 1.0);
        }
      }
    }
  }
  // The densest key chunk (the top of the pack: rows every reuse needed) inherits in every layer.
  EXPECT_EQ(inherited_first, 2);
  // Nothing of the old segment is left in the caches.
  for (const auto& [id, state] : r.before) {
    EXPECT_EQ(rh.h.pipeline->cache().Where(ChunkId{id}), Tier::kSsd);
    EXPECT_FALSE(rh.h.pipeline->cache().Stats(ChunkId{id}).has_value());
  }
}

// reorder.from_memory: a segment the caches hold whole is repacked exactly as without it (the
// same request, the same ops: no SSD read either way); one they cannot hold whole -- P's 22,528 B
// against 4 KiB of GPU and CPU room -- is never repacked, where without it the break-even rule
// repacks it, reading what no cache holds.
TEST(PipelineTest, FromMemoryRepacksOnlySegmentsTheCachesHoldWhole) {
  auto held = [](bool from_memory) {
    SystemOptions sys = System("spec");
    sys.cache.gpu_capacity = 1 << 20;
    sys.cache.cpu_capacity = 1 << 20;
    sys.reorder_from_memory = from_memory;
    RepackHarness rh(sys, /*prewarm=*/true);
    return rh.RunUntilRepacked();
  };
  const RepackHarness::Repack with = held(true), without = held(false);
  ASSERT_NE(with.new_id, 0u);
  EXPECT_EQ(with.new_id, without.new_id);
  ASSERT_EQ(with.ops.size(), without.ops.size());
  for (std::size_t i = 0; i < with.ops.size(); ++i) {
    EXPECT_EQ(with.ops[i].kind, without.ops[i].kind);
    EXPECT_EQ(with.ops[i].bytes, without.ops[i].bytes);
    EXPECT_EQ(with.ops[i].ios, without.ops[i].ios);
  }
  EXPECT_TRUE(OpsOf(with.ops, TransferKind::kSsdRead).empty());

  auto small = [](bool from_memory) {
    SystemOptions sys = System("spec");
    sys.cache.gpu_capacity = 2 * 1024;
    sys.cache.cpu_capacity = 2 * 1024;
    sys.reorder_from_memory = from_memory;
    RepackHarness rh(sys, /*prewarm=*/false);
    for (RequestId id = 1; id < 40; id += 2) {
      EXPECT_TRUE(rh.h.pipeline->Run(RepackHarness::P(id)).ok());
      EXPECT_TRUE(rh.h.pipeline->Run(RepackHarness::D(id + 1)).ok());
    }
    EXPECT_TRUE(rh.h.pipeline->Finish().ok());
    Bytes repack_reads = 0;
    for (const auto& s : rh.h.executor.history()) {
      if (s.is_transfer && s.transfer.purpose == Purpose::kReorder &&
          s.transfer.kind == TransferKind::kSsdRead) {
        repack_reads += s.transfer.bytes;
      }
    }
    return std::make_pair(rh.h.pipeline->totals().repacked_segments, repack_reads);
  };
  const auto [repacks_without, reads_without] = small(false);
  EXPECT_GT(repacks_without, 0) << "the break-even rule repacks P";
  EXPECT_GT(reads_without, 0u) << "reading what no cache holds";
  const auto [repacks_with, reads_with] = small(true);
  EXPECT_EQ(repacks_with, 0) << "never held whole: never repacked";
  EXPECT_EQ(reads_with, 0u);
}

// ---- the reorderer's rent: what each layer's loads of the kept set cost ------------------------

// Reuses P (64 tokens, Scattered: the same 16 tokens kept in every layer, head and request)
// with no reorder pass, so the evidence of P's segment only adds up; returns it, and in
// *kept the tokens every layer selected (all layers alike).
Reorderer::Evidence EvidenceOfP(SystemOptions sys, int requests, std::int64_t* kept) {
  sys.reorder = true;
  sys.reorder_interval = 1e9;  // no pass
  Harness h(TinyModel(2), sys, Scattered);
  for (RequestId id = 1; id <= RequestId(requests); ++id) {
    EXPECT_TRUE(h.pipeline->Run(RepackHarness::P(id)).ok());
  }
  EXPECT_TRUE(h.pipeline->Finish().ok());
  *kept = -1;
  for (const LayerRecord& l : h.log.layers) {
    if (l.request_id == 1) continue;  // nothing reused yet
    if (*kept < 0) *kept = l.selected_tokens;
    EXPECT_EQ(l.selected_tokens, *kept);
  }
  const Match m = h.pipeline->tree().Lookup(RepackHarness::P(0).prefix);
  return h.pipeline->reorderer().EvidenceOf(m.pieces.front().segment);
}

// ITF passes in every layer (the heads agree) and loads K and V of the voted set, whole chunks
// from the SSD (no cache): each chunk packing saves is a K and a V chunk read, 2 * 4 tokens *
// 32 B. The rent is the saved chunks of the count at 256 B each.
TEST(PipelineTest, RentOfWholeChunkLoadsIsTheirBytes) {
  std::int64_t kept = 0;
  const Reorderer::Evidence e = EvidenceOfP(System("spec"), 6, &kept);
  ASSERT_GT(e.reuses, 0);
  ASSERT_GT(e.stored_chunks, e.packed_chunks) << "Scattered's kept tokens pack";
  EXPECT_DOUBLE_EQ(e.rent_bytes, (e.stored_chunks - e.packed_chunks) * 256);
}

// Prewarmed into a GPU cache that holds all of P, every reuse is served from GPU memory: no
// byte comes from the SSD, but each chunk the layers touch holds a K or V chunk of GPU room that
// packing would give to other chunks, so the rent is still 256 B a saved chunk.
TEST(PipelineTest, RentOfChunksServedFromMemoryIsTheirRoom) {
  SystemOptions sys = System("spec");
  sys.cache.gpu_capacity = 1 << 20;
  sys.cache.cpu_capacity = 1 << 20;
  sys.reorder = true;
  sys.reorder_interval = 1e9;  // no pass
  Harness h(TinyModel(2), sys, Scattered);
  h.pipeline->Prewarm(RepackHarness::P(0));
  for (RequestId id = 1; id <= 6; ++id) {
    ASSERT_TRUE(h.pipeline->Run(RepackHarness::P(id)).ok());
  }
  ASSERT_TRUE(h.pipeline->Finish().ok());
  for (const auto& r : h.log.requests) EXPECT_EQ(r.ssd_read_bytes, 0u);
  const Match m = h.pipeline->tree().Lookup(RepackHarness::P(0).prefix);
  const Reorderer::Evidence e = h.pipeline->reorderer().EvidenceOf(m.pieces.front().segment);
  ASSERT_GT(e.reuses, 0);
  ASSERT_GT(e.stored_chunks, e.packed_chunks);
  EXPECT_DOUBLE_EQ(e.rent_bytes, (e.stored_chunks - e.packed_chunks) * 256);
}

// H2O (as a layer where ITF falls back) loads every key whatever the layout: only its value
// chunks follow the kept set, so a saved chunk is worth one V chunk, 128 B.
TEST(PipelineTest, RentLeavesOutLoadsOfTheWholePrefix) {
  SystemOptions sys = System("as_h2o_lfu");
  std::int64_t kept = 0;
  const Reorderer::Evidence e = EvidenceOfP(sys, 6, &kept);
  ASSERT_GT(e.stored_chunks, e.packed_chunks);
  EXPECT_DOUBLE_EQ(e.rent_bytes, (e.stored_chunks - e.packed_chunks) * 128);
}

// With extent reads (nothing cached, no prefetch: every demand read is of extents), a chunk
// costs what it reads beyond its needed rows, which any layout reads: on TinyModel a 4 KiB
// extent covers the whole 128 B chunk, so a chunk with r needed rows is priced 128 - 32 r, per
// kind. Per layer S chunks hold the k kept rows: the loads cost 2 * (128 S - 32 k) and the rent
// is (S - P) / S of that, S and P the same in every layer and reuse.
TEST(PipelineTest, RentOfExtentReadsIsTheirAlignmentWaste) {
  SystemOptions sys = System("impress");
  sys.ssd_read_unit = SsdReadUnit::kExtent;
  std::int64_t kept = 0;
  const int requests = 6;
  const Reorderer::Evidence e = EvidenceOfP(sys, requests, &kept);
  ASSERT_EQ(e.reuses, requests - 2) << "the first reuse has no history to pack by";
  const double layers = 2, s = e.stored_chunks / (layers * double(e.reuses));
  const double p = e.packed_chunks / (layers * double(e.reuses));
  ASSERT_EQ(s, std::floor(s)) << "the same chunks in every layer and reuse";
  ASSERT_GT(s, p);
  ASSERT_EQ(kept, 16);
  EXPECT_NEAR(e.rent_bytes, layers * double(e.reuses) * (s - p) / s * 2 * (128 * s - 32 * 16),
              1e-6);
  EXPECT_LT(e.rent_bytes, (e.stored_chunks - e.packed_chunks) * 256);
}

// Not prewarmed, small caches: only the chunks neither cache holds are read; the GPU-held ones
// are copied; the new chunks of each (layer, kind) take no more GPU or CPU room than the old
// ones held, the most important (chunk 0: the top of each pack) first.
TEST(PipelineTest, RepackReadsOnlyWhatNoCacheHolds) {
  SystemOptions sys = System("spec");
  sys.cache.gpu_capacity = 2 * 1024;
  sys.cache.cpu_capacity = 2 * 1024;
  RepackHarness rh(sys, /*prewarm=*/false);
  const RepackHarness::Repack r = rh.RunUntilRepacked();
  ASSERT_NE(r.new_id, 0u);
  Bytes on_ssd = 0, on_gpu = 0;
  std::uint32_t ssd_chunks = 0, gpu_chunks = 0;
  std::map<std::pair<std::uint32_t, int>, Bytes> gpu_room, cpu_room;
  for (const auto& [value, state] : r.before) {
    const ChunkId id{value};
    const Bytes b = 4 * (id.kind() == KvKind::kProbeKey ? 24 : 32);
    if (state.tier == Tier::kSsd) on_ssd += b, ++ssd_chunks;
    if (state.tier == Tier::kGpu) on_gpu += b, ++gpu_chunks;
    if (state.tier == Tier::kGpu) gpu_room[{id.layer(), int(id.kind())}] += b;
    if (state.tier == Tier::kCpu) cpu_room[{id.layer(), int(id.kind())}] += b;
  }
  ASSERT_GT(ssd_chunks, 0u);
  ASSERT_GT(gpu_chunks, 0u);
  const auto reads = OpsOf(r.ops, TransferKind::kSsdRead);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].ios, ssd_chunks);
  EXPECT_EQ(reads[0].bytes, on_ssd);
  const auto d2h = OpsOf(r.ops, TransferKind::kD2H);
  ASSERT_EQ(d2h.size(), 1u);
  EXPECT_EQ(d2h[0].ios, gpu_chunks);
  EXPECT_EQ(d2h[0].bytes, on_gpu);
  std::map<std::pair<std::uint32_t, int>, Bytes> gpu_now, cpu_now;
  const Segment* seg = rh.h.pipeline->tree().FindSegment(r.new_id);
  for (std::uint32_t l = 0; l < 2; ++l) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kProbeKey}) {
      for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
        const ChunkId id = ChunkId::Make(r.new_id, kind, l, c);
        const Bytes b = 4 * (kind == KvKind::kProbeKey ? 24 : 32);
        const Tier t = rh.h.pipeline->cache().Where(id);
        if (t == Tier::kGpu) gpu_now[{l, int(kind)}] += b;
        if (t == Tier::kCpu) cpu_now[{l, int(kind)}] += b;
      }
      const std::pair<std::uint32_t, int> key{l, int(kind)};
      EXPECT_EQ(gpu_now[key], gpu_room[key]) << "equal chunks: the room is taken exactly";
      EXPECT_EQ(cpu_now[key], cpu_room[key]);
      if (gpu_room[key] > 0) {
        EXPECT_EQ(rh.h.pipeline->cache().Where(ChunkId::Make(r.new_id, kind, l, 0)), Tier::kGpu)
            << "the densest chunk first";
      }
    }
  }
  const auto h2d = OpsOf(r.ops, TransferKind::kH2D);
  ASSERT_EQ(h2d.size(), 1u);
  Bytes gpu_total = 0;
  for (const auto& [key, b] : gpu_now) gpu_total += b;
  EXPECT_EQ(h2d[0].bytes, gpu_total);
  // Under staged_gather two gathers: the GPU-bound chunks (their H2D copies it), the rest.
  const auto gathers = OpsOf(r.ops, TransferKind::kCpuGather);
  ASSERT_EQ(gathers.size(), 2u);
  EXPECT_EQ(gathers[0].bytes, gpu_total);
  EXPECT_EQ(gathers[0].bytes + gathers[1].bytes, Bytes(64 * 2 * (32 + 32 + 24)));
}

TEST(PipelineTest, WarmCachesAvoidSsdReads) {
  const ModelSpec model = TinyModel(2);
  SystemOptions sys = System("as");
  sys.cache.gpu_capacity = 1 << 20;
  sys.cache.cpu_capacity = 1 << 20;
  Harness h(model, sys, Agreeing);
  Request r = MakeRequest(1, 64, 8);
  h.pipeline->Prewarm(r);
  r.id = 2;
  ASSERT_TRUE(h.pipeline->Run(r).ok());
  h.pipeline->Finish();
  EXPECT_EQ(h.log.requests[0].ssd_read_bytes, 0u);
  EXPECT_EQ(h.log.requests[0].gpu_hit_chunks, 16 * 2 * 2);
  EXPECT_EQ(h.log.requests[0].io_stall_s, 0.0);
}

}  // namespace
}  // namespace kvtier
