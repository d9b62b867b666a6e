// Decode-phase accuracy of KIVI and SpeCache against the 16-bit cache (see decode_eval.h).

#include "models/decode_eval.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "core/errors.h"
#include "core/input_file.h"

namespace kvtier {
namespace {

// Bounded like every text read whole (core/input_file.h): an endless file stops with an error.
std::string ReadText(const std::string& path) {
  std::string s;
  for (char c : ReadInputFile(path, kMaxDataFileBytes, "decode text")) {
    if (c != '\r') s.push_back(c);
  }
  return s;
}

std::uint64_t Mix(std::uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The text with its hard line wraps undone: a single newline becomes a space, paragraph breaks
// (blank lines) stay. Wrapped lines made SmolLM2 answer the needle question with a newline and
// more haystack even at 16 bits (tried: 256-token prompt, depth 0.5).
std::string Unwrap(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n') {
      out.push_back(s[i]);
      continue;
    }
    size_t j = i;
    while (j < s.size() && s[j] == '\n') ++j;
    out += j - i >= 2 ? "\n\n" : " ";
    i = j - 1;
  }
  return out;
}

constexpr char kNeedle[] = " The secret number of the archive is ";
constexpr char kQuestion[] =
    "\n\nWhat is the secret number of the archive? The secret number of the archive is";

std::string Digits(std::uint64_t seed, int case_index) {
  std::mt19937_64 rng(Mix(seed * 1000003ull + static_cast<std::uint64_t>(case_index)));
  std::string d(1, static_cast<char>('1' + rng() % 9));
  for (int i = 1; i < 7; ++i) d.push_back(static_cast<char>('0' + rng() % 10));
  return d;
}

// What one configuration did on one sample.
struct SampleRun {
  std::vector<int32_t> outputs;  // per step: argmax of the step's logits
  double nll = 0;                // texts
  int text_correct = 0;          // texts: argmax = the text's next token
  std::string answer_text;       // niah: the decoded answer (first token from the prefill)
  LowBitAttentionResult::Mass mass;
  double kept_sum = 0;
  std::int64_t steps = 0;
};

SampleRun RunSample(const LlamaModel& model, const KvCache& prefilled, int32_t first_token,
                    const DecodeOptions& config, const DecodeSample& s) {
  DecodeOptions o = config;
  o.measure = config.method != DecodeMethod::kFull;
  Decoder d(model, prefilled, o);
  SampleRun r;
  const bool forced = !s.forced.empty();
  const int steps = forced ? static_cast<int>(s.forced.size()) - 1 : s.generate;
  int32_t token = forced ? s.forced[0] : first_token;
  std::vector<int32_t> answer = {first_token};
  for (int i = 0; i < steps; ++i) {
    const std::span<const float> logits = d.Step(token);
    const int32_t best = ArgMax(logits);
    r.outputs.push_back(best);
    const DecodeStepInfo& info = d.last();
    r.mass.low_bit += info.mass.low_bit;
    r.mass.hit_share += info.mass.hit_share;
    r.mass.oracle_share += info.mass.oracle_share;
    r.mass.heads += info.mass.heads;
    r.mass.shares += info.mass.shares;
    double fetched = 0;
    int heads = 0;
    for (const auto& layer : info.fetched) {
      for (const auto& head : layer) {
        fetched += static_cast<double>(head.size());
        ++heads;
      }
    }
    const double sixteen = config.method == DecodeMethod::kFull
                               ? info.context
                               : info.context - info.low_bit + (heads ? fetched / heads : 0.0);
    r.kept_sum += info.context > 0 ? sixteen / info.context : 1.0;
    ++r.steps;
    if (forced) {
      const int32_t next = s.forced[i + 1];
      const float mx = *std::max_element(logits.begin(), logits.end());
      double z = 0;
      for (float v : logits) z += std::exp(static_cast<double>(v) - mx);
      r.nll -= static_cast<double>(logits[next]) - mx - std::log(z);
      r.text_correct += best == next;
      token = next;
    } else {
      answer.push_back(best);
      token = best;
    }
  }
  if (!forced) r.answer_text = model.tokenizer() ? model.tokenizer()->Decode(answer) : "";
  return r;
}

}  // namespace

const std::vector<std::string>& DecodeTaskNames() {
  static const std::vector<std::string> kNames = {"texts", "greedy", "niah"};
  return kNames;
}

void CheckDecodeTaskOptions(const DecodeTaskOptions& o) {
  for (const std::string& t : o.tasks) {
    if (std::find(DecodeTaskNames().begin(), DecodeTaskNames().end(), t) == DecodeTaskNames().end()) {
      throw InputError("unknown decode task '" + t + "' (texts, greedy, niah)");
    }
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, long long>{"--ppl-context", o.ppl_context},
        {"--ppl-tokens", o.ppl_tokens}, {"--gen-prompt", o.gen_prompt},
        {"--gen-tokens", o.gen_tokens}, {"--niah-answer-tokens", o.niah_answer_tokens}}) {
    if (value < 1) {
      throw InputError(std::string("eval: ") + flag + " must be >= 1 (a length in tokens), got " +
                       std::to_string(value));
    }
  }
  for (double d : o.niah_depths) {
    if (!(d >= 0 && d <= 1)) throw InputError("eval: --niah-depths values must be in [0, 1]");
  }
}

std::vector<DecodeSample> BuildDecodeSamples(const LlamaModel& model, const std::string& text_dir,
                                             const DecodeTaskOptions& o) {
  namespace fs = std::filesystem;
  CheckDecodeTaskOptions(o);

  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(text_dir, ec)) {
    for (const auto& e : fs::directory_iterator(text_dir)) {
      if (e.path().extension() == ".txt") files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(text_dir + ": no .txt texts for the decode tasks");
  const auto wants = [&](const char* t) {
    return std::find(o.tasks.begin(), o.tasks.end(), t) != o.tasks.end();
  };
  std::vector<DecodeSample> out;
  for (const char* task : {"texts", "greedy"}) {
    if (!wants(task)) continue;
    for (const std::string& f : files) {
      const std::vector<int32_t> t = model.Tokenize(ReadText(f));
      DecodeSample s;
      s.task = task;
      s.name = fs::path(f).filename().string();
      if (std::string(task) == "texts") {
        const size_t need = static_cast<size_t>(o.ppl_context) + o.ppl_tokens + 1;
        if (t.size() < need) {
          throw InputError(f + ": " + std::to_string(t.size()) + " tokens, the texts task needs " +
                           std::to_string(need) + " (--ppl-context + --ppl-tokens + 1)");
        }
        s.prompt.assign(t.begin(), t.begin() + o.ppl_context);
        s.forced.assign(t.begin() + o.ppl_context, t.begin() + need);
      } else {
        if (t.size() < static_cast<size_t>(o.gen_prompt)) {
          throw InputError(f + ": " + std::to_string(t.size()) + " tokens, shorter than --gen-prompt " +
                           std::to_string(o.gen_prompt));
        }
        const size_t at = std::min<size_t>(2048, t.size() - o.gen_prompt);
        s.prompt.assign(t.begin() + at, t.begin() + at + o.gen_prompt);
        s.generate = o.gen_tokens;
      }
      out.push_back(std::move(s));
    }
  }
  if (wants("niah")) {
    const std::string path = text_dir + "/" + o.niah_text;
    const std::vector<int32_t> hay = model.Tokenize(Unwrap(ReadText(path)));
    const Tokenizer* tok = model.tokenizer();
    int case_index = 0;
    for (int len : o.niah_lengths) {
      for (double depth : o.niah_depths) {
        DecodeSample s;
        s.task = "niah";
        s.answer = Digits(o.seed, case_index++);
        const std::vector<int32_t> needle = model.Tokenize(kNeedle + s.answer + ".");
        const std::vector<int32_t> question = model.Tokenize(kQuestion);
        const int h = len - static_cast<int>(needle.size() + question.size());
        if (h < 1 || static_cast<size_t>(h) > hay.size()) {
          throw InputError(path + ": a " + std::to_string(len) + "-token needle-in-a-haystack prompt "
                           "needs " + std::to_string(std::max(h, 1)) + " haystack tokens; the text has " +
                           std::to_string(hay.size()));
        }
        // After the first sentence end at or past depth * h.
        int at = static_cast<int>(std::lround(depth * h));
        if (at > 0) {
          while (at < h) {
            const std::string piece = tok->TokenBytes(hay[at - 1]);
            if (!piece.empty() && piece.find('.') != std::string::npos &&
                piece.find_last_not_of(" \n") != std::string::npos &&
                piece[piece.find_last_not_of(" \n")] == '.') {
              break;
            }
            ++at;
          }
        }
        s.prompt.assign(hay.begin(), hay.begin() + at);
        s.prompt.insert(s.prompt.end(), needle.begin(), needle.end());
        s.prompt.insert(s.prompt.end(), hay.begin() + at, hay.begin() + h);
        s.prompt.insert(s.prompt.end(), question.begin(), question.end());
        s.generate = o.niah_answer_tokens;
        char name[96];
        std::snprintf(name, sizeof name, "niah %d tokens depth %.2f (needle at token %d)", len, depth, at);
        s.name = name;
        out.push_back(std::move(s));
      }
    }
  }
  for (const DecodeSample& s : out) {
    // The last step decodes at position prompt + steps - 1; SpeCache's speculative token
    // takes the position after it.
    const size_t steps = s.forced.empty() ? s.generate : s.forced.size() - 1;
    const size_t total = s.prompt.size() + steps + 1;
    if (total > static_cast<size_t>(model.config().context_length)) {
      throw InputError("eval: " + s.task + " sample '" + s.name + "' needs " + std::to_string(total) +
                       " positions, longer than the context " +
                       std::to_string(model.config().context_length));
    }
  }
  return out;
}

std::vector<DecodeOptions> DecodeEvalGrid(const DecodeEvalOptions& o) {
  std::vector<DecodeOptions> grid(1);  // full
  const auto make = [&](DecodeMethod m, int bits, int k, bool improved) {
    DecodeOptions d;
    d.method = m;
    d.quant.bits = bits;
    d.quant.group = o.group;
    d.quant.residual = m == DecodeMethod::kKivi ? o.kivi_residual : o.residual;
    d.quant.improved_1bit = improved;
    d.k = m == DecodeMethod::kKivi ? 0 : k;
    return d;
  };
  for (int b : o.bits) {
    grid.push_back(make(DecodeMethod::kKivi, b, 0, true));
    for (int k : o.ks) grid.push_back(make(DecodeMethod::kSpeCache, b, k, true));
    if (o.nospec) {
      for (int k : o.ks) grid.push_back(make(DecodeMethod::kSpeCacheNoSpec, b, k, true));
    }
  }
  if (o.ablation_k > 0) {
    grid.push_back(make(DecodeMethod::kKivi, 1, 0, false));
    grid.push_back(make(DecodeMethod::kSpeCache, 1, o.ablation_k, false));
  }
  return grid;
}

std::string DecodeConfigLabel(const DecodeOptions& c) {
  std::string s = DecodeMethodName(c.method);
  if (c.method == DecodeMethod::kFull) return s;
  s += " " + std::to_string(c.quant.bits) + "-bit";
  if (c.method != DecodeMethod::kKivi) s += " k=" + std::to_string(c.k);
  if (c.quant.bits == 1 && !c.quant.improved_1bit) s += " original";
  return s;
}

double DecodeAccuracyRow::perplexity() const {
  return items ? std::exp(nll / items) : 0;
}

DecodeEvalSummary EvaluateDecode(const LlamaModel& model, const std::vector<DecodeSample>& samples,
                                 const DecodeEvalOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<DecodeOptions> grid = DecodeEvalGrid(o);
  for (const DecodeOptions& c : grid) {
    if (c.method != DecodeMethod::kFull) c.quant.Validate(model.config().head_dim);
  }
  DecodeEvalSummary out;
  std::vector<std::string> tasks;
  for (const std::string& t : DecodeTaskNames()) {
    for (const DecodeSample& s : samples) {
      if (s.task == t) {
        tasks.push_back(t);
        break;
      }
    }
  }
  for (const std::string& t : tasks) {
    for (const DecodeOptions& c : grid) {
      DecodeAccuracyRow r;
      r.task = t;
      r.config = c;
      out.rows.push_back(r);
    }
  }
  const int total = static_cast<int>(samples.size() * grid.size());
  int done = 0;
  const int threads = std::max(1, o.threads);
  for (const DecodeSample& s : samples) {
    const size_t task_index = std::find(tasks.begin(), tasks.end(), s.task) - tasks.begin();
    KvCache base;
    const ForwardResult pre = model.Prefill(s.prompt, &base);
    out.prefill_tokens += static_cast<std::int64_t>(s.prompt.size());
    const int32_t first = ArgMax(pre.LastLogits(model.config().vocab_size));
    std::vector<SampleRun> runs(grid.size());
    runs[0] = RunSample(model, base, first, grid[0], s);  // the 16-bit reference
    if (o.progress) o.progress(++done, total);
    if (threads == 1) {
      for (size_t c = 1; c < grid.size(); ++c) {
        runs[c] = RunSample(model, base, first, grid[c], s);
        if (o.progress) o.progress(++done, total);
      }
    } else {
      std::atomic<size_t> next{1};
      std::mutex mu;
      std::exception_ptr error;
      auto worker = [&]() {
        omp_set_num_threads(1);  // no nested teams on a shared machine
        try {
          for (size_t c; (c = next.fetch_add(1)) < grid.size();) {
            runs[c] = RunSample(model, base, first, grid[c], s);
            std::lock_guard<std::mutex> lock(mu);
            if (o.progress) o.progress(++done, total);
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          next = grid.size();  // the others stop after their current configuration
        }
      };
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
      for (auto& th : pool) th.join();
      if (error) std::rethrow_exception(error);
    }
    const SampleRun& ref = runs[0];
    for (size_t c = 0; c < grid.size(); ++c) {
      const SampleRun& r = runs[c];
      DecodeAccuracyRow& row = out.rows[task_index * grid.size() + c];
      out.decode_steps += r.steps;
      ++row.samples;
      row.kv_ratio_sum += DecodeKvSizeRatio(model.config(), grid[c], static_cast<int>(s.prompt.size()));
      row.hit_share += r.mass.hit_share;
      row.oracle_share += r.mass.oracle_share;
      row.shares += r.mass.shares;
      row.low_bit_mass += r.mass.low_bit;
      row.heads += r.mass.heads;
      row.kept_sum += r.kept_sum;
      row.steps += r.steps;
      if (s.task == "texts") {
        const int n = static_cast<int>(r.outputs.size());
        row.items += n;
        row.correct += r.text_correct;
        row.nll += r.nll;
        int agree = 0;
        for (int i = 0; i < n; ++i) agree += r.outputs[i] == ref.outputs[i];
        row.agree += agree;
        row.compared += n;
        row.first_agree += agree;
      } else {
        const int n = static_cast<int>(r.outputs.size());
        int same = 0;
        while (same < n && r.outputs[same] == ref.outputs[same]) ++same;
        ++row.items;
        row.agree += same;
        row.compared += n;
        row.first_agree += n > 0 && r.outputs[0] == ref.outputs[0];
        if (s.task == "greedy") {
          row.correct += same == n;
        } else {
          row.correct += r.answer_text.find(s.answer) != std::string::npos;
        }
      }
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kvtier
