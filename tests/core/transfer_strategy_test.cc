// Transfer strategies (core/transfer_strategy.h): runs, SSD extents and the op counts of each
// strategy, first on hand-made row loads, then through the Pipeline for every shipped system
// (configs/systems/*.ini) x every strategy over FakeExecutor: every load op follows the table
// (counted here independently, from the rows each op lists).

#include "core/transfer_strategy.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "core/pipeline.h"
#include "core/schedule.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"

namespace kvtier {
namespace {

using testing::FakeExecutor;
using testing::FakeExecutorOptions;
using testing::ScriptedScores;

TEST(TransferStrategy, RunsAreMaximalRangesOfConsecutiveRows) {
  const std::vector<std::uint16_t> none, one = {7}, rows = {0, 1, 2, 5, 6, 9};
  EXPECT_EQ(CountRuns(none), 0u);
  EXPECT_EQ(CountRuns(one), 1u);
  EXPECT_EQ(CountRuns(rows), 3u);
}

TEST(TransferStrategy, NamesAreTheTablesAndUnknownNamesListThem) {
  EXPECT_EQ(FindTransferStrategy("staged_gather"), TransferStrategy::kStagedGather);
  EXPECT_EQ(TransferStrategyName(TransferStrategy::kDeviceGather), "device_gather");
  EXPECT_EQ(FindSsdReadUnit("extent"), SsdReadUnit::kExtent);
  try {
    FindTransferStrategy("scatter", "sys.ini:4: transfer.strategy");
    FAIL() << "an unknown strategy was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sys.ini:4: transfer.strategy"), std::string::npos) << what;
    EXPECT_NE(what.find("'scatter'"), std::string::npos) << what;
    EXPECT_NE(what.find("per_row, per_chunk, staged_gather, batched, device_gather"),
              std::string::npos)
        << what;
  }
  EXPECT_THROW(FindSsdReadUnit("page"), ConfigError);
}

TEST(TransferStrategy, ConfigCheckRejectsAnUnknownStrategyNamingTheKey) {
  try {
    const Config c = Config::FromOverrides({"transfer.strategy=rows"});
    BuildSystemOptions(c, ModelSpec{});
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("transfer.strategy"), std::string::npos) << what;
    EXPECT_NE(what.find("staged_gather"), std::string::npos) << what;
  }
  try {
    const Config c = Config::FromOverrides({"transfer.ssd_read_unit=page"});
    BuildSystemOptions(c, ModelSpec{});
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("transfer.ssd_read_unit"), std::string::npos) << what;
    EXPECT_NE(what.find("extent"), std::string::npos) << what;
  }
}

// Rows {0,1,2,5,6} of a K chunk and {3,4} of a V chunk: 8 rows of 1 KiB per chunk, 3 runs,
// 7 KiB needed.
void AddBoth(TransferStrategy s, RowOps* ops) {
  static const std::vector<std::uint16_t> a = {0, 1, 2, 5, 6}, b = {3, 4};
  AddRows(s, {ChunkId::Make(1, KvKind::kKey, 0, 0), KvKind::kKey, a, 2, 5 * 1024, 8192, false},
          true, ops);
  AddRows(s, {ChunkId::Make(1, KvKind::kValue, 0, 0), KvKind::kValue, b, 1, 2 * 1024, 8192,
              false},
          true, ops);
  FinishOps(s, ops);
}

TEST(TransferStrategy, EachStrategyCountsAsTheTableSays) {
  {
    RowOps o;
    AddBoth(TransferStrategy::kPerRow, &o);
    EXPECT_EQ(o.h2d.method, CopyMethod::kDma);
    EXPECT_EQ(o.h2d.ios, 3u);
    EXPECT_EQ(o.h2d.bytes, 7168u);
    EXPECT_EQ(o.gather.bytes, 0u);
  }
  {
    RowOps o;
    AddBoth(TransferStrategy::kPerChunk, &o);
    EXPECT_EQ(o.h2d.ios, 2u);
    EXPECT_EQ(o.h2d.bytes, 16384u);  // whole stored chunks
    ASSERT_EQ(o.h2d.chunks.size(), 2u);
    EXPECT_TRUE(o.h2d.chunks[0].rows.empty());
  }
  {
    RowOps o;
    AddBoth(TransferStrategy::kStagedGather, &o);
    EXPECT_EQ(o.gather.ios, 3u);
    EXPECT_EQ(o.gather.bytes, 7168u);
    EXPECT_TRUE(o.h2d.staged);
    EXPECT_EQ(o.h2d.ios, 2u);  // K and V: one region each
    EXPECT_EQ(o.h2d.bytes, 7168u);
  }
  for (TransferStrategy s : {TransferStrategy::kBatched, TransferStrategy::kDeviceGather}) {
    RowOps o;
    AddBoth(s, &o);
    EXPECT_EQ(o.h2d.method, s == TransferStrategy::kBatched ? CopyMethod::kBatched
                                                             : CopyMethod::kDeviceGather);
    EXPECT_EQ(o.h2d.ios, 1u);
    EXPECT_EQ(o.h2d.descriptors, 3u);
    EXPECT_EQ(o.h2d.bytes, 7168u);
    EXPECT_EQ(o.gather.bytes, 0u);
  }
}

TEST(TransferStrategy, ExtentsAreAlignedMergedAndCountChunkBytesOnly) {
  std::vector<Extent> e;
  // 64 rows of 1 KiB: {0-3} -> [0, 4K); {10} -> [8K, 12K) and {12} -> [12K, 16K), adjacent:
  // merged; {40} -> [40K, 44K).
  const std::vector<std::uint16_t> rows = {0, 1, 2, 3, 10, 12, 40};
  EXPECT_EQ(AppendExtents(rows, 1024, 65536, &e), 16384u);
  EXPECT_EQ(e, (std::vector<Extent>{{0, 4096}, {8192, 8192}, {40960, 4096}}));
  // Overlapping after rounding: rows 1 and 3 of 1000-byte rows both lie in [0, 4K).
  e.clear();
  const std::vector<std::uint16_t> close = {1, 3, 9};
  EXPECT_EQ(AppendExtents(close, 1000, 20000, &e), 8192u);
  EXPECT_EQ(e, (std::vector<Extent>{{0, 4096}, {8192, 4096}}));
  // The last extent's padding past the chunk's end is not counted; covering the whole chunk
  // is a whole-chunk read (no extents).
  e.clear();
  const std::vector<std::uint16_t> last = {9};
  EXPECT_EQ(AppendExtents(last, 1000, 10000, &e), 10000u - 8192u);
  EXPECT_EQ(e, (std::vector<Extent>{{8192, 4096}}));
  e.clear();
  const std::vector<std::uint16_t> small = {4};
  EXPECT_EQ(AppendExtents(small, 1000, 5000, &e), 5000u);
  EXPECT_TRUE(e.empty());
}

// ---- through the Pipeline: every shipped system x every strategy --------------------------

std::string SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");  // set by ctest (tests/CMakeLists.txt)
  return s != nullptr ? s : KVTIER_TEST_SOURCE_DIR;
}

ModelSpec TinyModel(int head_dim) {
  ModelSpec m;
  m.name = "tiny";
  m.family = ModelFamily::kLlama;
  m.layers = 3;
  m.hidden = 4 * head_dim;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = head_dim;
  m.ffn = 32;
  m.vocab = 100;
  m.dtype_bytes = 2;
  m.max_context = 4096;
  return m;  // K (or V) of one token in one layer: 8 * head_dim B
}

float Agreeing(const Request&, int layer, int, std::int64_t t) {
  return float((t * 7 + layer) % 13);
}

struct StrategyRun {
  StrategyRun(const std::string& system, const std::string& strategy, const std::string& cpu_capacity,
      const std::string& read_unit = "chunk", int head_dim = 4, int chunk_tokens = 4)
      : executor(FakeExecutorOptions{}), scores(Agreeing), model(TinyModel(head_dim)) {
    const Config c = Config::Load(
        SourceDir() + "/configs/systems/" + system + ".ini",
        {"cache.chunk_tokens=" + std::to_string(chunk_tokens), "cache.gpu_capacity=0",
         "cache.cpu_capacity=" + cpu_capacity, "cake.chunk_tokens=8",
         "transfer.strategy=" + strategy, "transfer.ssd_read_unit=" + read_unit});
    PipelineOptions options;
    options.system = BuildSystemOptions(c, model);
    reuses = FindSchedule(options.system.schedule).reuses;
    Pipeline p(model, options, &executor, &scores, &log);
    const std::int64_t lengths[] = {40, 64, 80, 80};
    for (int i = 0; i < 4; ++i) {
      Request r;
      r.id = RequestId(i + 1);
      r.prefix.resize(std::size_t(lengths[i]));
      std::iota(r.prefix.begin(), r.prefix.end(), 1000);
      r.query_tokens = 6;
      EXPECT_TRUE(p.Run(r).ok());
    }
    EXPECT_TRUE(p.Finish().ok());
  }
  FakeExecutor executor;
  ScriptedScores scores;
  MemoryRunLog log;
  bool reuses = true;  // the system's schedule loads reused KV (not recompute's)
  ModelSpec model;
};

// Runs counted from the listed rows, independently of CountRuns.
std::uint32_t Runs(const std::vector<ChunkIo>& chunks) {
  std::uint32_t runs = 0;
  for (const ChunkIo& c : chunks) {
    for (std::size_t i = 0; i < c.rows.size(); ++i) {
      if (i == 0 || c.rows[i] != c.rows[i - 1] + 1) ++runs;
    }
  }
  return runs;
}
Bytes SumBytes(const std::vector<ChunkIo>& chunks) {
  Bytes b = 0;
  for (const ChunkIo& c : chunks) b += c.bytes;
  return b;
}
bool IsLoad(const TransferOp& op) {
  return op.purpose != Purpose::kPromote && op.purpose != Purpose::kDemote &&
         op.purpose != Purpose::kStore && op.purpose != Purpose::kReorder;
}

std::vector<std::string> ShippedSystems() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(SourceDir() + "/configs/systems")) {
    if (e.path().extension() == ".ini") out.push_back(e.path().stem().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TransferStrategyPipeline, EveryLoadOfEverySystemFollowsTheTable) {
  const std::vector<std::string> systems = ShippedSystems();
  ASSERT_GE(systems.size(), 10u);
  for (const std::string& system : systems) {
    for (const TransferStrategyInfo& info : TransferStrategies()) {
      for (const char* cpu : {"0", "1MiB"}) {  // every chunk from the SSD; CPU hits too
        SCOPED_TRACE(system + " / " + std::string(info.name) + " / cpu " + cpu);
        StrategyRun run(system, std::string(info.name), cpu);
        const auto& h = run.executor.history();
        std::map<std::string, int> seen;
        for (std::size_t i = 0; i < h.size(); ++i) {
          if (!h[i].is_transfer) continue;
          const TransferOp& op = h[i].transfer;
          if (op.kind != TransferKind::kH2D && op.kind != TransferKind::kCpuGather &&
              op.kind != TransferKind::kD2H) {
            continue;
          }
          if (!IsLoad(op)) {  // cache moves and the store: whole-chunk DMAs
            EXPECT_EQ(op.method, CopyMethod::kDma);
            EXPECT_EQ(op.descriptors, 0u);
            EXPECT_FALSE(op.staged);
            EXPECT_NE(op.kind, TransferKind::kCpuGather);
            continue;
          }
          ASSERT_FALSE(op.chunks.empty());
          EXPECT_EQ(op.bytes, SumBytes(op.chunks));
          ++seen[std::string(TransferKindName(op.kind))];
          const std::uint32_t runs = Runs(op.chunks);
          switch (info.strategy) {
            case TransferStrategy::kPerRow:
              ASSERT_EQ(op.kind, TransferKind::kH2D);
              EXPECT_EQ(op.method, CopyMethod::kDma);
              EXPECT_EQ(op.ios, runs);
              break;
            case TransferStrategy::kPerChunk:
              ASSERT_EQ(op.kind, TransferKind::kH2D);
              EXPECT_EQ(op.method, CopyMethod::kDma);
              EXPECT_EQ(op.ios, op.chunks.size());
              for (const ChunkIo& c : op.chunks) {
                EXPECT_TRUE(c.rows.empty());
                // A whole stored chunk: 4 tokens of 32 B, or a segment's short last chunk.
                EXPECT_TRUE(c.bytes % 32 == 0 && c.bytes > 0 && c.bytes <= 128) << c.bytes;
              }
              break;
            case TransferStrategy::kStagedGather:
              if (op.kind == TransferKind::kCpuGather) {
                EXPECT_EQ(op.ios, runs);
                // The next op of this request is its staged copy of the same rows.
                ASSERT_LT(i + 1, h.size());
                const TransferOp& copy = h[i + 1].transfer;
                ASSERT_TRUE(h[i + 1].is_transfer);
                EXPECT_EQ(copy.kind, TransferKind::kH2D);
                EXPECT_TRUE(copy.staged);
                EXPECT_EQ(copy.bytes, op.bytes);
                ASSERT_EQ(copy.chunks.size(), op.chunks.size());
                for (std::size_t k = 0; k < op.chunks.size(); ++k) {
                  EXPECT_EQ(copy.chunks[k].chunk, op.chunks[k].chunk);
                  EXPECT_EQ(copy.chunks[k].rows, op.chunks[k].rows);
                }
              } else {
                EXPECT_TRUE(op.staged);
                EXPECT_EQ(op.method, CopyMethod::kDma);
                std::set<KvKind> kinds;
                for (const ChunkIo& c : op.chunks) kinds.insert(c.chunk.kind());
                EXPECT_EQ(op.ios, kinds.size());
                // Preceded by its gather.
                ASSERT_GT(i, 0u);
                EXPECT_EQ(h[i - 1].transfer.kind, TransferKind::kCpuGather);
              }
              break;
            case TransferStrategy::kBatched:
            case TransferStrategy::kDeviceGather:
              ASSERT_EQ(op.kind, TransferKind::kH2D);
              EXPECT_EQ(op.method, info.strategy == TransferStrategy::kBatched
                                       ? CopyMethod::kBatched
                                       : CopyMethod::kDeviceGather);
              EXPECT_EQ(op.ios, 1u);
              EXPECT_EQ(op.descriptors, runs);
              break;
          }
        }
        if (run.reuses) {  // recomp and the decode systems' prefills load nothing
          EXPECT_GT(seen["h2d"], 0);
        }
        if (info.strategy == TransferStrategy::kStagedGather) {
          EXPECT_EQ(seen["cpu_gather"], seen["h2d"]);
        } else {
          EXPECT_EQ(seen["cpu_gather"], 0);
        }
      }
    }
  }
}

// ssd_read_unit = extent: a demand read of a partly needed chunk the cache does not admit
// reads the 4 KiB extents of its needed rows (4 KiB rows: one extent per run), whole chunks
// stay whole, and the op's ios are the extents.
TEST(TransferStrategyPipeline, ExtentReadsCoverTheNeededRowsInAlignedExtents) {
  StrategyRun run("as_h2o_lru", "per_row", "0", "extent", /*head_dim=*/512, /*chunk_tokens=*/8);
  const Bytes row = 8 * 512;  // 4 KiB
  int partial_reads = 0;
  for (const auto& s : run.executor.history()) {
    if (!s.is_transfer || s.transfer.kind != TransferKind::kSsdRead || !IsLoad(s.transfer)) {
      continue;
    }
    const TransferOp& op = s.transfer;
    std::uint32_t ios = 0;
    for (const ChunkIo& c : op.chunks) {
      ios += c.extents.empty() ? 1 : std::uint32_t(c.extents.size());
      Bytes covered = 0;
      for (const Extent& e : c.extents) {
        EXPECT_EQ(e.offset % 4096, 0u);
        EXPECT_EQ(e.length % 4096, 0u);
        covered += e.length;
      }
      if (!c.extents.empty()) {
        ++partial_reads;
        EXPECT_EQ(c.bytes, covered);  // whole rows of 4 KiB: no padding
        EXPECT_LT(c.bytes, 8 * row);
      }
    }
    EXPECT_EQ(op.ios, ios);
    EXPECT_EQ(op.bytes, SumBytes(op.chunks));
  }
  EXPECT_GT(partial_reads, 0);
}

// A repack (core/pipeline.cc, RepackSegment) moves the new chunks that take GPU room as the
// strategy moves whole chunks from host memory, after a CPU gather that lays the rows out in
// the new order (one listed entry, one memcpy, per run of an old chunk's rows); under
// staged_gather that gather is the strategy's, and the H2D copies its regions, one DMA per kind.
TEST(TransferStrategyPipeline, RepackCopiesFollowTheTableForWholeChunks) {
  for (const TransferStrategyInfo& info : TransferStrategies()) {
    SCOPED_TRACE(std::string(info.name));
    FakeExecutor executor{FakeExecutorOptions{}};
    ScriptedScores scores([](const Request&, int, int, std::int64_t t) {
      return float((t * 37) % 11);  // scattered, the same for every query: packing pays
    });
    MemoryRunLog log;
    const ModelSpec model = TinyModel(4);
    const Config c = Config::Load(
        SourceDir() + "/configs/systems/spec.ini",
        {"cache.chunk_tokens=4", "cache.gpu_capacity=4KiB", "cache.cpu_capacity=4KiB",
         "reorder.interval=0s", "reorder.min_accesses=1",
         "transfer.strategy=" + std::string(info.name)});
    PipelineOptions options;
    options.system = BuildSystemOptions(c, model);
    Pipeline p(model, options, &executor, &scores, &log);
    for (RequestId id = 1; id <= 12; ++id) {
      Request r;
      r.id = id;
      r.prefix.resize(64);
      std::iota(r.prefix.begin(), r.prefix.end(), 1000);
      r.query_tokens = 6;
      ASSERT_TRUE(p.Run(r).ok());
    }
    ASSERT_TRUE(p.Finish().ok());
    ASSERT_GT(p.totals().repacked_segments, 0);
    const auto& h = executor.history();
    int copies = 0;
    Bytes gathered = 0, written = 0;
    for (std::size_t i = 0; i < h.size(); ++i) {
      if (!h[i].is_transfer || h[i].transfer.purpose != Purpose::kReorder) continue;
      const TransferOp& op = h[i].transfer;
      if (op.kind == TransferKind::kSsdWrite) written += op.bytes;
      if (op.kind == TransferKind::kCpuGather) {
        EXPECT_EQ(op.ios, op.chunks.size());
        EXPECT_EQ(op.ios, Runs(op.chunks)) << "each entry is one run";
        EXPECT_EQ(op.bytes, SumBytes(op.chunks));
        gathered += op.bytes;
      }
      if (op.kind != TransferKind::kH2D) continue;
      ++copies;
      ASSERT_FALSE(op.chunks.empty());
      EXPECT_EQ(op.bytes, SumBytes(op.chunks));
      for (const ChunkIo& c : op.chunks) EXPECT_TRUE(c.rows.empty()) << "whole new chunks";
      const std::uint32_t chunks = std::uint32_t(op.chunks.size());
      switch (info.strategy) {
        case TransferStrategy::kPerRow:
        case TransferStrategy::kPerChunk:
          EXPECT_EQ(op.method, CopyMethod::kDma);
          EXPECT_FALSE(op.staged);
          EXPECT_EQ(op.ios, chunks);
          break;
        case TransferStrategy::kStagedGather: {
          EXPECT_EQ(op.method, CopyMethod::kDma);
          EXPECT_TRUE(op.staged);
          std::map<KvKind, Bytes> copied, staged;
          for (const ChunkIo& c : op.chunks) copied[c.chunk.kind()] += c.bytes;
          EXPECT_EQ(op.ios, copied.size()) << "one DMA per kind";
          // The gather just before it laid out exactly these bytes, kind by kind.
          const TransferOp* gather = nullptr;
          for (std::size_t j = i; j-- > 0;) {
            if (h[j].is_transfer && h[j].transfer.kind == TransferKind::kCpuGather) {
              gather = &h[j].transfer;
              break;
            }
          }
          ASSERT_NE(gather, nullptr);
          for (const ChunkIo& c : gather->chunks) staged[c.chunk.kind()] += c.bytes;
          EXPECT_EQ(staged, copied);
          break;
        }
        case TransferStrategy::kBatched:
        case TransferStrategy::kDeviceGather:
          EXPECT_EQ(op.method, info.strategy == TransferStrategy::kBatched
                                   ? CopyMethod::kBatched
                                   : CopyMethod::kDeviceGather);
          EXPECT_EQ(op.ios, 1u);
          EXPECT_EQ(op.descriptors, chunks);
          break;
      }
    }
    EXPECT_GT(copies, 0) << "some new chunks took GPU room";
    EXPECT_EQ(gathered, written) << "every new chunk is laid out once, then written";
  }
}

}  // namespace
}  // namespace kvtier
