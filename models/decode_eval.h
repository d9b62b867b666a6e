#pragma once
// Accuracy of low-bit decoding on the real model against the 16-bit cache (`kvtier eval
// --tasks texts,greedy,niah`; SpeCache §4: LongBench, Needle-in-a-Haystack, Tables 1, 4, 5 and
// Fig. 5). Three tasks, built from the public-domain texts of data/texts:
//   texts   perplexity of a text's continuation: the first `ppl_context` tokens are the prompt
//           (prefilled at 16 bits), the next `ppl_tokens` are decoded teacher-forced, one step
//           each, and each step's logits score the token after it;
//   greedy  free-running greedy generation of `gen_tokens` tokens after a `gen_prompt`-token
//           excerpt, compared with the 16-bit cache's generation;
//   niah    needle in a haystack: a sentence "The secret number of the archive is D." (D: seven
//           digits drawn from the seed) is placed at a depth of a haystack cut from one text
//           (hard line wraps undone: a single newline becomes a space),
//           the prompt ends "... What is the secret number of the archive? The secret number of
//           the archive is", and `niah_answer_tokens` are generated greedily; a case is correct
//           when the generated text contains D. Depth d puts the needle after the first
//           sentence end at or after d * (haystack tokens) (the end for d = 1). The first
//           answer token comes from the 16-bit prefill, the rest from low-bit decode steps.
// Every configuration decodes the same samples from the same 16-bit prefill; the 16-bit cache
// (`full`) runs first and is the reference for agreement.
//
// Configurations (DecodeEvalGrid): full; per bit width b: kivi (residual `kivi_residual`, the
// paper's KIVI baseline uses 128), specache and specache_nospec for every k (residual
// `residual`, the paper's SpeCache uses 64, §4.1); and, for Table 5's ablation, kivi and
// specache (k = ablation_k) at 1 bit with the original KIVI zero-point and scale.
//
// Thread safety: pure given its inputs; EvaluateDecode runs `threads` workers over the
// configurations of a sample, each with its own copy of the prefilled cache.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/decode.h"
#include "models/llama.h"

namespace kvtier {

// "texts", "greedy", "niah".
const std::vector<std::string>& DecodeTaskNames();

// Throws InputError naming the flag when `o` asks for an unknown task, a length below one token
// or a needle depth outside [0, 1]. BuildDecodeSamples calls it; `kvtier eval` calls it first,
// before the model loads or the results file is opened.
struct DecodeTaskOptions;
void CheckDecodeTaskOptions(const DecodeTaskOptions& o);

// One prompt of a decode task.
struct DecodeSample {
  std::string task;               // texts | greedy | niah
  std::string name;               // e.g. "alice_ch1-2.txt", "niah 1024 tokens depth 0.50"
  std::vector<int32_t> prompt;    // prefilled at 16 bits
  std::vector<int32_t> forced;    // texts: the continuation, decoded teacher-forced
  int generate = 0;               // greedy, niah: tokens generated after the prompt
  std::string answer;             // niah: the needle's digits
};

struct DecodeTaskOptions {
  std::vector<std::string> tasks = {"texts", "greedy", "niah"};
  int ppl_context = 1024;  // texts: prompt tokens
  int ppl_tokens = 256;    // texts: tokens scored (decode steps)
  int gen_prompt = 512;    // greedy: prompt tokens (an excerpt starting at token 2048)
  int gen_tokens = 32;     // greedy: tokens generated
  std::vector<int> niah_lengths = {512, 1024, 2048};           // prompt tokens
  std::vector<double> niah_depths = {0, 0.25, 0.5, 0.75, 1.0};  // of the haystack
  int niah_answer_tokens = 10;
  std::string niah_text = "federalist_1-4.txt";  // the haystack's file in text_dir
  std::uint64_t seed = 1;                        // the needles' digits
};

// Builds the samples from the *.txt files of `text_dir` (data/texts; Project Gutenberg
// headers stripped). texts and greedy: one sample per file, in name order. Throws InputError
// for an unknown task, a missing directory or file, or a text too short for the lengths asked.
std::vector<DecodeSample> BuildDecodeSamples(const LlamaModel& model, const std::string& text_dir,
                                             const DecodeTaskOptions& options);

struct DecodeEvalOptions {
  std::vector<int> bits = {1, 2};
  std::vector<int> ks = {16, 32, 64, 128};
  int group = 32;
  int residual = 64;
  int kivi_residual = 128;
  bool nospec = true;     // specache_nospec rows
  int ablation_k = 64;    // Table 5 rows with the original 1-bit KIVI (0: none)
  int threads = 1;
  // Called after each (sample, configuration) with (done, total), one call at a time (from
  // any worker thread).
  std::function<void(int, int)> progress;
};

// The configurations, the 16-bit cache first.
std::vector<DecodeOptions> DecodeEvalGrid(const DecodeEvalOptions& options);

// "full", "kivi 2-bit", "specache 1-bit k=64", "kivi 1-bit original", ...
std::string DecodeConfigLabel(const DecodeOptions& config);

// One row of the accuracy table: a task under one configuration, summed over its samples.
struct DecodeAccuracyRow {
  std::string task;
  DecodeOptions config;
  int items = 0;    // texts: scored tokens; greedy, niah: samples
  int correct = 0;  // texts: argmax = the text's token; greedy: generation identical to the
                    // 16-bit cache's; niah: the answer contains the needle
  double nll = 0;   // texts: summed negative log-likelihood of the scored tokens
  std::int64_t agree = 0, compared = 0;  // texts: argmax = the 16-bit argmax (teacher-forced);
                                         // greedy, niah: tokens before the first difference
  int first_agree = 0;  // texts: as agree; greedy, niah: the first decoded token agrees
  double hit_share = 0, oracle_share = 0;  // sums over (step, layer, query head)
  std::int64_t shares = 0;
  double low_bit_mass = 0;
  std::int64_t heads = 0;
  double kept_sum = 0;  // per step: positions read in 16 bits / positions cached
  std::int64_t steps = 0;
  double kv_ratio_sum = 0;  // per sample, DecodeKvSizeRatio at the prompt's length

  double accuracy() const { return items ? double(correct) / items : 0; }
  double perplexity() const;  // exp(nll / items); texts only
  double token_agreement() const { return compared ? double(agree) / compared : 0; }
  double first_token_agreement() const { return items ? double(first_agree) / items : 0; }
  double hit_rate() const { return shares ? hit_share / shares : 0; }
  double oracle_hit_rate() const { return shares ? oracle_share / shares : 0; }
  double low_bit_attention() const { return heads ? low_bit_mass / heads : 0; }
  double mean_kept_fraction() const { return steps ? kept_sum / steps : 1; }
  int samples = 0;
  double kv_size_ratio() const { return samples ? kv_ratio_sum / samples : 0; }
};

struct DecodeEvalSummary {
  std::vector<DecodeAccuracyRow> rows;  // per task (in DecodeTaskNames order), grid order
  std::int64_t decode_steps = 0;        // Decoder::Step calls
  std::int64_t prefill_tokens = 0;
  double seconds = 0;
};

// Runs every configuration on every sample (see the header comment).
DecodeEvalSummary EvaluateDecode(const LlamaModel& model, const std::vector<DecodeSample>& samples,
                                 const DecodeEvalOptions& options);

}  // namespace kvtier
