// Prefill benchmark of the real SmolLM2-135M on this machine's CPU: one 2,048-token prefill with
// H2O column sums on (what trace recording runs), on one thread and on all threads; prints
// seconds, tokens/s and peak RSS.
// Model: $KVTIER_MODEL, else $HOME/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf;
// exits 0 with a message when it is absent. Text: tests/data/alice_excerpt.txt repeated (any
// real text would do: the cost depends only on the token count). Target: <= 10 s on 2 cores.
//
// usage: prefill_bench [tokens=2048] [source_dir]

#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "models/llama.h"

namespace {

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a.empty() ? "n/a\n" : a + " " + b + " " + c + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const int n_tokens = argc > 1 ? std::atoi(argv[1]) : 2048;
  const std::string source_dir = argc > 2 ? argv[2] : ".";
  std::string model_path;
  if (const char* p = std::getenv("KVTIER_MODEL"); p != nullptr && *p) {
    model_path = p;
  } else {
    const char* home = std::getenv("HOME");
    model_path =
        std::string(home ? home : "") + "/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  if (!std::filesystem::exists(model_path)) {
    std::printf("bench_prefill: SKIPPED: no model at %s (run scripts/fetch_model.sh)\n",
                model_path.c_str());
    return 0;
  }
  try {
    const auto t0 = Clock::now();
    const auto model = kvtier::LlamaModel::Load(model_path);
    const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();

    std::ifstream f(source_dir + "/tests/data/alice_excerpt.txt");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str().empty() ? std::string("The quick brown fox. ") : ss.str();
    std::vector<int32_t> ids;
    while (static_cast<int>(ids.size()) < n_tokens) {
      const std::vector<int32_t> more = model->Tokenize(text);
      ids.insert(ids.end(), more.begin(), more.end());
    }
    ids.resize(n_tokens);

    // Once on one thread, once on all (OMP_NUM_THREADS or every core): on a shared 2-core
    // machine the second thread can lose more to contention than it gains.
    const int max_threads = omp_get_max_threads();
    std::printf("bench_prefill: model load %.2f s; load average %s", load_s, LoadAverage().c_str());
    bool met = false;
    int next = -1;
    for (int threads : {1, max_threads}) {
      if (threads == 1 && max_threads == 1 && met) break;
      omp_set_num_threads(threads);
      kvtier::KvCache cache;
      kvtier::ForwardOptions opt;
      opt.importance = true;
      const auto t1 = Clock::now();
      const kvtier::ForwardResult r = model->Prefill(ids, &cache, opt);
      const double prefill_s = std::chrono::duration<double>(Clock::now() - t1).count();
      met = met || prefill_s <= 10.0;
      next = kvtier::ArgMax(r.LastLogits(model->config().vocab_size));
      std::printf("bench_prefill: %d-token prefill, %d thread(s): %.2f s, %.0f tokens/s "
                  "(KV cache %.1f MiB fp32)\n",
                  n_tokens, threads, prefill_s, n_tokens / prefill_s, cache.Bytes() / 1048576.0);
      if (max_threads == 1) break;
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("bench_prefill: peak RSS %.0f MiB; next token id %d; target <= 10 s: %s\n",
                ru.ru_maxrss / 1024.0, next, met ? "met" : "MISSED");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefill: error: %s\n", e.what());
    return 1;
  }
}
