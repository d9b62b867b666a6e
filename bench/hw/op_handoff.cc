// Per-operation hand-off latency of the hw executor: how long an op waits, after the op it
// depends on completed, before it starts -- the fixed cost per op that the simulator's
// `cpu.op_overhead` models (docs/hw-mode.md "Validation").
//
// Chains like the Pipeline's per-layer loads, submitted at once with their dependencies and
// waited on from this (the driving) thread, on the host backend with nothing to pace and
// compute of ~0 s, so every gap is executor overhead:
//   read -> h2d -> compute       a whole chunk read from the SSD, copied, then a layer step
//   read -> gather -> h2d        the rows of 8 chunks gathered, then copied
// For each hand-off it prints the median (and p90) gap between the end of one op and the start
// of the next, the wake-up of the driving thread after the last op (Wait returning), and the
// per-op overhead of a whole chain: (chain latency - the ops' busy time) / ops. Rounds of the
// two chains alternate; medians over all rounds.
//
// Usage: hw_op_handoff [dir] [--chains N] (dir default $KVTIER_BENCH_DIR or /tmp; a real disk).
// Uses only HwExecutor's public interface, so the same source measures any version of the
// executor (run an old and a new build back to back to compare).

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "hw/hw_executor.h"
#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

constexpr int kStored = 512;  // chunks in the store

ModelSpec Model() {
  ModelSpec m;  // smollm2-135m's shapes: K of one token in one layer 384 B, a chunk 24 KiB
  m.name = "smollm2-shape";
  m.layers = 30;
  m.hidden = 576;
  m.heads = 9;
  m.kv_heads = 3;
  m.head_dim = 64;
  m.ffn = 1536;
  m.vocab = 49152;
  m.dtype_bytes = 2;
  m.max_context = 8192;
  return m;
}

ChunkId Id(int i) { return ChunkId::Make(1 + i / 256, KvKind::kKey, 0, std::uint32_t(i % 256)); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(q * double(v.size())))];
}

struct Gaps {
  std::map<std::string, std::vector<double>> us;  // hand-off name -> gaps in microseconds
  void Add(const std::string& name, double seconds) { us[name].push_back(seconds * 1e6); }
};

TransferOp Read(Bytes chunk, std::vector<int> ids) {
  TransferOp op;
  op.kind = TransferKind::kSsdRead;
  op.purpose = Purpose::kDemand;
  op.layer = 0;
  for (int i : ids) op.chunks.push_back({Id(i), chunk, {}, {}});
  op.bytes = chunk * ids.size();
  op.ios = std::uint32_t(ids.size());
  return op;
}

// One read -> h2d -> compute chain; false on an error.
bool ChainCopy(HwExecutor* ex, Bytes chunk, int i, Gaps* g) {
  TransferOp read = Read(chunk, {i % kStored});
  TransferOp h2d = read;
  h2d.kind = TransferKind::kH2D;
  ComputeOp c;
  c.kind = ComputeKind::kLayerPrefill;
  c.layer = 0;
  c.new_tokens = 1;
  c.context_tokens = 1;
  const Seconds t0 = ex->Now();
  const OpId r = ex->Submit(std::move(read), {});
  const OpId h = ex->Submit(std::move(h2d), std::span<const OpId>(&r, 1));
  const OpId k = ex->Submit(c, std::span<const OpId>(&h, 1));
  if (!ex->Wait(k).ok()) return false;
  const Seconds woke = ex->Now();
  const OpTimes tr = ex->Retire(r), th = ex->Retire(h), tk = ex->Retire(k);
  g->Add("read -> h2d", th.start_s - tr.end_s);
  g->Add("h2d -> compute", tk.start_s - th.end_s);
  g->Add("compute -> driver", woke - tk.end_s);
  const double busy =
      (tr.end_s - tr.start_s) + (th.end_s - th.start_s) + (tk.end_s - tk.start_s);
  g->Add("per op (copy chain)", (woke - t0 - busy) / 3);
  return true;
}

// One read (8 chunks) -> gather (half their rows) -> h2d chain; false on an error.
bool ChainGather(HwExecutor* ex, const ModelSpec& m, Bytes chunk, int i, Gaps* g) {
  std::vector<int> ids;
  for (int k = 0; k < 8; ++k) ids.push_back((i * 8 + k) % kStored);
  TransferOp read = Read(chunk, ids);
  TransferOp gather;
  gather.kind = TransferKind::kCpuGather;
  gather.purpose = Purpose::kDemand;
  gather.layer = 0;
  const Bytes row = m.KBytesPerTokenLayer();
  for (int id : ids) {
    ChunkIo c{Id(id), 0, {}, {}};
    for (std::uint16_t r = 0; r < 64; r += 2) c.rows.push_back(r);
    c.bytes = row * c.rows.size();
    gather.bytes += c.bytes;
    gather.chunks.push_back(std::move(c));
  }
  gather.ios = std::uint32_t(ids.size());
  TransferOp h2d = gather;
  h2d.kind = TransferKind::kH2D;
  const Seconds t0 = ex->Now();
  const OpId r = ex->Submit(std::move(read), {});
  const OpId ga = ex->Submit(std::move(gather), std::span<const OpId>(&r, 1));
  const OpId h = ex->Submit(std::move(h2d), std::span<const OpId>(&ga, 1));
  if (!ex->Wait(h).ok()) return false;
  const Seconds woke = ex->Now();
  const OpTimes tr = ex->Retire(r), tg = ex->Retire(ga), th = ex->Retire(h);
  g->Add("read -> gather", tg.start_s - tr.end_s);
  g->Add("gather -> h2d", th.start_s - tg.end_s);
  g->Add("h2d -> driver", woke - th.end_s);
  const double busy =
      (tr.end_s - tr.start_s) + (tg.end_s - tg.start_s) + (th.end_s - th.start_s);
  g->Add("per op (gather chain)", (woke - t0 - busy) / 3);
  return true;
}

int Main(int argc, char** argv) {
  int chains = 400, rounds = 3;
  std::string base;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--chains") == 0 && i + 1 < argc) {
      chains = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      base = argv[i];
    }
  }
  if (base.empty()) {
    const char* env = std::getenv("KVTIER_BENCH_DIR");
    base = env ? env : "/tmp";
  }
  const std::string dir = base + "/kvtier_handoff_bench_" + std::to_string(::getpid());
  const ModelSpec model = Model();
  HardwareOptions hw;  // nothing to pace, compute of ~0 s: every gap is the executor's
  hw.gpu_flops = 1e18;
  hw.gpu_mem_bw = 1e18;
  hw.gpu_kernel_overhead = 0;
  HwExecutorOptions o;
  o.backend = BackendKind::kHost;
  o.store_dir = dir;
  o.store_capacity = Bytes(kStored + 64) * (32 << 10);
  o.max_memory = 256ull << 20;
  o.pace_pcie = false;
  o.chunk_tokens = 64;
  std::unique_ptr<HwExecutor> ex;
  if (Status s = HwExecutor::Create(model, hw, o, &ex); !s.ok()) {
    std::printf("cannot start the executor: %s\n", s.ToString().c_str());
    return 1;
  }
  const Bytes chunk = model.ChunkBytes(64);
  for (int i = 0; i < kStored; ++i) {
    if (Status s = ex->Prepopulate(Id(i), chunk, false); !s.ok()) {
      std::printf("store failed: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  Gaps g;
  bool ok = true;
  for (int round = 0; round < rounds && ok; ++round) {
    for (int i = 0; i < chains && ok; ++i) ok = ChainCopy(ex.get(), chunk, i, &g);
    for (int i = 0; i < chains && ok; ++i) ok = ChainGather(ex.get(), model, chunk, i, &g);
  }
  ex.reset();
  std::filesystem::remove_all(dir);
  if (!ok) {
    std::printf("an op failed\n");
    return 1;
  }
  double load[3] = {0, 0, 0};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    std::fclose(f);
  }
  std::printf("hand-off latency, %d x %d chains of each kind (%ld cpus, load average %.2f)\n",
              rounds, chains, sysconf(_SC_NPROCESSORS_ONLN), load[0]);
  std::printf("%-24s %12s %12s\n", "hand-off", "median us", "p90 us");
  for (const char* name : {"read -> h2d", "h2d -> compute", "compute -> driver", "read -> gather",
                           "gather -> h2d", "h2d -> driver", "per op (copy chain)",
                           "per op (gather chain)"}) {
    const std::vector<double>& v = g.us[name];
    std::printf("%-24s %12.1f %12.1f\n", name, Quantile(v, 0.5), Quantile(v, 0.9));
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::hw

int main(int argc, char** argv) { return kvtier::hw::Main(argc, argv); }
