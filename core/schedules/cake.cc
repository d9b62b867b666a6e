// schedule.policy = cake: Cake's bidirectional loop (Cake, Appendix A). The reusable prefix R
// is cut into cake.chunk_tokens-token chunks. The GPU computes them front to back (chunk c
// attends to chunks 0..c) while I/O loads them back to front (every layer's K and V rows the
// selector's query-free choice keeps) until the two meet: a chunk whose load is still in
// flight when the GPU reaches it is computed and its load abandoned. Then NR and the query
// are computed over all layers, attending to the computed tokens, the loaded rows, NR and Q.
// Where they meet depends on timing: its decision rows are marked timing-dependent.

#include <algorithm>
#include <cmath>
#include <string>

#include "core/options.h"
#include "core/request_run.h"
#include "core/schedule.h"
#include "core/selector.h"

namespace kvtier {
namespace {

class CakeSchedule final : public Schedule {
 public:
  CakeSchedule(const SystemOptions& system, TokenSelector* selector)
      : selector_(selector), chunk_tokens_(system.cake_chunk_tokens) {}

  Status Prefill(RequestRun& run) override {
    const std::int64_t C = chunk_tokens_;
    const std::int64_t n = run.n;
    const int layers = run.model().layers;
    const std::int64_t m = (n + C - 1) / C;
    std::int64_t compute_next = 0;  // chunks [0, compute_next) computed or being computed
    OpId comp = kNoOp;
    std::vector<OpId> loading;
    OpId last_compute = kNoOp;
    std::int64_t computed_chunks = 0, loaded_chunks = 0;
    std::int64_t loading_kept = 0, loaded_kept = 0;  // rows kept per layer: in flight, loaded

    // Every layer's K and V rows of chunk c that the selector keeps, as one group.
    auto load_chunk = [&](std::int64_t c) {
      const Selection sel = selector_->Choose(run, c * C, std::min(n, (c + 1) * C));
      loading_kept = std::llround(sel.Kept());
      LoadPlanner::Group g;
      for (int l = 0; l < layers; ++l) {
        run.planner().Plan(l, KvKind::kKey, sel, /*demand=*/true, &g);
        run.planner().Plan(l, KvKind::kValue, sel, /*demand=*/true, &g);
      }
      // The one submission path: a chunk fully on the GPU needs nothing.
      run.planner().Submit(g, Purpose::kCakeLoad, -1, {});
      return std::move(g.terminal);
    };

    // The GPU computes chunk compute_next unless it is already in memory (a chunk whose load
    // is still in flight is computed, and that load is abandoned); I/O loads chunks back to
    // front until it reaches a chunk the GPU has taken.
    std::int64_t loaded_low = m;  // chunks [loaded_low, m) are loaded
    std::int64_t loading_chunk = -1;
    auto loaded = [&] {
      loaded_low = loading_chunk;
      loading_chunk = -1;
      loaded_kept += loading_kept;
    };
    while (true) {
      if (comp == kNoOp && compute_next < loaded_low) {
        if (compute_next == loading_chunk) {
          run.Abandon(loading);
          loading.clear();
          loading_chunk = -1;
          --loaded_chunks;
          run.log().LogDecision({run.id(), -1, "cake_abandon", 0,
                                 "chunk " + std::to_string(compute_next),
                                 /*timing_dependent=*/true});
        }
        ComputeOp op;
        op.kind = ComputeKind::kChunkPrefill;
        op.new_tokens = std::min(n, (compute_next + 1) * C) - compute_next * C;
        op.context_tokens = std::min(n, (compute_next + 1) * C);
        comp = run.SubmitCompute(op, {last_compute});
        last_compute = comp;
        ++compute_next;
        ++computed_chunks;
      }
      if (loading_chunk < 0 && loaded_low - 1 >= compute_next) {
        loading_chunk = loaded_low - 1;
        ++loaded_chunks;
        loading = load_chunk(loading_chunk);
        run.log().LogDecision({run.id(), -1, "cake_load", 0,
                               "chunk " + std::to_string(loading_chunk),
                               /*timing_dependent=*/true});
        if (loading.empty()) {  // everything was on the GPU already
          loaded();
          continue;
        }
      }
      if (comp == kNoOp && loading.empty()) break;
      std::vector<OpId> waiting;
      if (comp != kNoOp) waiting.push_back(comp);
      waiting.insert(waiting.end(), loading.begin(), loading.end());
      Status done;
      std::size_t idx = run.WaitAny(waiting, &done);
      if (!done.ok()) return done;  // Run retires what is in flight and names the failed op
      if (comp != kNoOp && idx == 0) {
        comp = kNoOp;
      } else {
        loading.erase(std::find(loading.begin(), loading.end(), waiting[idx]));
        if (loading.empty()) loaded();
      }
    }
    run.log().LogDecision({run.id(), -1, "cake_meet", 0,
                           "computed " + std::to_string(computed_chunks) + " loaded " +
                               std::to_string(loaded_chunks) + " of " + std::to_string(m),
                           /*timing_dependent=*/true});
    // They met (compute_next == loaded_low): NR and the query, all layers, attend to the
    // computed chunks' tokens and the rows loaded for the others.
    const std::int64_t context = std::min(n, compute_next * C) + loaded_kept;
    run.rec.important_tokens = context * layers;
    ComputeOp op;
    op.kind = ComputeKind::kChunkPrefill;
    op.new_tokens = run.nr + run.q;
    op.context_tokens = context + run.nr + run.q;
    const OpId tail = run.SubmitCompute(op, {last_compute});
    run.layer_compute.assign(std::size_t(layers), kNoOp);
    run.layer_compute.back() = tail;
    run.layer_gpu_ops.assign(std::size_t(layers), {});
    return Status::OK();
  }

 private:
  TokenSelector* selector_;
  int chunk_tokens_;
};

}  // namespace

std::unique_ptr<Schedule> NewCakeSchedule(const ModelSpec&, const SystemOptions& system,
                                          TokenSelector* selector) {
  return std::make_unique<CakeSchedule>(system, selector);
}

}  // namespace kvtier
