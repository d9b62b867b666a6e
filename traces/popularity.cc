#include "traces/popularity.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/cache_policy.h"
#include "core/check.h"
#include "core/errors.h"
#include "core/radix_tree.h"
#include "core/schedule.h"
#include "core/stored_layout.h"
#include "core/tiered_cache.h"

namespace kvtier {
namespace {

// Bytes of one (segment, chunk) over every layer and KV kind the system stores.
Bytes GroupBytes(const ModelSpec& m, const StoredLayout& layout, int tokens) {
  Bytes per_layer = 0;
  for (KvKind kind : layout.kinds()) per_layer += Bytes(tokens) * layout.TokenBytes(kind);
  return per_layer * Bytes(m.layers);
}

}  // namespace

HitRatios EstimateHitRatios(const WorkloadParams& w, const ExperimentOptions& opt) {
  const SystemOptions& sys = opt.system;
  KVTIER_CHECK(FindSchedule(sys.schedule).reuses,
               "EstimateHitRatios needs a system that reuses KV");
  std::vector<TraceRecord> records;
  GenerateRecords(w, nullptr, [&](const TraceRecord& r) { records.push_back(r); });
  HitRatios out;
  if (records.empty()) return out;
  RadixTree tree(records.front().request.tokens_per_symbol, sys.chunk_tokens);
  TieredCache cache(NewCachePolicy(sys.cache_policy, "cache.policy"), sys.cache);
  const StoredLayout layout = StoredLayout::Of(opt.model, sys);
  std::vector<CacheMove> moves;
  auto chunk_bytes = [&](const Segment& seg, std::uint32_t c) {
    return GroupBytes(opt.model, layout, seg.TokensInChunk(c, sys.chunk_tokens));
  };
  if (opt.run.prewarm) {  // as Pipeline::Prewarm: every prefix, in trace order, GPU then CPU
    for (const TraceRecord& r : records) {
      const Match match = tree.Lookup(r.request.prefix);
      const std::uint32_t id = tree.Insert(r.request.prefix, match);
      if (id == 0) continue;
      const Segment* seg = tree.FindSegment(id);
      for (std::uint32_t c = 0; c < seg->num_chunks; ++c) {
        const ChunkId chunk = ChunkId::Make(id, KvKind::kKey, 0, c);
        moves.clear();
        if (!cache.Insert(chunk, chunk_bytes(*seg, c), Tier::kGpu, &moves)) {
          cache.Insert(chunk, chunk_bytes(*seg, c), Tier::kCpu, &moves);
        }
      }
    }
  }
  std::int64_t hits[3] = {0, 0, 0};  // gpu, cpu, ssd
  const std::int64_t per_group =
      std::int64_t(opt.model.layers) * std::int64_t(layout.kinds().size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Request& q = records[i].request;
    const Match match = tree.Lookup(q.prefix);
    for (const MatchPiece& piece : match.pieces) {
      const Segment* seg = tree.FindSegment(piece.segment);
      const std::int64_t len = piece.prefix_end - piece.prefix_begin;
      if (len <= 0) continue;
      const std::uint32_t first = seg->ChunkOf(piece.segment_begin, sys.chunk_tokens);
      const std::uint32_t last = seg->ChunkOf(piece.segment_begin + len - 1, sys.chunk_tokens);
      for (std::uint32_t c = first; c <= last; ++c) {
        moves.clear();
        const Tier t = cache.Access(ChunkId::Make(piece.segment, KvKind::kKey, 0, c),
                                    chunk_bytes(*seg, c), sys.retention, &moves);
        if (std::int64_t(i) >= opt.run.warmup_requests) {
          hits[t == Tier::kGpu ? 0 : t == Tier::kCpu ? 1 : 2] += per_group;
        }
      }
    }
    tree.Insert(q.prefix, match);  // the new part is stored (to the SSD, store_new)
  }
  out.accesses = hits[0] + hits[1] + hits[2];
  if (out.accesses > 0) {
    out.gpu = double(hits[0]) / double(out.accesses);
    out.cpu = double(hits[1]) / double(out.accesses);
    out.ssd = double(hits[2]) / double(out.accesses);
  }
  return out;
}

PopularitySolution SolvePopularitySd(WorkloadParams w, const ExperimentOptions& opt,
                                     double target, double lo, double hi, int iterations) {
  if (w.kind != "fewshot") throw InputError("popularity_sd: only few-shot workloads have one");
  if (!(target > 0 && target < 1)) throw InputError("target GPU hit ratio: must be in (0, 1)");
  auto at = [&](double sd) {
    w.popularity_sd = sd;
    return EstimateHitRatios(w, opt);
  };
  const HitRatios a = at(lo), b = at(hi);
  if (!(a.gpu >= target && b.gpu <= target)) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "target GPU hit ratio %.3f is outside what popularity_sd in [%g, %g] gives "
                  "(%.3f .. %.3f)", target, lo, hi, a.gpu, b.gpu);
    throw InputError(msg);
  }
  PopularitySolution s;
  // Bisection in log(sd): the ratio falls with the spread over several decades.
  double l = std::log(lo), h = std::log(hi);
  for (s.iterations = 0; s.iterations < iterations; ++s.iterations) {
    const double mid = (l + h) / 2;
    (at(std::exp(mid)).gpu > target ? l : h) = mid;
  }
  s.popularity_sd = std::exp((l + h) / 2);
  s.achieved = at(s.popularity_sd);
  return s;
}

}  // namespace kvtier
