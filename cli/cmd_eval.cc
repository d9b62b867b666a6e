// `kvtier eval`: accuracy of every KV selector on multiple-choice few-shot tasks with the real
// small LM (models/eval.h), and of low-bit decoding (KIVI, SpeCache; models/decode_eval.h) on
// decode tasks against the 16-bit cache, written to the results database (`accuracy` table, a
// run with mode 'eval') and printed as a table.
//   kvtier eval --out results/eval.sqlite                        (defaults: a few minutes)
//   kvtier eval --out full.sqlite --items 0 --shots 5 --threads 2 (every item; hours on 2 cores)
//   kvtier eval --tasks decode --out specache.sqlite   (texts, greedy, niah; hours: docs/decode.md)
// PIQA and COPA come from the repository's data/; RTE and OpenBookQA from --shared-data
// (default ../shared/data) and are skipped with a note when absent, unless named in --tasks.
// The decode tasks read data/texts and run only when named (--tasks texts,greedy,niah or
// decode).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include <boost/program_options.hpp>

#include "analysis/queries.h"
#include "analysis/results_db.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "models/decode_eval.h"
#include "models/eval.h"

namespace kvtier::cli {
namespace {

namespace po = boost::program_options;

// The items of the comma list given to --`flag`. An item listed twice is an error: `--tasks
// piqa,piqa` scored every configuration of PIQA twice and wrote both rows, `--retentions
// 0.1,0.1` the same configuration twice (found probing).
std::vector<std::string> Split(const std::string& flag, const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (std::find(out.begin(), out.end(), item) != out.end()) {
      throw InputError("--" + flag + ": '" + item + "' listed twice");
    }
    out.push_back(item);
  }
  return out;
}

// Throws when `v` is already in `out` (the same number written two ways: 0.1 and 0.10).
template <typename T>
void CheckNew(const std::string& flag, const std::string& text, const std::vector<T>& out,
              T v) {
  if (std::find(out.begin(), out.end(), v) != out.end()) {
    throw InputError("--" + flag + ": '" + text + "' repeats a value listed before");
  }
}

std::vector<int> Ints(const std::string& flag, const std::string& s, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& x : Split(flag, s)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(x, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != x.size() || v < lo || v > hi) {
      throw InputError("--" + flag + ": bad value '" + x + "' (want an integer in [" +
                       std::to_string(lo) + ", " + std::to_string(hi) + "])");
    }
    CheckNew(flag, x, out, v);
    out.push_back(v);
  }
  if (out.empty()) throw InputError("--" + flag + ": empty list");
  return out;
}

std::vector<double> Numbers(const std::string& flag, const std::string& s, bool unit) {
  std::vector<double> out;
  for (const std::string& x : Split(flag, s)) {
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(x, &used);
      if (used != x.size() || !std::isfinite(v) || v < 0 || (unit && !(v > 0 && v <= 1))) {
        throw std::invalid_argument(x);
      }
    } catch (const std::exception&) {
      throw InputError("--" + flag + ": bad value '" + x + "'" + (unit ? " (want (0, 1])" : ""));
    }
    CheckNew(flag, x, out, v);
    out.push_back(v);
  }
  if (out.empty()) throw InputError("--" + flag + ": empty list");
  return out;
}

Selector ParseSelector(const std::string& s) {
  for (Selector x : {Selector::kItf, Selector::kH2o, Selector::kStatic, Selector::kRandom}) {
    if (s == SelectorName(x)) return x;
  }
  throw InputError("--selectors: unknown selector '" + s + "' (itf, h2o, spi, random)");
}

// The accuracy table's rows (analysis/queries.h) of `rows`: alpha and the fallback rate for ITF
// only.
std::vector<AccuracyRecord> Records(const std::vector<AccuracyRow>& rows) {
  std::vector<AccuracyRecord> out;
  for (const AccuracyRow& r : rows) {
    const bool itf = r.config.selector == Selector::kItf;
    AccuracyRecord a;
    a.task = r.task;
    a.selector = SelectorName(r.config.selector);
    if (itf) a.alpha = r.config.alpha;
    a.retention = r.config.retention;
    a.items = r.items;
    a.correct = r.correct;
    a.accuracy = r.accuracy();
    a.first_token_agreement = r.first_token_agreement();
    a.mean_kept_fraction = r.mean_kept_fraction();
    if (itf) a.itf_fallback_rate = r.itf_fallback_rate();
    out.push_back(std::move(a));
  }
  return out;
}

// The accuracy table's rows of the decode tasks: retention 1, no alpha; bits, group, residual
// and quantization for the low-bit methods, k and hit rates for the fetching ones, perplexity
// for `texts`.
std::vector<AccuracyRecord> Records(const std::vector<DecodeAccuracyRow>& rows) {
  std::vector<AccuracyRecord> out;
  for (const DecodeAccuracyRow& r : rows) {
    const DecodeOptions& c = r.config;
    const bool full = c.method == DecodeMethod::kFull;
    const bool fetches = c.method == DecodeMethod::kSpeCache ||
                         c.method == DecodeMethod::kSpeCacheNoSpec;
    AccuracyRecord a;
    a.task = r.task;
    a.selector = DecodeMethodName(c.method);
    a.retention = 1;
    a.items = r.items;
    a.correct = r.correct;
    a.accuracy = r.accuracy();
    a.first_token_agreement = r.first_token_agreement();
    a.mean_kept_fraction = r.mean_kept_fraction();
    a.kv_bits = full ? 16 : c.quant.bits;
    if (!full) {
      a.kv_group = c.quant.group;
      a.kv_residual = c.quant.residual;
      a.kv_quant = c.quant.bits == 1 && !c.quant.improved_1bit ? "kivi" : "improved";
    }
    if (fetches) {
      a.topk = c.k;
      a.hit_rate = r.hit_rate();
      a.oracle_hit_rate = r.oracle_hit_rate();
    }
    if (r.task == "texts") a.perplexity = r.perplexity();
    a.token_agreement = r.token_agreement();
    a.kv_size_ratio = r.kv_size_ratio();
    out.push_back(std::move(a));
  }
  return out;
}

void PrintDecodeTable(const std::vector<DecodeAccuracyRow>& rows) {
  std::printf("\n%-7s %-28s %5s %8s %7s %7s %7s %6s %6s %6s %6s\n", "task", "decode", "items",
              "ppl", "acc", "agree", "1st", "hit", "oracle", "16-bit", "kv");
  for (const DecodeAccuracyRow& r : rows) {
    const bool fetches = r.config.method == DecodeMethod::kSpeCache ||
                         r.config.method == DecodeMethod::kSpeCacheNoSpec;
    char ppl[16] = "-", hit[16] = "-", oracle[16] = "-";
    if (r.task == "texts") std::snprintf(ppl, sizeof ppl, "%.3f", r.perplexity());
    if (fetches) {
      std::snprintf(hit, sizeof hit, "%.3f", r.hit_rate());
      std::snprintf(oracle, sizeof oracle, "%.3f", r.oracle_hit_rate());
    }
    std::printf("%-7s %-28s %5d %8s %6.1f%% %6.1f%% %6.1f%% %6s %6s %6.3f %6.3f\n", r.task.c_str(),
                DecodeConfigLabel(r.config).c_str(), r.items, ppl, r.accuracy() * 100,
                r.token_agreement() * 100, r.first_token_agreement() * 100, hit, oracle,
                r.mean_kept_fraction(), r.kv_size_ratio());
  }
}

void PrintTable(const std::vector<AccuracyRow>& rows) {
  std::printf("\n%-11s %-7s %5s %6s %5s %7s %7s %7s %6s %6s\n", "task", "select", "alpha", "keep",
              "items", "acc", "d_acc", "1st_tok", "kept", "fallbk");
  double full_acc = 0;
  for (const AccuracyRow& r : rows) {
    if (r.config.selector == Selector::kFull) full_acc = r.accuracy();
    const bool itf = r.config.selector == Selector::kItf;
    char alpha[16] = "-", fb[16] = "-";
    if (itf) {
      std::snprintf(alpha, sizeof alpha, "%.1f", r.config.alpha);
      std::snprintf(fb, sizeof fb, "%.2f", r.itf_fallback_rate());
    }
    std::printf("%-11s %-7s %5s %5.0f%% %5d %6.1f%% %+6.1f%% %6.1f%% %6.3f %6s\n", r.task.c_str(),
                SelectorName(r.config.selector), alpha, r.config.retention * 100, r.items,
                r.accuracy() * 100, (r.accuracy() - full_acc) * 100,
                r.first_token_agreement() * 100, r.mean_kept_fraction(), fb);
  }
}

}  // namespace

int RunEval(const Args& args) {
  std::string model_path = DefaultModelPath(), model_name = "smollm2-135m", tasks_arg, out;
  std::string data_dir, shared_dir, experiment = "eval";
  std::string retentions = "0.5,0.25,0.1,0.05", alphas = "0,0.6,1,2", selectors = "itf,h2o,spi,random";
  EvalBuildOptions bo;
  EvalOptions eo;
  bool quiet = false;
  DecodeTaskOptions dto;
  DecodeEvalOptions deo;
  std::string bits_arg = "1,2", ks_arg = "16,32,64,128", niah_lengths = "512,1024,2048",
              niah_depths = "0,0.25,0.5,0.75,1";
  bool no_nospec = false;
  po::options_description desc(
      "usage: kvtier eval --out R.sqlite [options]\n\n"
      "Few-shot multiple-choice accuracy (lm-eval acc: the choice with the largest sum of token\n"
      "log-probabilities) with the full prefix KV and with the KV each selector keeps.\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("model", po::value(&model_path), "GGUF file (default $KVTIER_MODEL or ~/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf)")
      ("model-name", po::value(&model_name), "model name stored with the run (smollm2-135m)")
      ("out,o", po::value(&out), "results SQLite file (created or appended; required)")
      ("experiment", po::value(&experiment), "experiment name stored with the run (eval)")
      ("tasks", po::value(&tasks_arg), "comma list of piqa, copa, rte, openbookqa (default all; rte/openbookqa skipped when absent) and the decode tasks texts, greedy, niah (only when named; 'decode' = all three)")
      ("data-dir", po::value(&data_dir), "the repository's data/ (piqa, copa)")
      ("shared-data", po::value(&shared_dir), "directory with rte/ and openbookqa/ (../shared/data)")
      ("items", po::value(&bo.items), "items per task, 0 = all (20)")
      ("shots", po::value(&bo.shots), "few-shot examples per prefix (3)")
      ("items-per-prefix", po::value(&bo.items_per_prefix), "items sharing one prefix, >= 2 (4)")
      ("max-prefix-tokens", po::value(&bo.max_prefix_tokens), "prefix cap (1024)")
      ("retentions", po::value(&retentions), "retention ratios (0.5,0.25,0.1,0.05)")
      ("alphas", po::value(&alphas), "ITF alphas (0,0.6,1,2)")
      ("selectors", po::value(&selectors), "itf,h2o,spi,random")
      ("probe-heads", po::value(&eo.probe_heads), "ITF probe KV heads (2: SmolLM2 has 3 KV heads)")
      ("threads", po::value(&eo.threads), "configurations scored in parallel (2)")
      ("seed", UnsignedValue("--seed", &bo.seed), "few-shot examples, random selection and the needles' digits (1)")
      ("bits", po::value(&bits_arg), "decode: KIVI bit widths (1,2)")
      ("ks", po::value(&ks_arg), "decode: SpeCache top-k values (16,32,64,128)")
      ("group", po::value(&deo.group), "decode: KIVI group size g (32)")
      ("residual", po::value(&deo.residual), "decode: SpeCache's residual window, a multiple of g (64; paper §4.1)")
      ("kivi-residual", po::value(&deo.kivi_residual), "decode: the KIVI baseline's residual window (128; paper §4.1)")
      ("no-nospec", po::bool_switch(&no_nospec), "decode: skip the specache_nospec rows")
      ("ablation-k", po::value(&deo.ablation_k), "decode: k of the original-1-bit-KIVI SpeCache row (64; 0 = no ablation rows)")
      ("ppl-context", po::value(&dto.ppl_context), "texts: prompt tokens (1024)")
      ("ppl-tokens", po::value(&dto.ppl_tokens), "texts: tokens decoded and scored per text (256)")
      ("gen-prompt", po::value(&dto.gen_prompt), "greedy: prompt tokens (512)")
      ("gen-tokens", po::value(&dto.gen_tokens), "greedy: tokens generated (32)")
      ("niah-lengths", po::value(&niah_lengths), "niah: prompt lengths in tokens (512,1024,2048)")
      ("niah-depths", po::value(&niah_depths), "niah: needle depths in [0, 1] (0,0.25,0.5,0.75,1)")
      ("niah-answer-tokens", po::value(&dto.niah_answer_tokens), "niah: tokens decoded after the prompt's (10)")
      ("niah-text", po::value(&dto.niah_text), "niah: the haystack's file in data/texts (federalist_1-4.txt)")
      ("quiet", po::bool_switch(&quiet), "no progress lines (rate and ETA on stderr)");
  po::variables_map vm;
  StoreArgs("eval", args, desc, desc, &vm);
  NotifyArgs("eval", &vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (out.empty()) throw InputError("--out is required");
  if (eo.probe_heads < 1 || eo.threads < 1) throw InputError("--probe-heads and --threads must be >= 1");
  // Each thread holds a model workspace: --threads 100000 took 15 GB and never finished.
  const int max_threads = 2 * int(std::max(1u, std::thread::hardware_concurrency()));
  if (eo.threads > max_threads) {
    throw InputError("--threads " + std::to_string(eo.threads) + ": at most " +
                     std::to_string(max_threads) + " (twice this machine's " +
                     std::to_string(max_threads / 2) + " cores; more only add memory)");
  }
  eo.retentions = Numbers("retentions", retentions, true);
  eo.alphas = Numbers("alphas", alphas, false);
  eo.selectors.clear();
  for (const std::string& s : Split("selectors", selectors)) {
    eo.selectors.push_back(ParseSelector(s));
  }
  if (eo.selectors.empty()) throw InputError("--selectors: empty list");
  eo.seed = bo.seed;
  if (data_dir.empty()) data_dir = DefaultRepoDataDir();
  if (shared_dir.empty()) shared_dir = DefaultSharedDataDir();
  // `--tasks ''` ran the default tasks; a list that names none is an error.
  const bool explicit_tasks = vm.count("tasks") > 0;
  const std::vector<std::string> named =
      explicit_tasks ? Split("tasks", tasks_arg) : McTaskNames();
  if (named.empty()) throw InputError("--tasks: empty list");
  std::vector<std::string> tasks, decode_tasks;
  for (const std::string& t : named) {
    const auto is = [&](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), t) != names.end();
    };
    if (t == "decode") {
      for (const auto& d : DecodeTaskNames()) {
        if (std::find(decode_tasks.begin(), decode_tasks.end(), d) == decode_tasks.end()) {
          decode_tasks.push_back(d);
        }
      }
    } else if (is(McTaskNames())) {
      tasks.push_back(t);
    } else if (is(DecodeTaskNames())) {
      // 'decode,texts' names texts twice; it runs once.
      if (std::find(decode_tasks.begin(), decode_tasks.end(), t) == decode_tasks.end()) {
        decode_tasks.push_back(t);
      }
    } else {
      throw InputError("unknown task '" + t +
                       "' (piqa, copa, rte, openbookqa, texts, greedy, niah, decode)");
    }
  }
  // A decode flag whose task is not named was ignored without a word (`--tasks copa --bits 3`
  // scored copa and said nothing of the 3-bit KIVI asked for).
  {
    // Given on the command line (a default is not a request).
    const auto given = [&](const char* flag) {
      const auto it = vm.find(flag);
      return it != vm.end() && !it->second.defaulted();
    };
    const auto joined = [](const std::vector<std::string>& names) {
      std::string list;
      for (const std::string& t : names) list += (list.empty() ? "" : ", ") + t;
      return list;
    };
    const std::vector<std::string> all_decode = DecodeTaskNames();
    const std::vector<std::pair<const char*, std::vector<std::string>>> applies = {
        {"bits", all_decode}, {"ks", all_decode}, {"group", all_decode},
        {"residual", all_decode}, {"kivi-residual", all_decode}, {"no-nospec", all_decode},
        {"ablation-k", all_decode}, {"ppl-context", {"texts"}}, {"ppl-tokens", {"texts"}},
        {"gen-prompt", {"greedy"}}, {"gen-tokens", {"greedy"}}, {"niah-lengths", {"niah"}},
        {"niah-depths", {"niah"}}, {"niah-answer-tokens", {"niah"}}, {"niah-text", {"niah"}}};
    for (const auto& [flag, for_tasks] : applies) {
      if (!given(flag)) continue;
      bool named = false;
      for (const std::string& t : for_tasks) {
        named |= std::find(decode_tasks.begin(), decode_tasks.end(), t) != decode_tasks.end();
      }
      if (!named) {
        throw InputError(std::string("--") + flag + " applies to the decode task" +
                         (for_tasks.size() > 1 ? "s " : " ") + joined(for_tasks) +
                         ", which --tasks does not name (it would be ignored)");
      }
    }
    // And the reverse: `--tasks texts --retentions 0.5` ran the texts and said nothing of the
    // multiple-choice grid it was asked for.
    if (tasks.empty()) {
      for (const char* flag : {"items", "shots", "items-per-prefix", "max-prefix-tokens",
                               "retentions", "alphas", "selectors", "probe-heads",
                               "shared-data"}) {
        if (!given(flag)) continue;
        throw InputError(std::string("--") + flag + " applies to the multiple-choice tasks (" +
                         joined(McTaskNames()) +
                         "), which --tasks does not name (it would be ignored)");
      }
    }
  }
  if (!decode_tasks.empty()) {
    dto.tasks = decode_tasks;
    dto.seed = bo.seed;
    dto.niah_lengths = Ints("niah-lengths", niah_lengths, 1, 1 << 20);
    dto.niah_depths = Numbers("niah-depths", niah_depths, false);
    for (double d : dto.niah_depths) {
      if (d > 1) throw InputError("--niah-depths: bad value " + std::to_string(d) + " (want [0, 1])");
    }
    CheckDecodeTaskOptions(dto);
    deo.bits = Ints("bits", bits_arg, 1, 2);
    deo.ks = Ints("ks", ks_arg, 1, 1 << 20);
    deo.nospec = !no_nospec;
    deo.threads = eo.threads;
    if (deo.ablation_k < 0) throw InputError("--ablation-k must be >= 0");
    for (const DecodeOptions& c : DecodeEvalGrid(deo)) {
      if (c.method != DecodeMethod::kFull) c.quant.Validate();
    }
  }
  // Data first (bad input fails before the model loads); external tasks may be absent.
  std::vector<McTask> loaded;
  for (const std::string& t : tasks) {
    if (McTaskIsExternal(t) && !std::filesystem::is_directory(shared_dir + "/" + t)) {
      if (explicit_tasks) {
        throw InputError("task " + t + " is not in the repository (no redistribution license) and " +
                         shared_dir + "/" + t + " does not exist (--shared-data)");
      }
      std::fprintf(stderr, "[eval] skipping %s: %s/%s not found (--shared-data)\n", t.c_str(),
                   shared_dir.c_str(), t.c_str());
      continue;
    }
    loaded.push_back(LoadMcTask(t, data_dir, shared_dir));
  }
  if (loaded.empty() && decode_tasks.empty()) throw InputError("no task to evaluate");
  const std::string text_dir = data_dir + "/texts";
  std::vector<std::string> text_files;
  if (!decode_tasks.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(text_dir, ec)) {
      for (const auto& e : std::filesystem::directory_iterator(text_dir)) {
        if (e.path().extension() != ".txt") continue;
        // Each text is read twice (hashed for the run, then tokenized): a FIFO would block
        // the second read.
        RequireRegularFile(e.path().string(), "decode text");
        text_files.push_back(e.path().string());
      }
    }
    std::sort(text_files.begin(), text_files.end());
    if (text_files.empty()) throw InputError(text_dir + ": no .txt texts for the decode tasks");
  }

  std::ostringstream cfg;
  cfg << "eval.items = " << bo.items << "\neval.shots = " << bo.shots
      << "\neval.items_per_prefix = " << bo.items_per_prefix
      << "\neval.max_prefix_tokens = " << bo.max_prefix_tokens << "\neval.retentions = " << retentions
      << "\neval.selectors = " << selectors << "\neval.seed = " << bo.seed
      << "\nitf.alphas = " << alphas << "\nitf.probe_heads = " << eo.probe_heads
      << "\nmodel.name = " << model_name << "\nmodel.gguf = " << model_path << "\n";
  if (!decode_tasks.empty()) {
    cfg << "decode.tasks = ";
    for (size_t i = 0; i < decode_tasks.size(); ++i) cfg << (i ? "," : "") << decode_tasks[i];
    cfg << "\ndecode.bits = " << bits_arg << "\ndecode.ks = " << ks_arg
        << "\ndecode.group = " << deo.group << "\ndecode.residual = " << deo.residual
        << "\ndecode.kivi_residual = " << deo.kivi_residual << "\ndecode.nospec = "
        << (deo.nospec ? "true" : "false") << "\ndecode.ablation_k = " << deo.ablation_k
        << "\ndecode.ppl_context = " << dto.ppl_context << "\ndecode.ppl_tokens = " << dto.ppl_tokens
        << "\ndecode.gen_prompt = " << dto.gen_prompt << "\ndecode.gen_tokens = " << dto.gen_tokens
        << "\ndecode.niah_lengths = " << niah_lengths << "\ndecode.niah_depths = " << niah_depths
        << "\ndecode.niah_answer_tokens = " << dto.niah_answer_tokens
        << "\ndecode.niah_text = " << dto.niah_text << "\n";
  }
  std::string task_list, data_hash;
  for (const McTask& t : loaded) {
    task_list += (task_list.empty() ? "" : ",") + t.name;
    data_hash += Sha256File(t.source);
  }
  for (const std::string& t : decode_tasks) task_list += (task_list.empty() ? "" : ",") + t;
  for (const std::string& f : text_files) data_hash += Sha256File(f);
  RunInfo info;
  info.mode = "eval";
  info.experiment = experiment;
  info.system = "eval";
  info.model = model_name;
  info.hardware = "cpu";
  info.trace = task_list;
  info.trace_sha256 = Sha256(data_hash);
  info.config = cfg.str();
  info.config_sha256 = Sha256(info.config + info.trace_sha256);
  // Whatever fails before the run begins (the model, its KV heads, the decode texts) leaves no
  // results file of this command's making behind (an empty one was left).
  NewResultsFileGuard new_file(out);
  ResultsDb db(out);  // an unwritable path fails here, before the model loads
  if (!decode_tasks.empty()) RequireDecodeSelectors(&db);

  const auto t0 = std::chrono::steady_clock::now();
  const auto model = LlamaModel::Load(model_path);
  if (model->tokenizer() == nullptr) throw ModelFileError(model_path + ": no tokenizer metadata");
  // ITF's probe heads are KV heads of the model: more were silently cut to the model's count
  // while the run's configuration recorded the number asked for.
  if (!loaded.empty() && eo.probe_heads > model->config().n_kv_heads) {
    throw InputError("--probe-heads " + std::to_string(eo.probe_heads) + ": " + model_path +
                     " has " + std::to_string(model->config().n_kv_heads) + " KV heads");
  }
  // The decode samples before any evaluation: a text too short for --ppl-context was found
  // only after the multiple-choice tasks had run (hours with --items 0).
  std::vector<DecodeSample> samples;
  if (!decode_tasks.empty()) samples = BuildDecodeSamples(*model, text_dir, dto);
  const long long run_id = db.BeginRun(info);
  new_file.Keep();
  // A results file that stops taking rows (the disk filled) fails the run (exit 3), as in sim
  // and hw (driver/experiment.h), marked failed where the file still takes the mark.
  const auto write = [&](const std::function<void()>& rows) {
    try {
      rows();
    } catch (const ResultsWriteError& e) {
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      throw RunFailed("eval, run " + std::to_string(run_id) + ": " +
                      db.FailRunAfterWriteError(run_id, wall, e));
    }
  };
  std::vector<AccuracyRow> all;
  std::int64_t tokens = 0;
  for (const McTask& task : loaded) {
    const std::vector<EvalGroup> groups = BuildEvalGroups(*model, task, bo);
    int n = 0;
    std::int64_t prefix = 0;
    for (const auto& g : groups) {
      n += static_cast<int>(g.items.size());
      prefix += static_cast<std::int64_t>(g.prefix.size());
    }
    if (!quiet) {
      std::fprintf(stderr, "[eval] %s: %d items on %zu prefixes (mean %.0f tokens), %zu configurations\n",
                   task.name.c_str(), n, groups.size(), double(prefix) / groups.size(),
                   EvalGrid(eo).size());
    }
    ProgressOptions po;
    po.quiet = quiet;
    Progress progress("eval " + task.name, "items", n, po);
    eo.progress = [&](int done, int) { progress.Update(done); };
    const EvalSummary s = EvaluateGroups(*model, task.name, groups, eo);
    progress.Finish();
    tokens += s.forward_tokens;
    write([&] { InsertAccuracy(&db, run_id, Records(s.rows)); });
    all.insert(all.end(), s.rows.begin(), s.rows.end());
  }
  std::vector<DecodeAccuracyRow> decode_rows;
  if (!decode_tasks.empty()) {
    const size_t configs = DecodeEvalGrid(deo).size();
    std::int64_t prompt_tokens = 0;
    for (const DecodeSample& s : samples) prompt_tokens += static_cast<std::int64_t>(s.prompt.size());
    if (!quiet) {
      std::fprintf(stderr, "[eval] decode: %zu samples (%lld prompt tokens), %zu configurations\n",
                   samples.size(), (long long)prompt_tokens, configs);
    }
    ProgressOptions po;
    po.quiet = quiet;
    Progress progress("eval decode", "sample x configuration runs",
                      static_cast<std::int64_t>(samples.size() * configs), po);
    deo.progress = [&](int done, int) { progress.Update(done); };
    const DecodeEvalSummary s = EvaluateDecode(*model, samples, deo);
    progress.Finish();
    tokens += s.prefill_tokens + s.decode_steps;
    write([&] { InsertAccuracy(&db, run_id, Records(s.rows)); });
    decode_rows = s.rows;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write([&] { db.EndRun(run_id, wall); });
  if (!all.empty()) PrintTable(all);
  if (!decode_rows.empty()) PrintDecodeTable(decode_rows);
  std::printf("\n%lld tokens forwarded in %.0f s (%.0f tokens/s); results: %s (run %lld; tables "
              "accuracy, view accuracy_latency)\n",
              (long long)tokens, wall, tokens / wall, out.c_str(), run_id);
  return 0;
}

}  // namespace kvtier::cli
