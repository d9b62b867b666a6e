// `kvtier eval`: accuracy of every KV selector on multiple-choice few-shot tasks with the real
// small LM (models/eval.h), written to the results database (`accuracy` table, a run with mode
// 'eval') and printed as a table.
//   kvtier eval --out results/eval.sqlite                        (defaults: a few minutes)
//   kvtier eval --out full.sqlite --items 0 --shots 5 --threads 2 (every item; hours on 2 cores)
// PIQA and COPA come from the repository's data/; RTE and OpenBookQA from --shared-data
// (default ../shared/data) and are skipped with a note when absent, unless named in --tasks.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

#include <boost/program_options.hpp>

#include "analysis/queries.h"
#include "analysis/results_db.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "core/errors.h"
#include "models/eval.h"

namespace kvtier::cli {
namespace {

namespace po = boost::program_options;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<double> Numbers(const std::string& flag, const std::string& s, bool unit) {
  std::vector<double> out;
  for (const std::string& x : Split(s)) {
    try {
      size_t used = 0;
      const double v = std::stod(x, &used);
      if (used != x.size() || !std::isfinite(v) || v < 0 || (unit && !(v > 0 && v <= 1))) {
        throw std::invalid_argument(x);
      }
      out.push_back(v);
    } catch (const std::exception&) {
      throw InputError("--" + flag + ": bad value '" + x + "'" + (unit ? " (want (0, 1])" : ""));
    }
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
      ("tasks", po::value(&tasks_arg), "comma list of piqa, copa, rte, openbookqa (default all; rte/openbookqa skipped when absent)")
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
      ("seed", po::value(&bo.seed), "few-shot examples and random selection (1)")
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
  eo.retentions = Numbers("retentions", retentions, true);
  eo.alphas = Numbers("alphas", alphas, false);
  eo.selectors.clear();
  for (const std::string& s : Split(selectors)) eo.selectors.push_back(ParseSelector(s));
  eo.seed = bo.seed;
  if (data_dir.empty()) data_dir = DefaultRepoDataDir();
  if (shared_dir.empty()) shared_dir = DefaultSharedDataDir();
  const bool explicit_tasks = !tasks_arg.empty();
  std::vector<std::string> tasks = explicit_tasks ? Split(tasks_arg) : McTaskNames();
  for (const std::string& t : tasks) {
    bool known = false;
    for (const auto& n : McTaskNames()) known |= n == t;
    if (!known) throw InputError("unknown task '" + t + "' (piqa, copa, rte, openbookqa)");
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
  if (loaded.empty()) throw InputError("no task to evaluate");

  std::ostringstream cfg;
  cfg << "eval.items = " << bo.items << "\neval.shots = " << bo.shots
      << "\neval.items_per_prefix = " << bo.items_per_prefix
      << "\neval.max_prefix_tokens = " << bo.max_prefix_tokens << "\neval.retentions = " << retentions
      << "\neval.selectors = " << selectors << "\neval.seed = " << bo.seed
      << "\nitf.alphas = " << alphas << "\nitf.probe_heads = " << eo.probe_heads
      << "\nmodel.name = " << model_name << "\nmodel.gguf = " << model_path << "\n";
  std::string task_list, data_hash;
  for (const McTask& t : loaded) {
    task_list += (task_list.empty() ? "" : ",") + t.name;
    data_hash += Sha256File(t.source);
  }
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
  ResultsDb db(out);  // an unwritable path fails here, before the model loads

  const auto t0 = std::chrono::steady_clock::now();
  const auto model = LlamaModel::Load(model_path);
  if (model->tokenizer() == nullptr) throw ModelFileError(model_path + ": no tokenizer metadata");
  const long long run_id = db.BeginRun(info);
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
    InsertAccuracy(&db, run_id, Records(s.rows));
    all.insert(all.end(), s.rows.begin(), s.rows.end());
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  db.EndRun(run_id, wall);
  PrintTable(all);
  std::printf("\n%lld tokens forwarded in %.0f s (%.0f tokens/s); results: %s (run %lld; tables "
              "accuracy, view accuracy_latency)\n",
              (long long)tokens, wall, tokens / wall, out.c_str(), run_id);
  return 0;
}

}  // namespace kvtier::cli
