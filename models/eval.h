#pragma once
// Accuracy of prefix-KV selection on a real model (`kvtier eval`; SPEC §VI-B Fig. 15, §VI-D
// Fig. 22): multiple-choice few-shot tasks scored by log-likelihood, where the few-shot examples
// are the reusable prefix whose KV is selected and the question + choice is the query.
//
// Pieces, in the order `kvtier eval` uses them:
//   LoadMcTask      reads a task's items and few-shot pool (PIQA, COPA, RTE, OpenBookQA) from
//                   JSON lines, formatted as lm-evaluation-harness prompts them;
//   BuildEvalGroups tokenizes: prefixes of `shots` gold-answered examples, items spread over
//                   them round-robin (several items share each prefix, as the paper's few-shot
//                   prompts do, so static pre-identification has a "different query" to use);
//   BuildSelection  one selector's kept prefix tokens per layer (and KV head) from the H2O
//                   importance of the item's question against the full prefix KV;
//   ScoreQuery      log-likelihood of every choice and the first generated token, given a
//                   prefix KV and a selection;
//   EvaluateGroups  every selector x retention x alpha on every item, aggregated per task.
//
// Scoring: acc as lm-evaluation-harness computes it, the choice with the largest SUM of token
// log-probabilities (not length-normalised; acc_norm would divide by the choice's byte length).
// The selection uses the question's importance only (identical for all choices, so it cannot
// favour one); SPEC selects from the request's query rows the same way (§IV-A).
//
// Thread safety: functions are pure given their inputs; EvaluateGroups runs `threads` workers
// over (item, configuration) pairs, each with its own copy of the prefix KV.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/llama.h"

namespace kvtier {

// One multiple-choice item as text. `context` ends where the answer begins ("...\nAnswer:");
// each choice starts with its separator (" ..."), so context + choice is the scored text.
struct McItem {
  std::string context;
  std::vector<std::string> choices;
  int label = 0;  // index of the correct choice
};

struct McTask {
  std::string name;                // piqa | copa | rte | openbookqa
  std::string source;              // files read, for the results database
  std::vector<McItem> items;       // evaluated, in file order
  std::vector<McItem> shot_pool;   // few-shot examples (disjoint from items)
};

// The task names LoadMcTask knows, in the order `kvtier eval` runs them by default.
const std::vector<std::string>& McTaskNames();

// True for tasks whose data may not be committed (RTE, OpenBookQA): they are read from
// `shared_dir` only, and a missing directory means "skip".
bool McTaskIsExternal(const std::string& task);

// Loads `task`: piqa and copa from `repo_data_dir` (the repository's data/, samples with their
// licenses), rte and openbookqa from `shared_dir` (e.g. ../shared/data). Splits:
//   piqa: data/piqa/valid.jsonl + valid-labels.lst; items are the first lines, the shot pool the
//         last 100 lines of the sample (the train split is not available);
//   copa: data/copa/copa-dev.jsonl; items are ids 401-500 (SuperGLUE validation), pool ids 1-400;
//   rte:  <shared>/rte/val.jsonl items, train.jsonl pool;
//   openbookqa: <shared>/openbookqa/test.jsonl items, train.jsonl pool.
// Prompts follow lm-evaluation-harness (piqa "Question: g\nAnswer:" + " sol"; copa premise
// minus its period + " because"/" therefore" + " lower-cased choice"; rte "p\nQuestion: h True or
// False?\nAnswer:" + " True"/" False"; openbookqa stem + " choice").
// Throws InputError for an unknown task ("unknown task 'x' (piqa, copa, rte, openbookqa)"), a
// missing file (naming it) or a malformed line (file:line).
McTask LoadMcTask(const std::string& task, const std::string& repo_data_dir,
                  const std::string& shared_dir);

// A tokenized item: the question and each choice's tokens (scored continuation).
struct EvalItem {
  int index = 0;  // item index in the task
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> choices;
  int label = 0;
};

// A reusable prefix and the items asked with it.
struct EvalGroup {
  std::vector<int32_t> prefix;
  std::vector<EvalItem> items;
};

struct EvalBuildOptions {
  int items = 20;             // items evaluated (<= task size); 0 = all
  int shots = 3;              // examples per prefix
  int items_per_prefix = 4;   // items sharing one prefix (>= 2 so SPI has another query)
  int max_prefix_tokens = 1024;  // examples are dropped from the end beyond this
  std::uint64_t seed = 1;     // which pool examples each prefix uses
};

// Tokenizes task items into groups. Few-shot text: each example is context + gold choice +
// "\n\n". Throws InputError when the model has no tokenizer or the pool is too small.
std::vector<EvalGroup> BuildEvalGroups(const LlamaModel& model, const McTask& task,
                                       const EvalBuildOptions& options);

enum class Selector { kFull, kItf, kH2o, kStatic, kRandom };
const char* SelectorName(Selector s);  // "full", "itf", "h2o", "spi", "random"

// One configuration of the evaluation grid.
struct EvalConfig {
  Selector selector = Selector::kFull;
  double retention = 1.0;  // fraction of prefix tokens kept per layer (per KV head)
  double alpha = 0;        // ITF threshold exponent (ITF only)
};

// What BuildSelection decided, for the accuracy table.
struct SelectionStats {
  int layers = 0;
  int fallback_layers = 0;   // ITF layers that fell back to per-head H2O
  double kept_fraction = 0;  // mean over layers and KV heads of kept / n_prefix
};

// The kept prefix tokens of one configuration. `importance` is the H2O column sums of the
// item's question against the full prefix (ForwardResult::importance, per_kv_head, columns
// [0, n_prefix) used); `static_importance` is the same for a different question on the same
// prefix (Selector::kStatic); `seed` drives Selector::kRandom. k = RetainedTokens(retention,
// n_prefix) tokens per layer (shared sets) or per KV head (per-head sets):
//   full:   everything (empty selection);
//   itf:    SelectItf on the first `probe_heads` KV heads' scores; pass -> the voted set shared
//           by all heads; fallback -> per-KV-head H2O top-k (SPEC §IV-B);
//   h2o:    per-KV-head top-k of all heads' scores (H2O with all keys);
//   spi:    per-KV-head top-k of static_importance (static pre-identification, §III-B);
//   random: a uniformly random k-subset per layer, shared by the heads.
// REQUIRES: importance has n_layers x n_kv_heads rows of >= n_prefix columns.
PrefixSelection BuildSelection(const EvalConfig& config, const AttentionImportance& importance,
                               const AttentionImportance* static_importance, int n_prefix,
                               int probe_heads, std::uint64_t seed, SelectionStats* stats);

// Choice log-likelihoods and the first generated token for one item under one selection.
struct QueryScore {
  std::vector<double> loglik;  // per choice: sum of log p(choice token | everything before)
  int32_t first_token = -1;    // argmax after the context (the first generated token)
  int predicted = 0;           // argmax of loglik (lowest index on ties)
};

// Runs the item's context against `cache` (which holds exactly the n_prefix prefix tokens;
// restored to that length before returning) under `selection`, then each choice after it.
QueryScore ScoreQuery(const LlamaModel& model, KvCache* cache, const PrefixSelection& selection,
                      const EvalItem& item);

struct EvalOptions {
  std::vector<double> retentions = {0.5, 0.25, 0.1, 0.05};
  std::vector<double> alphas = {0, 0.6, 1, 2};
  std::vector<Selector> selectors = {Selector::kItf, Selector::kH2o, Selector::kStatic,
                                     Selector::kRandom};
  int probe_heads = 2;
  std::uint64_t seed = 1;
  int threads = 2;
  // Called after each item with (items done, items total); may print progress.
  std::function<void(int, int)> progress;
};

// One row of the accuracy table (per task and configuration).
struct AccuracyRow {
  std::string task;
  EvalConfig config;
  int items = 0;
  int correct = 0;
  int first_token_agree = 0;     // first generated token equal to the full-KV model's
  double kept_fraction_sum = 0;  // summed over items (mean = / items)
  int fallback_layers = 0;
  int layers = 0;
  double accuracy() const { return items ? double(correct) / items : 0; }
  double first_token_agreement() const { return items ? double(first_token_agree) / items : 0; }
  double mean_kept_fraction() const { return items ? kept_fraction_sum / items : 0; }
  double itf_fallback_rate() const { return layers ? double(fallback_layers) / layers : 0; }
};

// The grid: the full-KV row first, then every selector x retention (x alpha for ITF).
std::vector<EvalConfig> EvalGrid(const EvalOptions& options);

struct EvalSummary {
  std::vector<AccuracyRow> rows;  // EvalGrid order
  std::int64_t forward_tokens = 0;
  double seconds = 0;
};

// Evaluates every configuration on every item of `groups`: per group one prefill, per item
// one importance forward (the question against the full prefix), then ScoreQuery per distinct
// selection (configurations whose selections are identical, e.g. ITF at alpha 0 falling back
// in every layer and H2O, are scored once). Static pre-identification for an item uses the
// importance of the next item in its group (cyclically).
EvalSummary EvaluateGroups(const LlamaModel& model, const std::string& task,
                           const std::vector<EvalGroup>& groups, const EvalOptions& options);

}  // namespace kvtier
