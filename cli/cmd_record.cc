// `kvtier trace record`: a real importance trace from the real small LM (models/recorder.h).
//   kvtier trace record --dataset piqa --prompts 8 --queries 4 --out piqa.kvt
//   kvtier trace record --dataset rag --prompts 4 --queries 4 --docs 3 --out rag.kvt
// Datasets: piqa and copa from the repository's data/ (--data-dir), rte and openbookqa from
// --shared-data (default ../shared/data; never committed), rag from data/texts.
// Progress (rate, ETA; cli/progress.h) goes to stderr unless --quiet; the recorder's throughput
// is printed at the end.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <boost/program_options.hpp>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "core/errors.h"
#include "models/eval.h"
#include "models/recorder.h"

namespace kvtier::cli {

std::string DefaultModelPath() {
  if (const char* p = std::getenv("KVTIER_MODEL"); p != nullptr && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// data/ of the repository: ./data when run from the checkout, else the source tree's.
std::string DefaultRepoDataDir() {
  std::error_code ec;
  if (std::filesystem::is_directory("data/piqa", ec)) return "data";
  return KVTIER_REPO_DIR "/data";
}

// RTE and OpenBookQA live outside the repository: $KVTIER_SHARED_DATA, ../shared/data, or the
// source tree's ../shared/data.
std::string DefaultSharedDataDir() {
  if (const char* p = std::getenv("KVTIER_SHARED_DATA"); p != nullptr && *p) return p;
  std::error_code ec;
  if (std::filesystem::is_directory("../shared/data", ec)) return "../shared/data";
  return KVTIER_REPO_DIR "/../shared/data";
}

namespace {

namespace po = boost::program_options;

}  // namespace

int RunTraceRecord(const Args& args) {
  std::string model_path = DefaultModelPath(), dataset = "piqa", out, data_dir, shared_dir;
  FewShotPromptOptions fs;
  RagPromptOptions rag;
  RecordOptions ro;
  int prompts = 8, queries = 4, max_prefix = 2048;
  bool original_1bit = false;
  std::uint64_t seed = 1;
  bool quiet = false;
  po::options_description desc(
      "usage: kvtier trace record --dataset piqa|copa|rte|openbookqa|rag --out T [options]\n\n"
      "Runs few-shot (dataset examples as the shared prefix, a question as the query) or RAG\n"
      "(document excerpts as the prefix) prompts through the GGUF model and writes a trace with\n"
      "explicit per-layer, per-KV-head H2O importance over the prefix tokens.\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("model", po::value(&model_path), "GGUF file (default $KVTIER_MODEL or ~/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf)")
      ("model-name", po::value(&ro.model_name), "model descriptor in the header (smollm2-135m)")
      ("dataset", po::value(&dataset), "piqa | copa | rte | openbookqa | rag (piqa)")
      ("data-dir", po::value(&data_dir), "the repository's data/ (piqa, copa, texts)")
      ("shared-data", po::value(&shared_dir), "directory with rte/ and openbookqa/ (../shared/data)")
      ("out,o", po::value(&out), "output trace (required)")
      ("prompts", po::value(&prompts), "distinct prefixes (8)")
      ("queries", po::value(&queries), "queries per prefix (4)")
      ("examples-min", po::value(&fs.examples_min), "few-shot: examples per prefix, min (2)")
      ("examples-max", po::value(&fs.examples_max), "few-shot: max (10)")
      ("docs", po::value(&rag.docs_per_prompt), "rag: documents per prefix (3)")
      ("doc-tokens", po::value(&rag.doc_tokens), "rag: tokens per document, about (160)")
      ("max-prefix-tokens", po::value(&max_prefix), "prefix cap in tokens (2048)")
      ("seed", UnsignedValue("--seed", &seed), "prompts, arrivals and interleaving (1)")
      ("rate", po::value(&ro.rate), "Poisson arrival rate, requests/s (1)")
      ("bits", po::value(&ro.bits), "importance quantization, 8 or 16 (16)")
      ("decode-steps", po::value(&ro.decode_steps), "greedy decode steps with top-k positions (0)")
      ("decode-k", po::value(&ro.decode_k), "positions per decode step and set; top-k sets of any smaller k are prefixes (16)")
      ("decode-bits", po::value(&ro.decode_bits), "decode with SpeCache over a 1- or 2-bit KIVI copy, or 0 for the 16-bit cache (2)")
      ("decode-group", po::value(&ro.decode_quant.group), "decode: KIVI group size (32)")
      ("decode-residual", po::value(&ro.decode_quant.residual), "decode: KIVI residual window, a multiple of the group (64)")
      ("decode-original-1bit", po::bool_switch(&original_1bit), "decode: original KIVI 1-bit zero-point/scale instead of SpeCache's eq. 3")
      ("output-tokens", po::value(&ro.output_tokens), "output_tokens of each request when not decoding (0)")
      ("quiet", po::bool_switch(&quiet), "no progress lines (rate and ETA on stderr)");
  po::variables_map vm;
  StoreArgs("trace record", args, desc, desc, &vm);
  NotifyArgs("trace record", &vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (out.empty()) throw InputError("--out is required");
  CheckOutputIsNotInput(out, "--out", model_path, "the --model file");
  if (prompts < 1 || queries < 1) throw InputError("--prompts and --queries must be >= 1");
  ro.decode_quant.improved_1bit = !original_1bit;
  if (ro.decode_steps > 0 && ro.decode_bits != 0) {
    if (ro.decode_bits != 1 && ro.decode_bits != 2) {
      throw InputError("--decode-bits must be 0 (16-bit decode), 1 or 2");
    }
    KiviConfig q = ro.decode_quant;
    q.bits = ro.decode_bits;
    q.Validate();
  }
  if (max_prefix < 1) throw InputError("--max-prefix-tokens must be >= 1");
  // Both failed only after the model had recorded every request: a negative length as
  // "OUT: record 0: negative output length" (as if the trace were malformed); an empty name
  // wrote a trace whose model no configuration names.
  if (ro.output_tokens < 0) throw InputError("--output-tokens: must be >= 0");
  if (ro.model_name.empty()) {
    throw InputError("--model-name: empty: name the model the trace is for");
  }
  if (data_dir.empty()) data_dir = DefaultRepoDataDir();
  if (shared_dir.empty()) shared_dir = DefaultSharedDataDir();
  const bool is_rag = dataset == "rag";
  if (!is_rag) {
    bool known = false;
    for (const auto& n : McTaskNames()) known |= n == dataset;
    if (!known) throw InputError("unknown dataset '" + dataset + "' (piqa, copa, rte, openbookqa, rag)");
    if (McTaskIsExternal(dataset) && !std::filesystem::is_directory(shared_dir + "/" + dataset)) {
      throw InputError("dataset " + dataset + " is not in the repository (no redistribution license); "
                       "its directory " + shared_dir + "/" + dataset + " does not exist (--shared-data)");
    }
  }
  const auto t_load = std::chrono::steady_clock::now();
  const auto model = LlamaModel::Load(model_path);
  if (model->tokenizer() == nullptr) throw ModelFileError(model_path + ": no tokenizer metadata");
  if (!quiet) {
    std::fprintf(stderr, "[record] model %s loaded in %.1f s\n", model_path.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count());
  }
  std::vector<PromptGroup> groups;
  if (is_rag) {
    rag.prompts = prompts;
    rag.queries_per_prompt = queries;
    rag.max_prefix_tokens = max_prefix;
    rag.seed = seed;
    groups = BuildRagPrompts(*model, data_dir + "/texts", rag);
    ro.workload = "rag";
    ro.source = data_dir + "/texts";
  } else {
    const McTask task = LoadMcTask(dataset, data_dir, shared_dir);
    fs.prompts = prompts;
    fs.queries_per_prompt = queries;
    fs.max_prefix_tokens = max_prefix;
    fs.seed = seed;
    groups = BuildFewShotPrompts(*model, task, fs);
    ro.workload = "fewshot:" + dataset;
    ro.source = task.source;
  }
  ro.seed = seed;
  ProgressOptions po;
  po.quiet = quiet;
  long long requests = 0;
  for (const auto& g : groups) requests += static_cast<long long>(g.queries.size());
  Progress progress("record", "requests", requests, po);
  ro.progress = [&](int done, int) { progress.Update(done); };
  const RecordSummary s = RecordTrace(*model, groups, ro, out);
  progress.Finish();
  std::int64_t prefix_total = 0;
  for (const auto& g : groups) prefix_total += static_cast<std::int64_t>(g.prefix.size());
  std::printf("wrote %s: %lld records, %llu bytes, %zu prefixes (mean %.0f tokens)\n", out.c_str(),
              (long long)s.records, (unsigned long long)s.bytes, groups.size(),
              double(prefix_total) / std::max<size_t>(1, groups.size()));
  std::printf("recorder: %.1f s model time, %lld prefix + %lld query + %lld decode tokens, "
              "%.0f tokens/s, %.2f requests/s\n",
              s.seconds, (long long)s.prefix_tokens, (long long)s.query_tokens,
              (long long)s.decode_tokens, s.tokens_per_s(), s.requests_per_s());
  return 0;
}

}  // namespace kvtier::cli
