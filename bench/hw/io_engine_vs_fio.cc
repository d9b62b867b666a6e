// Disk read throughput of kvtier's IoEngine (io_uring, O_DIRECT, random aligned reads at a
// fixed queue depth) against fio with the same file, block size, queue depth, direct=1 and
// ioengine=io_uring. Runs are interleaved (engine, fio, engine, ...) and medians reported,
// because the disk here drifts by up to 2x within a session (notes/hw-path.md section 2.3).
// Prints both numbers and the ratio engine/fio (target >= 0.9). Exit 77 when fio is absent.
//
// Usage: hw_io_engine_vs_fio [dir] (default $KVTIER_BENCH_DIR or /tmp; must be a real disk).

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "hw/io_engine.h"
#include "hw/posix_util.h"

namespace kvtier::hw {
namespace {

constexpr uint64_t kFileBytes = 1ull << 30;
constexpr double kSecondsPerRun = 3.0;
constexpr int kReps = 3;

bool WriteFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644));
  if (!fd.valid()) return false;
  const size_t block = 4 << 20;
  AlignedBuffer buf = AllocateAligned(block, 4096);
  std::mt19937_64 rng(42);
  for (uint64_t off = 0; off < kFileBytes; off += block) {
    auto* w = reinterpret_cast<uint64_t*>(buf.get());
    for (size_t i = 0; i < block / 8; ++i) w[i] = rng();
    if (::pwrite(fd.get(), buf.get(), block, static_cast<off_t>(off)) !=
        static_cast<ssize_t>(block)) {
      return false;
    }
  }
  return ::fsync(fd.get()) == 0;
}

// GB/s (1e9 B/s) of random reads of `bs` bytes at queue depth `qd` for kSecondsPerRun.
double RunEngine(int fd, uint64_t bs, uint32_t qd) {
  IoEngineOptions o;
  o.backend = IoEngineOptions::Backend::kIoUring;
  o.max_ops_in_flight = qd;
  o.max_bytes_in_flight = bs * qd;
  o.prefetch_max_ops = qd;
  o.prefetch_max_bytes = bs * qd;
  o.max_io_bytes = bs;
  std::unique_ptr<IoEngine> engine;
  Status s = IoEngine::Create(fd, o, &engine);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return -1;
  }
  AlignedBuffer pool = AllocateAligned(bs * qd, 4096);
  std::mutex mu;
  std::condition_variable cv;
  std::mt19937_64 rng(7);
  const uint64_t blocks = kFileBytes / bs;
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> outstanding{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  const int64_t t0 = MonotonicNowNs();
  const int64_t t_end = t0 + static_cast<int64_t>(kSecondsPerRun * 1e9);
  std::function<void(uint32_t)> issue = [&](uint32_t slot) {
    ReadRequest r;
    r.chunk_id = ChunkId{slot};
    r.io_class = IoClass::kDemand;
    {
      std::lock_guard<std::mutex> lock(mu);
      r.offset = (rng() % blocks) * bs;
    }
    r.length = bs;
    r.dst = pool.get() + slot * bs;
    r.on_complete = [&, slot](const ReadResult& res) {
      if (!res.status.ok()) failed = true;
      bytes += res.bytes;
      if (!stop && MonotonicNowNs() < t_end && !failed) {
        issue(slot);  // keep the queue depth: resubmit from the completion
      } else {
        std::lock_guard<std::mutex> lock(mu);
        --outstanding;
        cv.notify_all();
      }
    };
    engine->Submit(std::move(r));
  };
  outstanding = static_cast<int>(qd);
  for (uint32_t i = 0; i < qd; ++i) issue(i);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return outstanding == 0; });
  const double secs = (MonotonicNowNs() - t0) / 1e9;
  if (failed) return -1;
  return bytes / secs / 1e9;
}

double RunFio(const std::string& file, uint64_t bs, uint32_t qd) {
  const std::string cmd = "fio --name=kvtier --filename=" + file +
                          " --rw=randread --bs=" + std::to_string(bs) +
                          " --iodepth=" + std::to_string(qd) +
                          " --direct=1 --ioengine=io_uring --size=" + std::to_string(kFileBytes) +
                          " --runtime=" + std::to_string(static_cast<int>(kSecondsPerRun)) +
                          " --time_based --randrepeat=0 --output-format=json 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0) return -1;
  // jobs[0].read.bw_bytes: the first "bw_bytes" in the JSON belongs to "read".
  const size_t at = out.find("\"bw_bytes\"");
  if (at == std::string::npos) return -1;
  const size_t colon = out.find(':', at);
  return std::strtod(out.c_str() + colon + 1, nullptr) / 1e9;
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
  const std::string dir = argc > 1 ? argv[1] : (env ? env : "/tmp");
  const std::string file = dir + "/kvtier_io_bench_" + std::to_string(::getpid()) + ".dat";
  std::printf("writing %llu MiB test file %s (O_DIRECT)\n",
              static_cast<unsigned long long>(kFileBytes >> 20), file.c_str());
  if (!WriteFile(file)) {
    std::printf("cannot write %s: %s\n", file.c_str(), ErrnoText(errno).c_str());
    return 1;
  }
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_DIRECT));
  struct Config {
    uint64_t bs;
    uint32_t qd;
  };
  const Config configs[] = {{64 << 10, 32}, {1 << 20, 8}};
  int rc = 0;
  std::printf("%-14s %-28s %-28s %s\n", "config", "engine GB/s (median [runs])",
              "fio GB/s (median [runs])", "ratio");
  for (const Config& c : configs) {
    std::vector<double> e, f;
    for (int rep = 0; rep < kReps; ++rep) {
      e.push_back(RunEngine(fd.get(), c.bs, c.qd));
      f.push_back(RunFio(file, c.bs, c.qd));
    }
    auto list = [](const std::vector<double>& v) {
      std::string s;
      for (double x : v) s += (s.empty() ? "" : " ") + std::to_string(x).substr(0, 4);
      return s;
    };
    const double me = Median(e), mf = Median(f);
    char name[32];
    std::snprintf(name, sizeof(name), "%lluK QD%u", static_cast<unsigned long long>(c.bs >> 10),
                  c.qd);
    std::printf("%-14s %.2f [%s]%*s %.2f [%s]%*s %.2f\n", name, me, list(e).c_str(), 8, "", mf,
                list(f).c_str(), 8, "", mf > 0 ? me / mf : 0.0);
    if (me <= 0 || mf <= 0) rc = 1;
  }
  std::filesystem::remove(file);
  return rc;
}

}  // namespace
}  // namespace kvtier::hw

int main(int argc, char** argv) { return kvtier::hw::Main(argc, argv); }
