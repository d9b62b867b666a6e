#include "hw/calibrate.h"
#include "hw/op_overhead.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "hw/arena.h"
#include "hw/calibrate_cuda.h"
#include "hw/chunk_store.h"
#include "hw/device_backend.h"
#include "hw/host_compute.h"
#include "hw/io_engine.h"
#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

double Seconds(std::int64_t a_ns, std::int64_t b_ns) { return double(b_ns - a_ns) * 1e-9; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Fmt(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

std::string SizeName(double bytes) {
  if (bytes >= (1 << 20) && std::fmod(bytes, 1 << 20) == 0) return Fmt("%.0f MiB", bytes / (1 << 20));
  if (bytes >= 1024 && std::fmod(bytes, 1024) == 0) return Fmt("%.0f KiB", bytes / 1024);
  return Fmt("%.0f B", bytes);
}

// The 1, 5 and 15-minute load averages ("" where /proc/loadavg is absent): a shared machine's
// numbers are only comparable at similar load, so the profile records them.
std::string LoadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "";
  double a = 0, b = 0, c = 0;
  const int n = std::fscanf(f, "%lf %lf %lf", &a, &b, &c);
  std::fclose(f);
  if (n != 3) return "";
  char t[64];
  std::snprintf(t, sizeof t, "%.2f %.2f %.2f", a, b, c);
  return t;
}

void Progress(const CalibrateOptions& o, const std::string& line) {
  if (o.progress) o.progress(line);
}

struct Read {
  std::uint64_t offset = 0, length = 0;
};

// Reads `reads` (aligned offsets and lengths, each <= max_len) through a fresh IoEngine at
// queue depth `qd`, all queued first and released at once; returns the seconds from the
// release to the last completion.
Status TimedReadList(int fd, const std::vector<Read>& reads, std::uint64_t max_len, int qd,
                     std::string* backend_name, double* seconds) {
  IoEngineOptions o;
  o.backend = IoEngineOptions::Backend::kAuto;
  o.max_ops_in_flight = std::uint32_t(qd);
  o.max_bytes_in_flight = std::max<std::uint64_t>(std::uint64_t(qd) * max_len, max_len);
  o.prefetch_max_ops = o.max_ops_in_flight;
  o.prefetch_max_bytes = o.max_bytes_in_flight;
  o.max_io_bytes = std::max<std::uint64_t>(max_len, 1 << 20);
  o.pread_threads = std::uint32_t(std::min(qd, 32));
  o.start_paused = true;
  std::unique_ptr<IoEngine> io;
  KVTIER_RETURN_IF_ERROR(IoEngine::Create(fd, o, &io));
  *backend_name = std::string(io->backend_name());
  // Distinct destinations (qd * 2 buffers, cycled) so nothing is a hot buffer.
  const std::size_t bufs = std::size_t(std::max(2 * qd, 2));
  AlignedBuffer mem = AllocateAligned(bufs * max_len, 4096);
  if (!mem) return Status::OutOfSpace("calibrate: cannot allocate read buffers");
  std::atomic<std::size_t> left{reads.size()};
  std::promise<void> all;
  Status first;
  std::mutex mu;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    ReadRequest r;
    r.chunk_id = ChunkId{std::uint64_t(i)};
    r.offset = reads[i].offset;
    r.length = reads[i].length;
    r.dst = mem.get() + (i % bufs) * max_len;
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

// `count` random whole blocks of the file.
std::vector<Read> RandomBlocks(std::uint64_t file_bytes, std::uint64_t block, int count,
                               std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::uint64_t blocks = file_bytes / block;
  std::vector<Read> v;
  for (int i = 0; i < count; ++i) v.push_back({(rng() % blocks) * block, block});
  return v;
}

// Copies `block`-sized pieces from `src` to `dst` arenas (each `bytes`), cycling, for at least
// `total` bytes. Returns bytes/s.
double CopyBw(std::byte* dst, const std::byte* src, std::uint64_t bytes, std::uint64_t block,
              std::uint64_t total) {
  const std::uint64_t pieces = bytes / block;
  const std::int64_t t0 = MonotonicNowNs();
  std::uint64_t done = 0, i = 0;
  while (done < total) {
    // The source piece half the arena away from the destination's, whole pieces only: an
    // offset of off + bytes / 2 that is not a multiple of `block` ran up to a block past the
    // arena's end (calibrate --quick: 32 MiB arena, 24 KiB chunks, SIGSEGV).
    const std::uint64_t off = (i % pieces) * block;
    const std::uint64_t from = ((i + pieces / 2) % pieces) * block;
    ++i;
    std::memcpy(dst + off, src + from, block);
    done += block;
  }
  return double(done) / Seconds(t0, MonotonicNowNs());
}

// The offset of the i-th of a cycle of `size`-byte pieces in an arena of `arena` bytes: steps
// of a whole number of 4 KiB pages larger than `size`, so consecutive pieces never share a
// cache line and the cycle runs through the whole arena before a piece comes back.
std::uint64_t CycleOffset(std::uint64_t i, std::uint64_t size, std::uint64_t arena) {
  const std::uint64_t step = RoundUp(size, 4096) + 4096;
  const std::uint64_t slots = std::max<std::uint64_t>(1, (arena - size) / step);
  return (i % slots) * step;
}

// The copy curve on the host backend: memcpys of `size` bytes from a host arena into the
// "device" arena (what host_backend.cc's Copy does per piece), cycling through both, for at
// least `min_calls` calls and `min_s` seconds. Each sample spans many of this VM's throttling
// periods: single 16 MiB copies alternate between ~7.5 and ~2.7 GB/s in time (a host-side
// duty cycle of a few ms), so a sample of one or two periods lands in either mode.
CopySample HostCopy(std::byte* dst, const std::byte* src, std::uint64_t arena, std::uint64_t size,
                    std::uint64_t min_calls, double min_s) {
  const std::int64_t t0 = MonotonicNowNs();
  const std::int64_t until = t0 + std::int64_t(min_s * 1e9);
  std::uint64_t i = 0;
  while (i < min_calls || (i % 16 != 0) || MonotonicNowNs() < until) {
    const std::uint64_t so = CycleOffset(i, size, arena);
    const std::uint64_t d = CycleOffset(i * 7 + 3, size, arena);
    std::memcpy(dst + d, src + so, size);
    ++i;
  }
  return {double(size), double(i), Seconds(t0, MonotonicNowNs())};
}

// One gather sample: chunks of 64 rows of `row` bytes in `src`; from each, `k` rows -- spread
// (every 64/k-th row: k runs) or adjacent (rows 0..k-1: one run) -- are copied one memcpy per
// run, back to back into `dst`, until about `target` bytes have moved. The chunks and the
// destination continue where the previous sample stopped (`cursor`, cycling through both
// arenas, as the hw gather ring cycles), so no sample finds the last one's bytes in cache:
// keeping the destination at one offset made it cache-resident and split the samples into
// a ~3 GB/s (cold) and a ~9 GB/s (warm) group on this VM. At least `target` bytes and
// `min_s` seconds (several throttling periods, see HostCopy).
GatherSample GatherOnce(std::byte* dst, const std::byte* src, std::uint64_t arena,
                        std::uint64_t row, int k, bool spread, std::uint64_t target,
                        double min_s, std::uint64_t* cursor) {
  constexpr int kRows = 64;
  const std::uint64_t chunk = kRows * row;
  // The runs of one chunk: (first row, rows).
  std::vector<std::pair<int, int>> runs;
  if (spread && k < kRows) {
    const int stride = kRows / k;
    for (int j = 0; j < k; ++j) runs.push_back({j * stride, 1});
  } else {
    runs.push_back({0, k});
  }
  const std::uint64_t per_chunk = std::uint64_t(k) * row;
  const std::uint64_t min_chunks = std::max<std::uint64_t>(1, target / per_chunk);
  std::uint64_t in = cursor[0], out = cursor[1], moved = 0, n_chunks = 0;
  const std::int64_t t0 = MonotonicNowNs();
  const std::int64_t until = t0 + std::int64_t(min_s * 1e9);
  for (; n_chunks < min_chunks || MonotonicNowNs() < until; ++n_chunks) {
    if (in + chunk > arena) in = 0;
    if (out + per_chunk > arena) out = 0;
    const std::byte* base = src + in;
    for (const auto& [first, n] : runs) {
      const std::uint64_t len = std::uint64_t(n) * row;
      std::memcpy(dst + out, base + std::uint64_t(first) * row, len);
      out += len;
      moved += len;
    }
    in += chunk;
  }
  GatherSample g;
  g.seconds = Seconds(t0, MonotonicNowNs());
  cursor[0] = in;
  cursor[1] = out;
  g.runs = double(n_chunks * runs.size());
  g.bytes = double(moved);
  g.rows_per_chunk = k;
  g.row_bytes = double(row);
  return g;
}

// Emulated batched calls (the host backend's batched copy): per call the descriptor list is
// built, then one memcpy per descriptor into the "device" arena; calls repeat for at least
// `min_calls` and `min_s` seconds (see HostCopy); returns the mean seconds per call.
double HostBatchSeconds(std::byte* dst, const std::byte* src, std::uint64_t arena,
                        std::uint64_t size, int descriptors, int min_calls, double min_s,
                        std::uint64_t* cursor) {
  std::vector<CopyPiece> pieces(static_cast<std::size_t>(descriptors));
  const std::int64_t t0 = MonotonicNowNs();
  const std::int64_t until = t0 + std::int64_t(min_s * 1e9);
  int calls = 0;
  for (; calls < min_calls || MonotonicNowNs() < until; ++calls) {
    for (int i = 0; i < descriptors; ++i) {
      const std::uint64_t n = (*cursor)++;
      pieces[std::size_t(i)] = {dst + CycleOffset(n * 7 + 3, size, arena),
                                src + CycleOffset(n, size, arena), size};
    }
    for (const CopyPiece& p : pieces) std::memcpy(p.dst, p.src, p.bytes);
  }
  return Seconds(t0, MonotonicNowNs()) / calls;
}

}  // namespace

Status Calibrate(const CalibrateOptions& options, CalibrateResult* out) {
  CalibrateResult r;
  r.load_before = LoadAverage();
  const std::int64_t start = MonotonicNowNs();
  const bool q = options.quick;
  const std::uint64_t block = RoundUp(std::max<std::uint64_t>(options.block, 4096), 4096);
  const std::uint64_t file_bytes = RoundUp(q ? (64ull << 20) : (512ull << 20), block);
  std::filesystem::create_directories(options.dir);
  const std::string path = options.dir + "/kvtier_calibrate.dat";

  // --- SSD write: chunk-sized ChunkStore::Put records (what the pipeline's stores do: O_DIRECT
  // from a bounce buffer, one record at a time, manifest appended; sync off as in kvtier hw),
  // then the read file: sequential O_DIRECT 1 MiB writes.
  Progress(options, "ssd: chunk-store writes");
  {
    ChunkStoreOptions so;
    so.dir = options.dir + "/kvtier_calibrate_store";
    // Removed however this block ends (an error returned from it left the store behind).
    struct RemoveOnExit {
      std::string dir;
      ~RemoveOnExit() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    } remove_store{so.dir};
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
  }
  // The read file is written and read through one descriptor and unlinked as soon as it is
  // open, so no ending -- an error, a signal, SIGKILL -- leaves it behind (a killed calibrate
  // left its 64-512 MiB kvtier_calibrate.dat in the measured directory).
  const int data_flags = O_CREAT | O_TRUNC | O_RDWR | (r.direct_io ? O_DIRECT : 0);
  UniqueFd data_fd(::open(path.c_str(), data_flags, 0600));
  if (!data_fd.valid()) return Status::IoError(path + ": open: " + ErrnoText(errno));
  ::unlink(path.c_str());
  {
    const UniqueFd& fd = data_fd;
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

  // --- SSD reads through the engine: QD1 (latency) and QD N (bandwidth), interleaved reps;
  // then the read-unit check: whole chunks vs 4 KiB-aligned extents of chunks at QD N, and
  // single 4 KiB reads at QD 1, each against the simulator's formula with these values.
  {
    Progress(options, "ssd: random " + SizeName(double(block)) + " reads at QD " +
                          std::to_string(options.queue_depth) + " and QD 1");
    const UniqueFd& fd = data_fd;
    const int reps = 3;
    const int n_qd = int(std::min<std::uint64_t>(q ? 1500 : 6000, 4 * file_bytes / block));
    const int n_1 = q ? 150 : 600;
    std::vector<double> bw, bw1;
    for (int rep = 0; rep < reps; ++rep) {
      double s = 0;
      KVTIER_RETURN_IF_ERROR(TimedReadList(fd.get(),
                                           RandomBlocks(file_bytes, block, n_qd, 42 + rep), block,
                                           options.queue_depth, &r.io_backend, &s));
      bw.push_back(double(n_qd) * double(block) / s);
      KVTIER_RETURN_IF_ERROR(TimedReadList(fd.get(),
                                           RandomBlocks(file_bytes, block, n_1, 99 + rep), block,
                                           1, &r.io_backend, &s));
      bw1.push_back(double(n_1) * double(block) / s);
    }
    r.ssd_read_bw = Median(bw);
    r.ssd_qd1_bw = Median(bw1);
    const double per_io = double(block) / r.ssd_qd1_bw;
    r.ssd_latency_s = std::max(1e-6, per_io - double(block) / r.ssd_read_bw);

    Progress(options, "ssd: whole-chunk vs 4 KiB-extent reads (predicted vs measured)");
    const int chunks = q ? 64 : 256;
    const std::uint64_t page = 4096;
    auto check = [&](const std::string& what, int qd, const std::vector<Read>& reads,
                     std::uint64_t max_len) -> Status {
      std::vector<double> t;
      for (int rep = 0; rep < reps; ++rep) {
        double s = 0;
        KVTIER_RETURN_IF_ERROR(TimedReadList(fd.get(), reads, max_len, qd, &r.io_backend, &s));
        t.push_back(s);
      }
      SsdUnitSample u;
      u.what = what;
      u.queue_depth = qd;
      u.ios = double(reads.size());
      for (const Read& rd : reads) u.bytes += double(rd.length);
      u.seconds = Median(t);
      u.predicted_s =
          PredictSsdReadSeconds(u.ios, u.bytes, r.ssd_read_bw, r.ssd_latency_s, qd);
      r.ssd_units.push_back(u);
      return Status::OK();
    };
    const std::vector<Read> whole = RandomBlocks(file_bytes, block, chunks, 5);
    KVTIER_RETURN_IF_ERROR(check("whole " + SizeName(double(block)) + " chunks",
                                 options.queue_depth, whole, block));
    for (int k : {1, 2, 4, 8}) {
      if (std::uint64_t(k) * 2 * page > block) break;  // extents must stay apart (unmerged)
      std::vector<Read> ext;
      const std::uint64_t gap = block / std::uint64_t(k) / page * page;
      for (const Read& c : whole) {
        for (int j = 0; j < k; ++j) ext.push_back({c.offset + std::uint64_t(j) * gap, page});
      }
      KVTIER_RETURN_IF_ERROR(check(std::to_string(k) + " x 4 KiB extents / chunk",
                                   options.queue_depth, ext, page));
    }
    std::vector<Read> single;
    for (int i = 0; i < (q ? 100 : 400); ++i) {
      single.push_back({whole[std::size_t(i) % whole.size()].offset + page, page});
    }
    KVTIER_RETURN_IF_ERROR(check("4 KiB reads", 1, single, page));
  }
  data_fd = UniqueFd();

  // --- Memory: a host arena and the host backend's "device" arena (DeviceArena::CreateOnHost,
  // what host_backend.cc allocates), cold block copies between them.
  const std::uint64_t arena = q ? (32ull << 20) : (256ull << 20);
  std::unique_ptr<HostArena> a;
  std::unique_ptr<DeviceArena> b;
  {
    HostArenaOptions ho;
    ho.slot_bytes = arena;
    ho.slot_count = 1;
    KVTIER_RETURN_IF_ERROR(HostArena::Create(ho, &a));
    KVTIER_RETURN_IF_ERROR(DeviceArena::CreateOnHost(arena, 1, &b));
  }
  std::memset(a->base(), 1, arena);
  std::memset(b->base(), 2, arena);
  Progress(options, "memory: cold block copies");
  const std::uint64_t copy_total = q ? (256ull << 20) : (2048ull << 20);
  r.memcpy_bw = CopyBw(b->base(), a->base(), arena, block, copy_total);
  {
    // Two copy threads at once, each over its own half of both arenas: what concurrent copies
    // through host memory (a CPU gather beside the host backend's memcpy H2D) get together.
    Progress(options, "memory: two concurrent copy threads");
    const std::uint64_t half = arena / 2 / block * block;
    const std::uint64_t each = (copy_total / 2 + block - 1) / block * block;  // CopyBw's blocks
    const std::int64_t t0 = MonotonicNowNs();
    std::thread other([&] { CopyBw(b->base() + half, a->base() + half, half, block, each); });
    CopyBw(b->base(), a->base(), half, block, each);
    other.join();
    r.shared_copy_bw = double(2 * each) / Seconds(t0, MonotonicNowNs());
  }

  // --- The copy curve (host backend: memcpy per piece into the "device" arena).
  {
    Progress(options, "copies: 256 B .. " + SizeName(q ? (4 << 20) : (64 << 20)) + " curve");
    // Repetitions interleaved across sizes (a burst of load on this shared machine then hits
    // one repetition of every size, not every repetition of one); the median is kept.
    const int reps = q ? 3 : 5;
    const double min_s = q ? 0.004 : 0.03;
    std::vector<std::uint64_t> sizes;
    for (std::uint64_t size = 256; size <= (q ? (4ull << 20) : (64ull << 20)); size *= 4) {
      sizes.push_back(size);
    }
    std::vector<std::vector<CopySample>> t(sizes.size());
    for (int rep = 0; rep < reps; ++rep) {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        t[i].push_back(HostCopy(b->base(), a->base(), arena, sizes[i], 8, min_s));
      }
    }
    for (auto& v : t) {  // the sample of median time per call
      std::sort(v.begin(), v.end(), [](const CopySample& x, const CopySample& y) {
        return x.seconds / x.calls < y.seconds / y.calls;
      });
      r.copy_curve.push_back(v[v.size() / 2]);
    }
    r.copy_fit = FitCopyCurve(r.copy_curve);
    r.copy_method = "host memcpy per piece from a host arena into the device arena";
  }
  r.backend = "host";
  if (r.copy_fit.ok) {
    r.h2d_bw = r.d2h_bw = r.copy_fit.bw;
    r.pcie_latency_s = std::max(0.0, r.copy_fit.latency_s);
  } else {
    r.h2d_bw = r.d2h_bw = r.memcpy_bw;
    r.pcie_latency_s = 0;
  }

  // --- CPU gathers: k rows per 64-row chunk, spread or adjacent, row sizes 256 B .. 20 KiB.
  {
    Progress(options, "gathers: rows per chunk 1..64 x row sizes 256 B .. 20 KiB");
    const std::vector<std::uint64_t> rows =
        q ? std::vector<std::uint64_t>{256, 4096, 20480}
          : std::vector<std::uint64_t>{256, 1024, 4096, 10240, 20480};
    // The experiment's own row size (one token's K of one layer) is measured too.
    std::vector<std::uint64_t> sizes = rows;
    if (options.row_bytes >= 64 && options.row_bytes <= (64u << 10) &&
        std::find(sizes.begin(), sizes.end(), options.row_bytes) == sizes.end()) {
      sizes.push_back(options.row_bytes);
    }
    const std::vector<int> ks = q ? std::vector<int>{1, 8, 64}
                                  : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
    const std::uint64_t target = q ? (256ull << 10) : (4ull << 20);
    const double min_s = q ? 0.003 : 0.03;
    const int reps = 3;
    struct Config {
      std::uint64_t row;
      int k;
      bool spread;
    };
    std::vector<Config> configs;
    for (std::uint64_t row : sizes) {
      for (int k : ks) {
        for (bool spread : {true, false}) {
          if (!spread && (k == 1 || k == 64)) continue;  // the same runs as spread
          configs.push_back({row, k, spread});
        }
      }
    }
    // Repetitions interleaved across configurations; the median time of each is kept.
    std::vector<std::vector<GatherSample>> g(configs.size());
    std::uint64_t cursor[2] = {0, 0};
    for (int rep = 0; rep < reps; ++rep) {
      for (std::size_t i = 0; i < configs.size(); ++i) {
        g[i].push_back(GatherOnce(b->base(), a->base(), arena, configs[i].row, configs[i].k,
                                  configs[i].spread, target, min_s, cursor));
      }
    }
    for (auto& v : g) {
      std::sort(v.begin(), v.end(), [](const GatherSample& x, const GatherSample& y) {
        return x.seconds / x.bytes < y.seconds / y.bytes;  // the sample of median rate
      });
      r.gathers.push_back(v[v.size() / 2]);
    }
    r.gather_fit = FitGather(r.gathers);
    r.gather_method = "memcpy per run out of 64-row chunks of a host arena";
    r.gather_bw = r.gather_fit.ok ? r.gather_fit.bw : 0;
    r.gather_run_cost_s = r.gather_fit.ok ? std::max(0.0, r.gather_fit.run_cost_s) : 0;
  }
  if (r.gather_bw <= 0) {  // no fit: the old half-rows gather rate, no per-run term
    r.gather_bw = r.memcpy_bw;
  }

  // --- Batched copies as the host backend emulates them (a memcpy loop over descriptors).
  {
    Progress(options, "batched copies (host emulation: memcpy loop), 1..1024 descriptors");
    std::uint64_t cursor = 0;
    const int reps = q ? 3 : 5;
    std::vector<std::pair<std::uint64_t, int>> configs;
    for (std::uint64_t size : {std::uint64_t(256), std::uint64_t(4096)}) {
      for (int n : {1, 4, 16, 64, 256, 1024}) configs.push_back({size, n});
    }
    std::vector<std::vector<double>> t(configs.size());
    for (int rep = 0; rep < reps; ++rep) {
      for (std::size_t i = 0; i < configs.size(); ++i) {
        const auto [size, n] = configs[i];
        t[i].push_back(
            HostBatchSeconds(b->base(), a->base(), arena, size, n, 3, q ? 0.003 : 0.03, &cursor));
      }
    }
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const auto [size, n] = configs[i];
      r.batches.push_back({double(n), double(n) * double(size), Median(t[i])});
    }
    r.batch_fit = FitBatch(r.batches);
    r.batch_method = "host emulation: descriptor list + one memcpy per descriptor";
    r.batch_latency_s = r.batch_fit.ok ? std::max(0.0, r.batch_fit.batch_latency_s) : 0;
    r.descriptor_cost_s = r.batch_fit.ok ? std::max(0.0, r.batch_fit.descriptor_cost_s) : 0;
  }
  // The emulated device gather is the same memcpy per run into the device arena.
  r.gpu_gather_bw = r.gather_bw;
  r.gpu_gather_sm_share = 0;
  r.device_gather_method =
      "host emulation: memcpy per run on the copy lane (gather_bw = cpu.gather_bw); "
      "sm_share 0: modeled compute is a sleep nothing slows";

  r.mem_bw = r.memcpy_bw;
  Progress(options, "compute: Eigen GEMM, alone and beside a gather thread");
  r.gemm_flops = HostCompute::MeasureGemmFlops(256, 1536, 576, q ? 3 : 10);
  {
    // A real-compute GEMM next to a thread gathering rows (what hw.compute = real would see
    // beside an emulated device gather on this machine's cores); printed, not written.
    std::atomic<bool> stop{false};
    std::thread g([&] {
      std::uint64_t cursor[2] = {0, 0};
      while (!stop.load()) {
        GatherOnce(b->base(), a->base(), arena, 1024, 8, true, 1 << 20, 0, cursor);
      }
    });
    const double beside = HostCompute::MeasureGemmFlops(256, 1536, 576, q ? 3 : 10);
    stop = true;
    g.join();
    if (beside > 0 && r.gemm_flops > 0) r.host_gemm_slowdown = r.gemm_flops / beside - 1;
  }
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

  if (CudaDevicePresent()) {
    // A CUDA device: the copies, batched copies, device gather and GEMM are measured on it
    // instead (hw/calibrate_cuda.cc); the SSD, CPU gather and hand-off values above stay.
    Progress(options, "cuda: the device's copies, batched copies, gather kernel and GEMM");
    KVTIER_RETURN_IF_ERROR(CalibrateCuda(options, &r));
    r.shared_copy_bw = 0;  // DMA is not a CPU copy; the device's copies do not meet gathers
  }
  r.seconds = Seconds(start, MonotonicNowNs());
  r.load_after = LoadAverage();
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
  if (!r.load_before.empty()) {
    s += "; Load average (1/5/15 min) " + r.load_before + " at the start, " + r.load_after +
         " at the end.\n";
  }
  s += "; QD1 read bandwidth " + Fmt("%.3f", r.ssd_qd1_bw / 1e9) + " GB/s.\n";
  for (const SsdUnitSample& u : r.ssd_units) {
    s += "; ssd check: " + u.what + " at QD " + std::to_string(u.queue_depth) + ": " +
         Fmt("%.0f", u.ios) + " I/Os, measured " + Fmt("%.3f", u.seconds * 1e3) +
         " ms, simulator " + Fmt("%.3f", u.predicted_s * 1e3) + " ms (x" +
         Fmt("%.2f", u.predicted_s / u.seconds) + ")\n";
  }
  // One `source` line saying how each group of keys was measured.
  std::string src = "kvtier calibrate " + std::string(date) + " on " + host + " (" + r.backend +
                    " backend)";
  src += "; ssd: O_DIRECT random reads through the hw IoEngine (" + r.io_backend + ")";
  src += "; pcie.h2d_bw/d2h_bw/latency: fit of the copy curve " +
         SizeName(r.copy_curve.empty() ? 0 : r.copy_curve.front().bytes) + " .. " +
         SizeName(r.copy_curve.empty() ? 0 : r.copy_curve.back().bytes) +
         " (seconds = calls x latency + bytes / bw, relative least squares), " + r.copy_method;
  src += "; pcie.batch_latency/descriptor_cost: fit over 1..1024 descriptors, " + r.batch_method;
  src += "; cpu.gather_bw/gather_run_cost: fit seconds = runs x run_cost + bytes / bw over " +
         std::to_string(r.gathers.size()) + " gathers, " + r.gather_method;
  src += "; gpu.gather_bw/gather_sm_share: " + r.device_gather_method;
  if (r.shared_copy_bw > 0) {
    src += "; cpu.shared_copy_bw: two threads copying cold blocks at once, bytes both copied / wall time";
  }
  src += "; cpu.op_overhead: median time between the ops of read -> h2d -> compute chains through the executor; gpu.kernel_overhead: median worker-thread hand-off";
  if (!r.driver_method.empty()) src += "; cpu.driver_op_cost/driver_wake: " + r.driver_method;
  s += "[hardware]\nname = " + name + "\nsource = " + src + "\n\n";
  s += "[ssd]\nread_bw = " + Fmt("%.4fGB/s", r.ssd_read_bw / 1e9) + "\nwrite_bw = " +
       Fmt("%.4fGB/s", r.ssd_write_bw / 1e9) + "\nlatency = " + Fmt("%.2fus", r.ssd_latency_s * 1e6) +
       "\nqueue_depth = " + std::to_string(o.queue_depth) + "\n\n";
  // op_overhead: the executor's own time between the ops of a read -> h2d -> compute chain,
  // per transfer op (hw/op_overhead.h).
  s += "[cpu]\nmemcpy_bw = " + Fmt("%.4fGB/s", r.memcpy_bw / 1e9) + "\ngather_bw = " +
       Fmt("%.4fGB/s", r.gather_bw / 1e9) + "\ngather_run_cost = " +
       Fmt("%.4fus", r.gather_run_cost_s * 1e6) + "\nop_overhead = " +
       Fmt("%.3fus", r.op_overhead_s * 1e6) + "\n";
  if (r.shared_copy_bw > 0) s += "shared_copy_bw = " + Fmt("%.4fGB/s", r.shared_copy_bw / 1e9) + "\n";
  if (!r.driver_method.empty()) {
    s += "driver_op_cost = " + Fmt("%.3fus", r.driver_op_cost_s * 1e6) + "\ndriver_wake = " +
         Fmt("%.3fus", r.driver_wake_s * 1e6) + "\n";
    std::string costs, wakes;
    for (const CalibrateResult::DriverTime& d : r.driver_by_system) {
      costs += (costs.empty() ? "" : ", ") + d.system + "=" + Fmt("%.3fus", d.op_cost_s * 1e6);
      if (d.wake_s >= 0) {
        wakes += (wakes.empty() ? "" : ", ") + d.system + "=" + Fmt("%.3fus", d.wake_s * 1e6);
      }
    }
    if (!costs.empty()) s += "driver_op_costs = " + costs + "\n";
    if (!wakes.empty()) s += "driver_wakes = " + wakes + "\n";
  }
  s += "\n";
  s += "[pcie]\nh2d_bw = " + Fmt("%.4fGB/s", r.h2d_bw / 1e9) + "\nd2h_bw = " +
       Fmt("%.4fGB/s", r.d2h_bw / 1e9) + "\nlatency = " + Fmt("%.4fus", r.pcie_latency_s * 1e6) +
       "\nbatch_latency = " + Fmt("%.4fus", r.batch_latency_s * 1e6) +
       "\ndescriptor_cost = " + Fmt("%.4fus", r.descriptor_cost_s * 1e6) + "\n\n";
  s += "[gpu]\nname = " + r.gpu_name + "\n";
  if (r.gemm_flops > 0) {
    s += "flops = " + Fmt("%.3fGFLOP/s", r.gemm_flops / 1e9) + "\nefficiency = 1.0\n";
  }
  s += "mem_bw = " + Fmt("%.4fGB/s", r.mem_bw / 1e9) + "\nkernel_overhead = " +
       Fmt("%.3fus", r.kernel_overhead_s * 1e6) + "\ngather_bw = " +
       Fmt("%.4fGB/s", r.gpu_gather_bw / 1e9) + "\ngather_sm_share = " +
       Fmt("%.4f", r.gpu_gather_sm_share) + "\nconcurrent_prefills = 1\n";
  if (!o.layer_table.empty()) {
    s += "; measured per-layer-step times of the host backend's real compute (kvtier calibrate\n"
         "; --layer-table); relative to this file; they are for one model only\n"
         "layer_table = " + o.layer_table + "\n";
  }
  return s;
}

std::string MeasurementTable(const CalibrateResult& r) {
  std::string s;
  auto line = [&](const std::string& l) { s += l + "\n"; };
  line("copy curve (" + r.copy_method + "):");
  line("  size        calls   per call      GB/s   fit residual");
  for (std::size_t i = 0; i < r.copy_curve.size(); ++i) {
    const CopySample& c = r.copy_curve[i];
    char b[160];
    std::snprintf(b, sizeof b, "  %-9s %7.0f %9.3f us %9.3f %+10.1f%%", SizeName(c.bytes).c_str(),
                  c.calls, c.seconds / c.calls * 1e6, c.bytes * c.calls / c.seconds / 1e9,
                  i < r.copy_fit.residuals.size() ? r.copy_fit.residuals[i] * 100 : 0.0);
    line(b);
  }
  line(r.copy_fit.ok ? "  fit: latency " + Fmt("%.4f", r.copy_fit.latency_s * 1e6) +
                           " us per call, bandwidth " + Fmt("%.3f", r.copy_fit.bw / 1e9) + " GB/s"
                     : "  fit: failed (kept memcpy_bw, latency 0)");
  line("cpu gathers (" + r.gather_method + "):");
  line("  row size  rows/chunk  runs      MiB   measured     GB/s   fit residual");
  for (std::size_t i = 0; i < r.gathers.size(); ++i) {
    const GatherSample& g = r.gathers[i];
    char b[200];
    std::snprintf(b, sizeof b, "  %-9s %6.0f %9.0f %8.2f %8.3f ms %8.3f %+10.1f%%",
                  SizeName(g.row_bytes).c_str(), g.rows_per_chunk, g.runs, g.bytes / (1 << 20),
                  g.seconds * 1e3, g.bytes / g.seconds / 1e9,
                  i < r.gather_fit.residuals.size() ? r.gather_fit.residuals[i] * 100 : 0.0);
    line(b);
  }
  if (r.gather_fit.ok) {
    double worst = 0, sum = 0;
    for (double x : r.gather_fit.residuals) worst = std::max(worst, std::fabs(x)), sum += x * x;
    line("  fit: run cost " + Fmt("%.4f", r.gather_fit.run_cost_s * 1e6) + " us per run, " +
         "bandwidth " + Fmt("%.3f", r.gather_fit.bw / 1e9) + " GB/s; residuals rms " +
         Fmt("%.1f", 100 * std::sqrt(sum / double(r.gather_fit.residuals.size()))) +
         "%, worst " + Fmt("%.1f", 100 * worst) + "%");
  } else {
    line("  fit: failed");
  }
  line("batched copies (" + r.batch_method + "):");
  line("  descriptors   bytes     per call   fit residual");
  for (std::size_t i = 0; i < r.batches.size(); ++i) {
    const BatchSample& c = r.batches[i];
    char b[160];
    std::snprintf(b, sizeof b, "  %11.0f %9s %9.3f us %+10.1f%%", c.descriptors,
                  SizeName(c.bytes).c_str(), c.seconds * 1e6,
                  i < r.batch_fit.residuals.size() ? r.batch_fit.residuals[i] * 100 : 0.0);
    line(b);
  }
  line(r.batch_fit.ok ? "  fit: " + Fmt("%.4f", r.batch_fit.batch_latency_s * 1e6) +
                            " us per call + " + Fmt("%.4f", r.batch_fit.descriptor_cost_s * 1e6) +
                            " us per descriptor + bytes / " + Fmt("%.3f", r.batch_fit.bw / 1e9) +
                            " GB/s (pcie.h2d_bw " + Fmt("%.3f", r.h2d_bw / 1e9) + " GB/s)"
                      : "  fit: failed");
  line("ssd read units (simulator: bytes / " + Fmt("%.3f", r.ssd_read_bw / 1e9) +
       " GB/s + ceil(ios / QD) x " + Fmt("%.2f", r.ssd_latency_s * 1e6) + " us):");
  line("  reads                            QD    I/Os   measured  simulator  sim/meas  per I/O");
  for (const SsdUnitSample& u : r.ssd_units) {
    char b[200];
    std::snprintf(b, sizeof b, "  %-31s %3d %7.0f %8.3f ms %7.3f ms %8.2f %7.2f us",
                  u.what.c_str(), u.queue_depth, u.ios, u.seconds * 1e3, u.predicted_s * 1e3,
                  u.predicted_s / u.seconds, u.seconds / u.ios * 1e6);
    line(b);
  }
  line("device gather: " + r.device_gather_method + "; gather_bw " +
       Fmt("%.3f", r.gpu_gather_bw / 1e9) + " GB/s, sm_share " +
       Fmt("%.3f", r.gpu_gather_sm_share));
  if (r.host_gemm_slowdown >= 0) {
    line("  (host: an Eigen GEMM beside a gathering thread ran " +
         Fmt("%+.1f", r.host_gemm_slowdown * 100) + "% slower; not written: modeled compute)");
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
