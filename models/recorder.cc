// Recording real importance traces (see recorder.h).

#include "models/recorder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include "core/errors.h"
#include "core/input_file.h"
#include "core/itf.h"
#include "models/decode.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

std::uint64_t Mix(std::uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The text between Project Gutenberg's START and END lines when present, CRLF -> LF.
std::string BookBody(const std::string& raw) {
  std::string s;
  s.reserve(raw.size());
  for (char c : raw) {
    if (c != '\r') s.push_back(c);
  }
  const size_t start = s.find("*** START OF");
  if (start != std::string::npos) {
    const size_t eol = s.find('\n', start);
    s = s.substr(eol == std::string::npos ? s.size() : eol + 1);
  }
  const size_t end = s.find("*** END OF");
  if (end != std::string::npos) s = s.substr(0, end);
  return s;
}

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::string Join(const std::vector<std::string>& w, size_t a, size_t b) {
  std::string s;
  for (size_t i = a; i < b && i < w.size(); ++i) {
    if (i > a) s += ' ';
    s += w[i];
  }
  return s;
}

}  // namespace

std::vector<PromptGroup> BuildFewShotPrompts(const LlamaModel& model, const McTask& task,
                                             const FewShotPromptOptions& o) {
  if (o.prompts < 1 || o.queries_per_prompt < 1 || o.examples_min < 0 ||
      o.examples_max < o.examples_min || o.max_prefix_tokens < 1) {
    throw InputError("record: need prompts >= 1, queries >= 1, 0 <= examples-min <= examples-max");
  }
  if (static_cast<size_t>(o.examples_max) > task.shot_pool.size()) {
    throw InputError("record: examples-max " + std::to_string(o.examples_max) + " exceeds the " +
                     task.name + " pool of " + std::to_string(task.shot_pool.size()));
  }
  const size_t need = static_cast<size_t>(o.prompts) * o.queries_per_prompt;
  if (need > task.items.size()) {
    throw InputError("record: " + std::to_string(need) + " queries but " + task.name + " has " +
                     std::to_string(task.items.size()) + " items");
  }
  std::vector<PromptGroup> groups(o.prompts);
  const std::string header = "The following are questions (with answers) about " +
                             std::string(task.name == "piqa" ? "physical commonsense" : task.name) +
                             ".\n\n";
  for (int g = 0; g < o.prompts; ++g) {
    std::mt19937_64 rng(Mix(o.seed * 7777ull + g));
    const int n_ex = std::uniform_int_distribution<int>(o.examples_min, o.examples_max)(rng);
    std::vector<size_t> idx(task.shot_pool.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    for (int s = 0; s < n_ex; ++s) {
      std::swap(idx[s], idx[std::uniform_int_distribution<size_t>(s, idx.size() - 1)(rng)]);
    }
    std::vector<int32_t> prefix = model.Tokenize(header);
    for (int s = 0; s < n_ex; ++s) {
      const McItem& ex = task.shot_pool[idx[s]];
      const std::vector<int32_t> t = model.Tokenize(ex.context + ex.choices[ex.label] + "\n\n");
      if (prefix.size() + t.size() > static_cast<size_t>(o.max_prefix_tokens)) break;
      prefix.insert(prefix.end(), t.begin(), t.end());
    }
    if (prefix.size() > static_cast<size_t>(o.max_prefix_tokens)) prefix.resize(o.max_prefix_tokens);
    groups[g].prefix = std::move(prefix);
    for (int q = 0; q < o.queries_per_prompt; ++q) {
      groups[g].queries.push_back(
          model.Tokenize(task.items[static_cast<size_t>(g) * o.queries_per_prompt + q].context));
    }
  }
  return groups;
}

std::vector<PromptGroup> BuildRagPrompts(const LlamaModel& model, const std::string& text_dir,
                                         const RagPromptOptions& o) {
  if (o.prompts < 1 || o.queries_per_prompt < 1 || o.docs_per_prompt < 1 || o.doc_tokens < 8 ||
      o.max_prefix_tokens < 1) {
    throw InputError("record: need prompts, queries, docs >= 1 and doc-tokens >= 8");
  }
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(text_dir, ec)) {
    for (const auto& e : fs::directory_iterator(text_dir)) {
      if (e.path().extension() == ".txt") files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(text_dir + ": no .txt documents for --dataset rag");
  // Documents: consecutive excerpts of about doc_tokens tokens (~0.75 words per token).
  const size_t doc_words = std::max<size_t>(4, static_cast<size_t>(o.doc_tokens * 3 / 4));
  std::vector<std::vector<std::string>> docs;
  for (const std::string& f : files) {
    const std::vector<std::string> w =
        Words(BookBody(ReadInputFile(f, kMaxDataFileBytes, "text document")));
    for (size_t a = 0; a + doc_words <= w.size(); a += doc_words) {
      docs.emplace_back(w.begin() + a, w.begin() + a + doc_words);
    }
  }
  if (docs.size() < static_cast<size_t>(o.docs_per_prompt)) {
    throw InputError(text_dir + ": too little text for " + std::to_string(o.docs_per_prompt) +
                     " documents of " + std::to_string(o.doc_tokens) + " tokens");
  }
  std::vector<PromptGroup> groups(o.prompts);
  for (int g = 0; g < o.prompts; ++g) {
    std::mt19937_64 rng(Mix(o.seed * 9901ull + g));
    std::vector<size_t> pick;
    while (pick.size() < static_cast<size_t>(o.docs_per_prompt)) {
      const size_t d = std::uniform_int_distribution<size_t>(0, docs.size() - 1)(rng);
      if (std::find(pick.begin(), pick.end(), d) == pick.end()) pick.push_back(d);
    }
    std::string text;
    for (size_t i = 0; i < pick.size(); ++i) {
      text += "Document " + std::to_string(i + 1) + ":\n" + Join(docs[pick[i]], 0, doc_words) + "\n\n";
    }
    std::vector<int32_t> prefix = model.Tokenize(text);
    if (prefix.size() > static_cast<size_t>(o.max_prefix_tokens)) prefix.resize(o.max_prefix_tokens);
    groups[g].prefix = std::move(prefix);
    for (int q = 0; q < o.queries_per_prompt; ++q) {
      const std::vector<std::string>& d = docs[pick[q % pick.size()]];
      const size_t phrase = std::min<size_t>(5, d.size());
      const size_t at = std::uniform_int_distribution<size_t>(0, d.size() - phrase)(rng);
      groups[g].queries.push_back(model.Tokenize("Question: Which document mentions \"" +
                                                 Join(d, at, at + phrase) +
                                                 "\", and what does it say about it?\nAnswer:"));
    }
  }
  return groups;
}

RecordSummary RecordTrace(const LlamaModel& model, const std::vector<PromptGroup>& groups,
                          const RecordOptions& o, const std::string& path) {
  const LlamaConfig& c = model.config();
  if (o.bits != 8 && o.bits != 16) throw InputError("record: --bits must be 8 or 16");
  if (!(o.rate > 0) || !std::isfinite(o.rate)) throw InputError("record: --rate must be > 0");
  if (o.decode_steps < 0 || o.decode_k < 1) throw InputError("record: need decode-steps >= 0, decode-k >= 1");
  if (o.decode_bits != 0 && o.decode_bits != 1 && o.decode_bits != 2) {
    throw InputError("record: --decode-bits must be 0 (16-bit decode), 1 or 2");
  }
  DecodeOptions decode;
  decode.method = o.decode_bits == 0 ? DecodeMethod::kFull : DecodeMethod::kSpeCache;
  decode.quant = o.decode_quant;
  decode.quant.bits = o.decode_bits == 0 ? 2 : o.decode_bits;
  if (o.decode_bits != 0) decode.quant.Validate(c.head_dim);
  decode.k = o.decode_k;
  decode.measure = true;
  decode.keep_exact_scores = true;
  // Request order: every (group, query) pair once, shuffled, so prefixes interleave.
  std::vector<std::pair<int, int>> order;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].prefix.empty()) throw InputError("record: prompt " + std::to_string(g) + " has an empty prefix");
    if (groups[g].queries.empty()) throw InputError("record: prompt " + std::to_string(g) + " has no queries");
    for (size_t q = 0; q < groups[g].queries.size(); ++q) {
      // SpeCache's last step puts its speculative token one position further.
      const size_t total = groups[g].prefix.size() + groups[g].queries[q].size() + o.decode_steps +
                           (o.decode_steps > 0 && o.decode_bits != 0 ? 1 : 0);
      if (groups[g].queries[q].empty()) throw InputError("record: empty query");
      if (total > static_cast<size_t>(c.context_length)) {
        throw InputError("record: prompt " + std::to_string(g) + " query " + std::to_string(q) +
                         " needs " + std::to_string(total) + " positions, longer than the context " +
                         std::to_string(c.context_length));
      }
      order.emplace_back(static_cast<int>(g), static_cast<int>(q));
    }
  }
  std::mt19937_64 rng(Mix(o.seed));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<double> arrival(order.size());
  double t = 0;
  std::exponential_distribution<double> gap(o.rate);
  for (size_t i = 0; i < order.size(); ++i) {
    t += gap(rng);
    arrival[i] = t;
  }

  TraceHeader h;
  h.producer = "kvtier trace record 0.1";
  h.model = {o.model_name, c.n_layers, c.n_heads, c.n_kv_heads};
  h.metadata = {{"workload", o.workload},
                {"seed", std::to_string(o.seed)},
                {"arrival", "poisson"},
                {"rate", std::to_string(o.rate)},
                {"source", o.source},
                {"gguf", std::filesystem::path(model.path()).filename().string()}};
  if (o.decode_steps > 0) {
    h.metadata.emplace_back("decode_method", DecodeMethodName(decode.method));
    if (o.decode_bits != 0) {
      h.metadata.emplace_back("decode_bits", std::to_string(decode.quant.bits));
      h.metadata.emplace_back("decode_group", std::to_string(decode.quant.group));
      h.metadata.emplace_back("decode_residual", std::to_string(decode.quant.residual));
      h.metadata.emplace_back("decode_quant", decode.quant.bits == 1 && !decode.quant.improved_1bit
                                                  ? "kivi" : "improved");
    }
    h.metadata.emplace_back("decode_k", std::to_string(o.decode_k));
  }
  std::vector<TraceRecord> records(order.size());
  RecordSummary sum;
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  // Group by prefix: one prefill each; requests are filled into their arrival slots.
  std::vector<std::vector<size_t>> by_group(groups.size());
  for (size_t i = 0; i < order.size(); ++i) by_group[order[i].first].push_back(i);
  std::vector<float> scores;
  for (size_t g = 0; g < groups.size(); ++g) {
    const PromptGroup& pg = groups[g];
    const int n_prefix = static_cast<int>(pg.prefix.size());
    KvCache cache = model.NewCache();
    model.Prefill(pg.prefix, &cache);
    sum.prefix_tokens += n_prefix;
    for (size_t slot : by_group[g]) {
      const std::vector<int32_t>& query = pg.queries[order[slot].second];
      ForwardOptions fo;
      fo.importance = true;
      fo.update_cache = o.decode_steps > 0;
      ForwardResult r = model.Forward(query, &cache, {}, fo);
      sum.query_tokens += static_cast<std::int64_t>(query.size());
      TraceRecord& rec = records[slot];
      rec.request.id = slot;
      rec.request.arrival_s = arrival[slot];
      rec.request.prefix.assign(pg.prefix.begin(), pg.prefix.end());
      rec.request.tokens_per_symbol = 1;
      rec.request.query_tokens = static_cast<std::int64_t>(query.size());
      rec.request.output_tokens = o.decode_steps > 0 ? o.decode_steps : o.output_tokens;
      rec.prefix_kind = PrefixKind::kTokens;
      rec.query_ids.assign(query.begin(), query.end());
      rec.importance = ImportanceKind::kExplicit;
      scores.assign(static_cast<size_t>(c.n_layers) * c.n_kv_heads * n_prefix, 0.f);
      for (int l = 0; l < c.n_layers; ++l) {
        for (int kv = 0; kv < c.n_kv_heads; ++kv) {
          const std::vector<float>& col = r.importance.per_kv_head[l][kv];
          std::copy(col.begin(), col.begin() + n_prefix,
                    scores.begin() + (static_cast<size_t>(l) * c.n_kv_heads + kv) * n_prefix);
        }
      }
      rec.explicit_scores = ExplicitScores::Quantize(c.n_layers, c.n_kv_heads, n_prefix, scores, o.bits);
      if (o.decode_steps > 0) {
        // The prompt (prefix + query) is in the cache at 16 bits, as SpeCache's prefill leaves
        // it; decode greedily from the query's last logits.
        Decoder decoder(model, cache, decode);
        const int n_prompt = cache.n_tokens;
        DecodeTopK d;
        d.steps = o.decode_steps;
        d.k = std::min<int>(o.decode_k, n_prompt);
        DecodeTopKSets sets;
        sets.steps = o.decode_steps;
        sets.k = o.decode_k;
        sets.layers = c.n_layers;
        sets.kv_heads = c.n_kv_heads;
        int32_t next = ArgMax(r.LastLogits(c.vocab_size));
        std::vector<float> agg;
        for (int s = 0; s < o.decode_steps; ++s) {
          next = ArgMax(decoder.Step(next));
          const DecodeStepInfo& info = decoder.last();
          agg.assign(info.context + 1, 0.f);
          for (const auto& layer : info.exact_scores) {
            for (const auto& head : layer) {
              for (int j = 0; j <= info.context; ++j) agg[j] += head[j];
            }
          }
          const TokenSet top = TopK(agg, d.k);
          d.positions.insert(d.positions.end(), top.begin(), top.end());
          sets.context.push_back(info.context);
          sets.candidates.push_back(o.decode_bits == 0 ? info.context : info.low_bit);
          for (int l = 0; l < c.n_layers; ++l) {
            for (int kv = 0; kv < c.n_kv_heads; ++kv) {
              sets.output.emplace_back(info.exact[l][kv].begin(), info.exact[l][kv].end());
              if (o.decode_bits != 0) {
                sets.prefetched.emplace_back(info.fetched[l][kv].begin(), info.fetched[l][kv].end());
              }
            }
          }
          ++sum.decode_tokens;
        }
        rec.decode_topk = std::move(d);
        rec.decode_sets = std::move(sets);
      }
      cache.Truncate(n_prefix);
      if (o.progress) o.progress(++done, static_cast<int>(order.size()));
    }
  }
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TraceWriter w(path, h);
  for (const TraceRecord& rec : records) w.Write(rec);
  w.Close();
  sum.records = w.records_written();
  sum.bytes = w.bytes_written();
  return sum;
}

}  // namespace kvtier
