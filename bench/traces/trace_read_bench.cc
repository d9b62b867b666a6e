// Reader throughput on a large procedural trace: 32-layer, 32-KV-head model, few-shot prefixes
// of ~5K tokens (token level). Prints records/s and MB/s for (a) reading and validating
// records, (b) reading plus regenerating procedural importance for 3 probe heads of all 32
// layers over the whole prefix (ITF's common case), (c) the same for all 32 heads of 20% of
// layers (ITF fallback, §VI-C), and the process's peak RSS. Budget: (b)+(c) >= 10,000
// requests/s, 10x the simulator's 1,000 requests/s (docs: DESIGN.md performance budgets).
// Usage: traces_read_bench [requests=20000] [path]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "traces/generator.h"
#include "traces/score_source.h"
#include "traces/trace_io.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

long PeakRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvtier;
  const std::int64_t requests = argc > 1 ? std::atoll(argv[1]) : 20000;
  const std::string path = argc > 2 ? argv[2] : "/tmp/kvtier_trace_read_bench.kvt";
  const ModelDescriptor model{"bench-32l", 32, 32, 32};
  WorkloadParams w;
  w.requests = requests;
  w.max_prefix_tokens = 10240;
  ImportanceTargets t;
  double t0 = Now();
  const ProceduralParams p = Calibrate(t, model.layers, model.kv_heads, 4096, 1);
  const GenerateSummary g = GenerateTrace(path, w, model, t, p);
  std::printf("generated %lld records, %.1f MB in %.2f s (calibration included)\n",
              (long long)g.records, g.bytes / 1e6, Now() - t0);
  const long rss_after_gen = PeakRssKiB();

  ModelSpec spec;
  spec.layers = model.layers;
  spec.heads = spec.kv_heads = model.kv_heads;
  const std::vector<int> probes = {0, 1, 2};
  std::vector<int> all(32);
  for (int i = 0; i < 32; ++i) all[i] = i;

  for (int mode = 0; mode < 3; ++mode) {
    TraceReader reader(path);
    TraceScoreSource scores(reader.header(), spec);
    TraceRecord rec;
    std::vector<float> out;
    std::int64_t n = 0, prefix_tokens = 0;
    double checksum = 0;
    t0 = Now();
    while (reader.Next(&rec)) {
      ++n;
      prefix_tokens += rec.request.prefix_tokens();
      if (mode > 0) {
        scores.Add(rec);
        const std::int64_t reused = rec.request.prefix_tokens();
        for (int l = 0; l < spec.layers; ++l) {
          scores.Scores(rec.request, l, reused, probes, &out);
          checksum += out[0];
          if (mode == 2 && l % 5 == 0) {  // ~20% of layers fall back to all heads
            scores.Scores(rec.request, l, reused, all, &out);
            checksum += out[0];
          }
        }
        scores.Release(rec.request.id);
      }
    }
    const double dt = Now() - t0;
    const char* name[] = {"read+validate", "read+probe scores (3 heads x 32 layers)",
                          "read+probe+fallback (all 32 heads in 20% of layers)"};
    std::printf("%-52s %9.0f records/s  %8.1f MB/s  %6.2f s  (mean prefix %.0f tokens, chk %.3g)\n",
                name[mode], double(n) / dt, double(reader.bytes_read()) / dt / 1e6, dt,
                double(prefix_tokens) / double(n), checksum);
  }
  std::printf("peak RSS %.1f MiB (after generation %.1f MiB); trace %.1f MB\n",
              PeakRssKiB() / 1024.0, rss_after_gen / 1024.0, g.bytes / 1e6);
  std::remove(path.c_str());
  return 0;
}
