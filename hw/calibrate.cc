#include "hw/calibrate.h"
#include "hw/op_overhead.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <future>
#include <random>
#include <vector>

#include "hw/arena.h"
#include "hw/chunk_store.h"
#include "hw/device_backend.h"
#include "hw/host_compute.h"
#include "hw/io_engine.h"
#include "hw/posix_util.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::hw {
namespace {

double Seconds(std::int64_t a_ns, std::int64_t b_ns) { return double(b_ns - a_ns) * 1e-9; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Reads `count` random `block`-aligned blocks of the file at queue depth `qd`; returns seconds.
Status TimedReads(int fd, std::uint64_t file_bytes, std::uint64_t block, int qd, int count,
                  IoEngineOptions::Backend backend, std::string* backend_name, double* seconds) {
  IoEngineOptions o;
  o.backend = backend;
  o.max_ops_in_flight = std::uint32_t(qd);
  o.max_bytes_in_flight = std::max<std::uint64_t>(std::uint64_t(qd) * block, block);
  o.prefetch_max_ops = o.max_ops_in_flight;
  o.prefetch_max_bytes = o.max_bytes_in_flight;
  o.max_io_bytes = std::max<std::uint64_t>(block, 1 << 20);
  o.pread_threads = std::uint32_t(std::min(qd, 32));
  o.start_paused = true;
  std::unique_ptr<IoEngine> io;
  KVTIER_RETURN_IF_ERROR(IoEngine::Create(fd, o, &io));
  *backend_name = std::string(io->backend_name());
  // Distinct destinations (qd * 2 blocks, cycled) so nothing is a hot buffer.
  const std::size_t bufs = std::size_t(std::max(2 * qd, 2));
  AlignedBuffer mem = AllocateAligned(bufs * block, 4096);
  if (!mem) return Status::OutOfSpace("calibrate: cannot allocate read buffers");
  std::mt19937_64 rng(42);
  const std::uint64_t blocks = file_bytes / block;
  std::atomic<int> left{count};
  std::promise<void> all;
  Status first;
  std::mutex mu;
  for (int i = 0; i < count; ++i) {
    ReadRequest r;
    r.chunk_id = ChunkId{std::uint64_t(i)};
    r.offset = (rng() % blocks) * block;
    r.length = block;
    r.dst = mem.get() + (std::size_t(i) % bufs) * block;
    r.on_complete = [&](const ReadResult& res) {
      if (!res.status.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (first.ok()) first = res.status;
      }
      if (left.fetch_sub(1) == 1) all.set_value();
    };
    io->Submit(std::move(r));
  }
  const std::int64_t t0 = MonotonicNowNs();
  io->Resume();
  all.get_future().wait();
  *seconds = Seconds(t0, MonotonicNowNs());
  return first;
}

// Copies `block`-sized pieces from `src` to `dst` arenas (each `bytes`), cycling, for at least
// `total` bytes. Returns bytes/s.
double CopyBw(std::byte* dst, const std::byte* src, std::uint64_t bytes, std::uint64_t block,
              std::uint64_t total) {
  const std::uint64_t pieces = bytes / block;
  const std::int64_t t0 = MonotonicNowNs();
  std::uint64_t done = 0, i = 0;
  while (done < total) {
    const std::uint64_t off = (i++ % pieces) * block;
    std::memcpy(dst + off, src + ((off + bytes / 2) % (pieces * block)), block);
    done += block;
  }
  return double(done) / Seconds(t0, MonotonicNowNs());
}

std::string Fmt(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

}  // namespace

Status Calibrate(const CalibrateOptions& options, CalibrateResult* out) {
  CalibrateResult r;
  const std::int64_t start = MonotonicNowNs();
  const bool q = options.quick;
  const std::uint64_t block = RoundUp(std::max<std::uint64_t>(options.block, 4096), 4096);
  const std::uint64_t file_bytes = RoundUp(q ? (64ull << 20) : (512ull << 20), block);
  std::filesystem::create_directories(options.dir);
  const std::string path = options.dir + "/kvtier_calibrate.dat";

  // --- SSD write: chunk-sized ChunkStore::Put records (what the pipeline's stores do: O_DIRECT
  // from a bounce buffer, one record at a time, manifest appended; sync off as in kvtier hw),
  // then the read file: sequential O_DIRECT 1 MiB writes.
  {
    ChunkStoreOptions so;
    so.dir = options.dir + "/kvtier_calibrate_store";
    so.capacity_bytes = q ? (64ull << 20) : (256ull << 20);
    so.allow_buffered = options.allow_buffered;
    so.sync = false;
    std::filesystem::remove_all(so.dir);
    std::unique_ptr<ChunkStore> store;
    Status s = ChunkStore::Open(so, &store);
    if (s.code() == Status::Code::kUnavailable) {
      return Status::Unavailable(s.message() + " (measure a real disk or pass --allow-buffered)");
    }
    KVTIER_RETURN_IF_ERROR(s);
    r.direct_io = store->direct_io();
    std::vector<std::byte> rec(options.block);
    std::mt19937_64 rng(3);
    for (auto& b : rec) b = std::byte(rng());
    const std::uint64_t n = (so.capacity_bytes / 2) / RoundUp(options.block, 4096);
    const std::int64_t t0 = MonotonicNowNs();
    for (std::uint64_t i = 0; i < n; ++i) {
      KVTIER_RETURN_IF_ERROR(store->Put(ChunkId{i}, rec));
    }
    r.ssd_write_bw = double(n) * double(options.block) / Seconds(t0, MonotonicNowNs());
    store.reset();
    std::filesystem::remove_all(so.dir);
  }
  {
    int flags = O_CREAT | O_TRUNC | O_WRONLY | (r.direct_io ? O_DIRECT : 0);
    UniqueFd fd(::open(path.c_str(), flags, 0644));
    if (!fd.valid()) return Status::IoError(path + ": open: " + ErrnoText(errno));
    const std::uint64_t wblock = 1 << 20;
    AlignedBuffer buf = AllocateAligned(wblock, 4096);
    std::mt19937_64 rng(7);
    for (std::uint64_t i = 0; i < wblock; i += 8) {
      const std::uint64_t v = rng();
      std::memcpy(buf.get() + i, &v, 8);
    }
    for (std::uint64_t off = 0; off < file_bytes; off += wblock) {
      if (::pwrite(fd.get(), buf.get(), std::min(wblock, file_bytes - off), off_t(off)) < 0) {
        return Status::IoError(path + ": pwrite: " + ErrnoText(errno));
      }
    }
    ::fdatasync(fd.get());
  }

  // --- SSD reads through the engine: QD1 (latency) and QD N (bandwidth), interleaved reps.
  {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | (r.direct_io ? O_DIRECT : 0)));
    if (!fd.valid()) return Status::IoError(path + ": open: " + ErrnoText(errno));
    const int reps = q ? 1 : 3;
    const int n_qd = int(std::min<std::uint64_t>(q ? 1500 : 6000, 4 * file_bytes / block));
    const int n_1 = q ? 150 : 600;
    std::vector<double> bw, bw1;
    for (int rep = 0; rep < reps; ++rep) {
      double s = 0;
      KVTIER_RETURN_IF_ERROR(TimedReads(fd.get(), file_bytes, block, options.queue_depth, n_qd,
                                        IoEngineOptions::Backend::kAuto, &r.io_backend, &s));
      bw.push_back(double(n_qd) * double(block) / s);
      KVTIER_RETURN_IF_ERROR(TimedReads(fd.get(), file_bytes, block, 1, n_1,
                                        IoEngineOptions::Backend::kAuto, &r.io_backend, &s));
      bw1.push_back(double(n_1) * double(block) / s);
    }
    r.ssd_read_bw = Median(bw);
    r.ssd_qd1_bw = Median(bw1);
    const double per_io = double(block) / r.ssd_qd1_bw;
    r.ssd_latency_s = std::max(1e-6, per_io - double(block) / r.ssd_read_bw);
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);

  // --- Memory: cold block copies between two arenas; gathers of half the rows of chunks.
  const std::uint64_t arena = q ? (32ull << 20) : (256ull << 20);
  std::unique_ptr<HostArena> a, b;
  HostArenaOptions ho;
  ho.slot_bytes = arena;
  ho.slot_count = 1;
  KVTIER_RETURN_IF_ERROR(HostArena::Create(ho, &a));
  KVTIER_RETURN_IF_ERROR(HostArena::Create(ho, &b));
  std::memset(a->base(), 1, arena);
  const std::uint64_t copy_total = q ? (256ull << 20) : (2048ull << 20);
  r.memcpy_bw = CopyBw(b->base(), a->base(), arena, block, copy_total);
  {
    const std::uint64_t row = std::max<std::uint64_t>(8, options.row_bytes);
    const std::uint64_t rows_per_chunk = 64, chunk = rows_per_chunk * row;
    const std::uint64_t chunks = arena / chunk;
    const std::int64_t t0 = MonotonicNowNs();
    std::uint64_t moved = 0, out = 0;
    for (std::uint64_t pass = 0; moved < copy_total / 2; ++pass) {
      for (std::uint64_t c = 0; c < chunks && moved < copy_total / 2; ++c) {
        const std::byte* src = a->base() + c * chunk;
        for (std::uint64_t k = pass % 2; k < rows_per_chunk; k += 2) {
          if (out + row > arena) out = 0;
          std::memcpy(b->base() + out, src + k * row, row);
          out += row;
          moved += row;
        }
      }
    }
    r.gather_bw = double(moved) / Seconds(t0, MonotonicNowNs());
  }
  r.backend = "host";
  r.h2d_bw = r.d2h_bw = r.memcpy_bw;  // host backend: copies into the "device" arena are memcpy
  {
    const std::uint64_t small = 4096;
    const int n = q ? 20000 : 100000;
    const std::int64_t t0 = MonotonicNowNs();
    for (int i = 0; i < n; ++i) {
      const std::uint64_t off = (std::uint64_t(i) * small * 17) % (arena - small);
      std::memcpy(b->base() + off, a->base() + (arena - small - off), small);
    }
    const double per = Seconds(t0, MonotonicNowNs()) / n;
    r.pcie_latency_s = std::max(0.0, per - double(small) / r.memcpy_bw);
  }
  r.mem_bw = r.memcpy_bw;
  r.gemm_flops = HostCompute::MeasureGemmFlops(256, 1536, 576, q ? 3 : 10);
  {
    // Per compute step on the host backend: handing a job to a persistent worker thread and
    // being woken when it is done (what every HwExecutor op pays), median of n round trips.
    std::mutex mu;
    std::condition_variable cv;
    std::int64_t posted = 0, ran = 0;
    bool stop = false;
    std::thread worker([&] {
      std::unique_lock<std::mutex> l(mu);
      while (true) {
        cv.wait(l, [&] { return stop || posted > ran; });
        if (stop) return;
        ran = posted;
        cv.notify_all();
      }
    });
    std::vector<double> rt;
    const int n = q ? 200 : 2000;
    for (int i = 0; i < n; ++i) {
      std::unique_lock<std::mutex> l(mu);
      const std::int64_t t0 = MonotonicNowNs();
      posted = t0;
      cv.notify_all();
      cv.wait(l, [&] { return ran == posted; });
      rt.push_back(Seconds(t0, MonotonicNowNs()));
    }
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
    r.kernel_overhead_s = Median(rt);
  }
  // The executor's per-op overhead, through the executor (hw/op_overhead.h).
  KVTIER_RETURN_IF_ERROR(MeasureOpOverhead(options.dir, q ? 200 : 1000, &r.op_overhead_s));
  r.gpu_name = "host-cpu";

#if KVTIER_HAVE_CUDA
  if (CudaDevicePresent()) {
    r.backend = "cuda";
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    r.gpu_name = prop.name;
    const std::size_t big = q ? (64u << 20) : (256u << 20);
    void *host = nullptr, *dev = nullptr, *dev2 = nullptr;
    if (cudaMallocHost(&host, big) != cudaSuccess || cudaMalloc(&dev, big) != cudaSuccess ||
        cudaMalloc(&dev2, big) != cudaSuccess) {
      return Status::CudaError("calibrate: cannot allocate pinned/device buffers");
    }
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    auto timed = [&](auto&& body) {
      cudaEventRecord(e0, s);
      body();
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      return double(ms) * 1e-3;
    };
    const int reps = q ? 4 : 16;
    const std::size_t pieces = big / block;
    double t = timed([&] {
      for (int i = 0; i < reps; ++i)
        for (std::size_t p = 0; p < pieces; ++p)
          cudaMemcpyAsync(static_cast<char*>(dev) + p * block, static_cast<char*>(host) + p * block,
                          block, cudaMemcpyHostToDevice, s);
    });
    r.h2d_bw = double(reps) * double(pieces * block) / t;
    t = timed([&] {
      for (int i = 0; i < reps; ++i)
        for (std::size_t p = 0; p < pieces; ++p)
          cudaMemcpyAsync(static_cast<char*>(host) + p * block, static_cast<char*>(dev) + p * block,
                          block, cudaMemcpyDeviceToHost, s);
    });
    r.d2h_bw = double(reps) * double(pieces * block) / t;
    const int n_small = q ? 2000 : 20000;
    t = timed([&] {
      for (int i = 0; i < n_small; ++i)
        cudaMemcpyAsync(static_cast<char*>(dev) + (i % 1024) * 4096, host, 4096,
                        cudaMemcpyHostToDevice, s);
    });
    r.pcie_latency_s = std::max(0.0, t / n_small - 4096.0 / r.h2d_bw);
    t = timed([&] { cudaMemcpyAsync(dev2, dev, big, cudaMemcpyDeviceToDevice, s); });
    r.mem_bw = 2.0 * double(big) / t;  // read + write
    r.gemm_flops = 0;  // cuBLAS measurement lives in the kernels tests; keep datasheet flops
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(s);
    cudaFreeHost(host);
    cudaFree(dev);
    cudaFree(dev2);
  }
#endif
  r.seconds = Seconds(start, MonotonicNowNs());
  *out = r;
  return Status::OK();
}

std::string ProfileIni(const CalibrateOptions& o, const CalibrateResult& r) {
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string name = o.name.empty() ? std::string("calibrated-") + host : o.name;
  std::string s;
  s += "; Measured by `kvtier calibrate` (hw/calibrate.h): " + r.backend + " backend, " +
       r.io_backend + (r.direct_io ? " O_DIRECT" : " BUFFERED (not a real SSD measurement)") +
       ", block " + std::to_string(o.block) + " B at QD " + std::to_string(o.queue_depth) +
       (o.quick ? ", --quick" : "") + ", " + Fmt("%.1f", r.seconds) + " s.\n";
  s += "; QD1 read bandwidth " + Fmt("%.3f", r.ssd_qd1_bw / 1e9) + " GB/s.\n";
  s += "[hardware]\nname = " + name + "\nsource = kvtier calibrate " + date + " on " + host + "\n\n";
  s += "[ssd]\nread_bw = " + Fmt("%.4fGB/s", r.ssd_read_bw / 1e9) + "\nwrite_bw = " +
       Fmt("%.4fGB/s", r.ssd_write_bw / 1e9) + "\nlatency = " + Fmt("%.2fus", r.ssd_latency_s * 1e6) +
       "\nqueue_depth = " + std::to_string(o.queue_depth) + "\n\n";
  // op_overhead: the executor's own time between the ops of a read -> h2d -> compute chain,
  // per transfer op (hw/op_overhead.h).
  s += "[cpu]\nmemcpy_bw = " + Fmt("%.4fGB/s", r.memcpy_bw / 1e9) + "\ngather_bw = " +
       Fmt("%.4fGB/s", r.gather_bw / 1e9) + "\nop_overhead = " +
       Fmt("%.3fus", r.op_overhead_s * 1e6) + "\n\n";
  s += "[pcie]\nh2d_bw = " + Fmt("%.4fGB/s", r.h2d_bw / 1e9) + "\nd2h_bw = " +
       Fmt("%.4fGB/s", r.d2h_bw / 1e9) + "\nlatency = " + Fmt("%.3fus", r.pcie_latency_s * 1e6) +
       "\n\n";
  s += "[gpu]\nname = " + r.gpu_name + "\n";
  if (r.gemm_flops > 0) {
    s += "flops = " + Fmt("%.3fGFLOP/s", r.gemm_flops / 1e9) + "\nefficiency = 1.0\n";
  }
  s += "mem_bw = " + Fmt("%.4fGB/s", r.mem_bw / 1e9) + "\nkernel_overhead = " +
       Fmt("%.3fus", r.kernel_overhead_s * 1e6) + "\nconcurrent_prefills = 1\n";
  if (!o.layer_table.empty()) {
    s += "; measured per-layer-step times of the host backend's real compute (kvtier calibrate\n"
         "; --layer-table); relative to this file; they are for one model only\n"
         "layer_table = " + o.layer_table + "\n";
  }
  return s;
}

Status MeasureLayerTable(const ModelSpec& model, int probe_heads, bool quick,
                         double step_overhead_s, LayerTable* out) {
  LayerTable t;
  HostCompute compute(model);
  const int reps = quick ? 1 : 3;
  const int heads = std::clamp(probe_heads, 1, model.kv_heads);
  auto time_op = [&](const ComputeOp& op) {
    compute.Run(op);  // warm-up: allocates the keys/values and the LM head at this size
    std::vector<double> s;
    for (int i = 0; i < reps; ++i) {
      const std::int64_t t0 = MonotonicNowNs();
      compute.Run(op);
      s.push_back(Seconds(t0, MonotonicNowNs()));
    }
    return Median(s) + step_overhead_s;
  };
  auto add = [&](LayerStepKind kind, std::int64_t n, std::int64_t m, int h) {
    if (m > model.max_context) return;
    ComputeOp op;
    op.new_tokens = n;
    op.context_tokens = m;
    op.heads = h;
    switch (kind) {
      case LayerStepKind::kLayerPrefill:
      case LayerStepKind::kDecodeLayer:
        op.kind = ComputeKind::kLayerPrefill;
        break;
      case LayerStepKind::kProbeScores:
        op.kind = ComputeKind::kProbeScores;
        break;
      case LayerStepKind::kFullScores:
        op.kind = ComputeKind::kFullScores;
        break;
      case LayerStepKind::kOutputLayer:
        op.kind = ComputeKind::kOutputLayer;
        break;
    }
    LayerTablePoint p;
    p.kind = kind;
    p.new_tokens = n;
    p.context_tokens = m;
    p.heads = h;
    p.seconds = time_op(op);
    t.points.push_back(p);
  };
  const std::vector<std::int64_t> news =
      quick ? std::vector<std::int64_t>{32, 256} : std::vector<std::int64_t>{32, 128, 512};
  const std::vector<std::int64_t> kept =
      quick ? std::vector<std::int64_t>{0, 1024} : std::vector<std::int64_t>{0, 512, 2048};
  for (std::int64_t n : news) {
    for (std::int64_t k : kept) add(LayerStepKind::kLayerPrefill, n, n + k, 0);
  }
  for (std::int64_t m :
       quick ? std::vector<std::int64_t>{256, 2048} : std::vector<std::int64_t>{128, 1024, 4096}) {
    add(LayerStepKind::kDecodeLayer, 1, m, 0);
  }
  const std::vector<std::int64_t> score_n =
      quick ? std::vector<std::int64_t>{32, 256} : std::vector<std::int64_t>{32, 512};
  const std::vector<std::int64_t> score_m =
      quick ? std::vector<std::int64_t>{512, 2048} : std::vector<std::int64_t>{512, 4096};
  for (std::int64_t n : score_n) {
    for (std::int64_t m : score_m) {
      add(LayerStepKind::kProbeScores, n, m, heads);
      add(LayerStepKind::kFullScores, n, m, 0);
    }
  }
  add(LayerStepKind::kOutputLayer, 1, 1, 0);

  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  t.meta["model"] = model.name;
  t.meta["source"] = std::string("kvtier calibrate ") + date + " on " + host +
                     ": host backend real compute (Eigen fp32, one thread), median of " +
                     std::to_string(reps) + (quick ? " (--quick)" : "") + ", plus " +
                     Fmt("%.3fus", step_overhead_s * 1e6) + " per-op hand-off";
  *out = std::move(t);
  return Status::OK();
}

}  // namespace kvtier::hw
