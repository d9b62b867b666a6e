// Disk reads *in the pipeline's executor* against fio: HwExecutor SSD-read ops (each a layer's
// worth of 32 chunk reads, demand class, header-checked, two ops in flight so the engine's queue
// depth 32 stays full) on the ChunkStore's own data file, against fio randread on the same file,
// same block size (one 64 KiB chunk), iodepth 32, direct=1, ioengine=io_uring. Runs are
// interleaved (executor, fio, ...) and medians reported; prints the ratio executor/fio
// (target >= 0.9). Exit 77 when fio is absent.
//
// Usage: hw_executor_reads_vs_fio [dir] (default $KVTIER_BENCH_DIR or /tmp; a real disk).

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "hw/hw_executor.h"
#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

constexpr int kChunks = 4096;          // 4096 x 64 KiB = 256 MiB of stored chunks
constexpr int kChunksPerOp = 32;
constexpr double kSecondsPerRun = 3;
constexpr int kReps = 3;

ModelSpec Model() {
  ModelSpec m;
  m.name = "bench";
  m.layers = 32;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = 64;
  m.ffn = 1024;
  m.vocab = 1000;
  m.dtype_bytes = 2;
  m.max_context = 8192;
  return m;  // K of one token in one layer: 1 KiB; a 64-token chunk: 64 KiB
}

ChunkId Id(int i) { return ChunkId::Make(1 + i / 1024, KvKind::kKey, 0, std::uint32_t(i % 1024)); }

double RunExecutor(HwExecutor* ex, Bytes chunk) {
  std::mt19937 rng(std::random_device{}());
  auto make = [&] {
    TransferOp op;
    op.kind = TransferKind::kSsdRead;
    op.purpose = Purpose::kDemand;
    for (int i = 0; i < kChunksPerOp; ++i) {
      ChunkIo io;
      io.chunk = Id(int(rng() % kChunks));
      io.bytes = chunk;
      op.chunks.push_back(std::move(io));
    }
    op.bytes = chunk * kChunksPerOp;
    op.ios = kChunksPerOp;
    return op;
  };
  const std::int64_t t0 = MonotonicNowNs();
  std::vector<OpId> inflight = {ex->Submit(make(), {}), ex->Submit(make(), {})};
  double bytes = 0;
  while (true) {
    const std::size_t i = ex->WaitAny(inflight);
    if (!ex->Wait(inflight[i]).ok()) return -1;
    ex->Retire(inflight[i]);
    bytes += double(chunk) * kChunksPerOp;
    if ((MonotonicNowNs() - t0) / 1e9 >= kSecondsPerRun) {
      inflight.erase(inflight.begin() + long(i));
      break;
    }
    inflight[i] = ex->Submit(make(), {});
  }
  for (OpId id : inflight) {
    ex->Wait(id);
    ex->Retire(id);
    bytes += double(chunk) * kChunksPerOp;
  }
  return bytes / ((MonotonicNowNs() - t0) / 1e9) / 1e9;
}

double RunFio(const std::string& file, Bytes bs, Bytes size) {
  const std::string cmd = "fio --name=kvtier --filename=" + file + " --rw=randread --bs=" +
                          std::to_string(bs) + " --iodepth=32 --direct=1 --ioengine=io_uring" +
                          " --size=" + std::to_string(size) + " --runtime=" +
                          std::to_string(int(kSecondsPerRun)) +
                          " --time_based --randrepeat=0 --readonly --output-format=json 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0) return -1;
  const size_t at = out.find("\"bw_bytes\"");
  if (at == std::string::npos) return -1;
  return std::strtod(out.c_str() + out.find(':', at) + 1, nullptr) / 1e9;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  if (std::system("command -v fio >/dev/null 2>&1") != 0) {
    std::printf("SKIP: fio not found on PATH\n");
    return 77;
  }
  const char* env = std::getenv("KVTIER_BENCH_DIR");
  const std::string dir = std::string(argc > 1 ? argv[1] : (env ? env : "/tmp")) +
                          "/kvtier_exec_bench_" + std::to_string(::getpid());
  const ModelSpec model = Model();
  HwExecutorOptions o;
  o.backend = BackendKind::kHost;
  o.store_dir = dir;
  o.store_capacity = Bytes(kChunks + 64) * (64 << 10);
  o.max_memory = 512ull << 20;
  o.queue_depth = 32;
  o.chunk_tokens = 64;
  std::unique_ptr<HwExecutor> ex;
  if (Status s = HwExecutor::Create(model, HardwareOptions{}, o, &ex); !s.ok()) {
    std::printf("cannot start the executor: %s\n", s.ToString().c_str());
    return 1;
  }
  const Bytes chunk = model.ChunkBytes(64);
  std::printf("storing %d chunks of %llu KiB in %s (%s)\n", kChunks,
              (unsigned long long)(chunk >> 10), dir.c_str(), ex->io_backend_name().c_str());
  for (int i = 0; i < kChunks; ++i) {
    if (Status s = ex->Prepopulate(Id(i), chunk, false); !s.ok()) {
      std::printf("store failed: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::vector<double> e, f;
  for (int rep = 0; rep < kReps; ++rep) {
    e.push_back(RunExecutor(ex.get(), chunk));
    f.push_back(RunFio(ex->store_path(), chunk, Bytes(kChunks) * chunk));
  }
  auto list = [](const std::vector<double>& v) {
    std::string s;
    for (double x : v) s += (s.empty() ? "" : " ") + std::to_string(x).substr(0, 4);
    return s;
  };
  const double me = Median(e), mf = Median(f);
  std::printf("%-14s %-30s %-30s %s\n", "config", "executor GB/s (median [runs])",
              "fio GB/s (median [runs])", "ratio");
  std::printf("%-14s %.2f [%s]%*s %.2f [%s]%*s %.2f\n", "64K QD32", me, list(e).c_str(), 10, "",
              mf, list(f).c_str(), 10, "", mf > 0 ? me / mf : 0.0);
  ex.reset();
  std::filesystem::remove_all(dir);
  return me > 0 && mf > 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::hw

int main(int argc, char** argv) { return kvtier::hw::Main(argc, argv); }
