// Multiple-choice accuracy under prefix-KV selection (see eval.h). The JSON reader here is the
// minimum the four task files need (objects, arrays, strings with escapes, numbers, literals).

#include "models/eval.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "core/errors.h"
#include "core/input_file.h"
#include "core/itf.h"

namespace kvtier {
namespace {

// ---- a small JSON reader ----------------------------------------------------------------

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  double number = 0;
  bool boolean = false;
  std::string str;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* Find(const std::string& key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}
  Json Parse() {
    Json v = Value();
    Ws();
    if (i_ != s_.size()) Fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) {
    throw InputError(what + " at column " + std::to_string(i_ + 1));
  }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  char Peek() {
    Ws();
    if (i_ >= s_.size()) Fail("unexpected end of line");
    return s_[i_];
  }
  void Expect(char c) {
    if (Peek() != c) Fail(std::string("expected '") + c + "'");
    ++i_;
  }
  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(char(cp));
    } else if (cp < 0x800) {
      out->push_back(char(0xC0 | (cp >> 6)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(char(0xE0 | (cp >> 12)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(char(0xF0 | (cp >> 18)));
      out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    }
  }
  uint32_t Hex4() {
    if (i_ + 4 > s_.size()) Fail("short \\u escape");
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else Fail("bad \\u escape");
    }
    return v;
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) Fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) Fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out.push_back(e); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = Hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 1 < s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            i_ += 2;
            const uint32_t lo = Hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(&out, cp);
          break;
        }
        default: Fail("bad escape");
      }
    }
  }
  // Task data is one or two levels deep; the bound keeps a hostile line (10^5 nested arrays)
  // from overflowing the stack of this recursive reader (it was a SIGSEGV, exit 139).
  static constexpr int kMaxDepth = 64;
  Json Value(int depth = 0) {
    Json v;
    const char c = Peek();
    if ((c == '{' || c == '[') && depth >= kMaxDepth) {
      Fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    if (c == '{') {
      v.kind = Json::Kind::kObject;
      ++i_;
      if (Peek() == '}') { ++i_; return v; }
      while (true) {
        std::string key = String();
        Expect(':');
        v.object.emplace_back(std::move(key), Value(depth + 1));
        if (Peek() == ',') { ++i_; continue; }
        Expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::kArray;
      ++i_;
      if (Peek() == ']') { ++i_; return v; }
      while (true) {
        v.array.push_back(Value(depth + 1));
        if (Peek() == ',') { ++i_; continue; }
        Expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::kString;
      v.str = String();
      return v;
    }
    for (const char* lit : {"true", "false", "null"}) {
      if (s_.substr(i_, std::strlen(lit)) == lit) {
        i_ += std::strlen(lit);
        v.kind = lit[0] == 'n' ? Json::Kind::kNull : Json::Kind::kBool;
        v.boolean = lit[0] == 't';
        return v;
      }
    }
    const size_t start = i_;
    while (i_ < s_.size() && std::strchr("+-0123456789.eE", s_[i_]) != nullptr) ++i_;
    if (start == i_) Fail("unexpected character");
    // std::stod threw std::invalid_argument ("-") or std::out_of_range ("1e99999"), which left
    // `kvtier eval` as an "internal error", exit 1.
    const std::string text(s_.substr(start, i_ - start));
    char* end = nullptr;
    errno = 0;
    v.number = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size()) {
      i_ = start;
      Fail("bad number '" + text + "'");
    }
    if (errno == ERANGE && std::abs(v.number) > 1.0) {
      i_ = start;
      Fail("number '" + text + "' out of range");
    }
    v.kind = Json::Kind::kNumber;
    return v;
  }

  std::string_view s_;
  size_t i_ = 0;
};

// Calls fn(json, "file:line") for every non-empty line of a JSON-lines file.
template <typename Fn>
void ForEachJsonLine(const std::string& path, Fn fn) {
  std::istringstream in(ReadInputFile(path, kMaxDataFileBytes, "task data"));
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    Json j;
    try {
      j = JsonParser(line).Parse();
    } catch (const InputError& e) {
      throw InputError(where + ": " + e.what());
    }
    fn(j, where);
  }
}

const std::string& Str(const Json& j, const char* key, const std::string& where) {
  const Json* v = j.Find(key);
  if (v == nullptr || v->kind != Json::Kind::kString) {
    throw InputError(where + ": missing string field '" + key + "'");
  }
  return v->str;
}

double Num(const Json& j, const char* key, const std::string& where) {
  const Json* v = j.Find(key);
  if (v == nullptr || v->kind != Json::Kind::kNumber) {
    throw InputError(where + ": missing number field '" + key + "'");
  }
  return v->number;
}

std::string Trim(std::string s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

std::vector<McItem> LoadPiqa(const std::string& dir, std::string* source) {
  const std::string data = dir + "/piqa/valid.jsonl", labels = dir + "/piqa/valid-labels.lst";
  *source = data;
  std::vector<McItem> items;
  ForEachJsonLine(data, [&](const Json& j, const std::string& where) {
    McItem it;
    it.context = "Question: " + Str(j, "goal", where) + "\nAnswer:";
    it.choices = {" " + Str(j, "sol1", where), " " + Str(j, "sol2", where)};
    items.push_back(std::move(it));
  });
  std::istringstream in(ReadInputFile(labels, kMaxDataFileBytes, "task labels"));
  std::string line;
  size_t n = 0;
  while (std::getline(in, line) && n < items.size()) {
    line = Trim(line);
    if (line != "0" && line != "1") {
      throw InputError(labels + ":" + std::to_string(n + 1) + ": label must be 0 or 1");
    }
    items[n++].label = line[0] - '0';
  }
  if (n != items.size()) throw InputError(labels + ": fewer labels than items in " + data);
  return items;
}

McItem CopaItem(const Json& j, const std::string& where) {
  std::string premise = Trim(Str(j, "premise", where));
  if (!premise.empty() && (premise.back() == '.' || premise.back() == '!')) premise.pop_back();
  const std::string& q = Str(j, "question", where);
  if (q != "cause" && q != "effect") throw InputError(where + ": question must be cause or effect");
  McItem it;
  it.context = premise + (q == "cause" ? " because" : " therefore");
  for (const char* key : {"choice1", "choice2"}) {
    std::string c = Str(j, key, where);
    if (!c.empty()) c[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(c[0])));
    it.choices.push_back(" " + c);
  }
  it.label = static_cast<int>(Num(j, "label", where));
  if (it.label != 0 && it.label != 1) throw InputError(where + ": label must be 0 or 1");
  return it;
}

McItem RteItem(const Json& j, const std::string& where) {
  McItem it;
  it.context = Str(j, "premise", where) + "\nQuestion: " + Str(j, "hypothesis", where) +
               " True or False?\nAnswer:";
  it.choices = {" True", " False"};
  const std::string& l = Str(j, "label", where);
  if (l != "entailment" && l != "not_entailment") {
    throw InputError(where + ": label must be entailment or not_entailment");
  }
  it.label = l == "entailment" ? 0 : 1;
  return it;
}

McItem ObqaItem(const Json& j, const std::string& where) {
  const Json* q = j.Find("question");
  if (q == nullptr || q->kind != Json::Kind::kObject) throw InputError(where + ": missing 'question'");
  McItem it;
  it.context = Str(*q, "stem", where);
  const Json* ch = q->Find("choices");
  if (ch == nullptr || ch->kind != Json::Kind::kArray || ch->array.size() < 2) {
    throw InputError(where + ": missing 'question.choices'");
  }
  const std::string& key = Str(j, "answerKey", where);
  it.label = -1;
  for (size_t c = 0; c < ch->array.size(); ++c) {
    it.choices.push_back(" " + Str(ch->array[c], "text", where));
    if (Str(ch->array[c], "label", where) == key) it.label = static_cast<int>(c);
  }
  if (it.label < 0) throw InputError(where + ": answerKey '" + key + "' names no choice");
  return it;
}

std::uint64_t Mix(std::uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

const std::vector<std::string>& McTaskNames() {
  static const std::vector<std::string> kNames = {"piqa", "copa", "rte", "openbookqa"};
  return kNames;
}

bool McTaskIsExternal(const std::string& task) { return task == "rte" || task == "openbookqa"; }

McTask LoadMcTask(const std::string& task, const std::string& repo_data_dir,
                  const std::string& shared_dir) {
  McTask t;
  t.name = task;
  if (task == "piqa") {
    std::vector<McItem> all = LoadPiqa(repo_data_dir, &t.source);
    const size_t pool = std::min<size_t>(100, all.size() / 2);
    t.items.assign(all.begin(), all.end() - pool);
    t.shot_pool.assign(all.end() - pool, all.end());
  } else if (task == "copa") {
    t.source = repo_data_dir + "/copa/copa-dev.jsonl";
    ForEachJsonLine(t.source, [&](const Json& j, const std::string& where) {
      const int id = static_cast<int>(Num(j, "id", where));
      (id >= 401 ? t.items : t.shot_pool).push_back(CopaItem(j, where));
    });
  } else if (task == "rte") {
    t.source = shared_dir + "/rte/val.jsonl";
    ForEachJsonLine(t.source, [&](const Json& j, const std::string& w) { t.items.push_back(RteItem(j, w)); });
    ForEachJsonLine(shared_dir + "/rte/train.jsonl",
                    [&](const Json& j, const std::string& w) { t.shot_pool.push_back(RteItem(j, w)); });
  } else if (task == "openbookqa") {
    t.source = shared_dir + "/openbookqa/test.jsonl";
    ForEachJsonLine(t.source, [&](const Json& j, const std::string& w) { t.items.push_back(ObqaItem(j, w)); });
    ForEachJsonLine(shared_dir + "/openbookqa/train.jsonl",
                    [&](const Json& j, const std::string& w) { t.shot_pool.push_back(ObqaItem(j, w)); });
  } else {
    throw InputError("unknown task '" + task + "' (piqa, copa, rte, openbookqa)");
  }
  if (t.items.empty() || t.shot_pool.empty()) {
    throw InputError(t.source + ": no items (or no few-shot pool) for task " + task);
  }
  return t;
}

std::vector<EvalGroup> BuildEvalGroups(const LlamaModel& model, const McTask& task,
                                       const EvalBuildOptions& o) {
  if (o.shots < 0 || o.items_per_prefix < 2 || o.max_prefix_tokens < 1 || o.items < 0) {
    throw InputError("eval: need shots >= 0, items per prefix >= 2, max prefix tokens >= 1");
  }
  if (static_cast<size_t>(o.shots) > task.shot_pool.size()) {
    throw InputError("eval: " + std::to_string(o.shots) + " shots but the " + task.name +
                     " pool has " + std::to_string(task.shot_pool.size()) + " examples");
  }
  const int n = o.items == 0 ? static_cast<int>(task.items.size())
                             : std::min<int>(o.items, static_cast<int>(task.items.size()));
  int n_groups = std::max(1, (n + o.items_per_prefix - 1) / o.items_per_prefix);
  // A last group of one item would have no other query for static pre-identification.
  if (n_groups > 1 && n - (n_groups - 1) * o.items_per_prefix == 1) --n_groups;
  std::vector<EvalGroup> groups(n_groups);
  for (int g = 0; g < n_groups; ++g) {
    std::mt19937_64 rng(Mix(o.seed * 1000003ull + g));
    std::vector<int> idx(task.shot_pool.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
    for (int s = 0; s < o.shots; ++s) {  // partial Fisher-Yates: the first `shots` are the pick
      std::uniform_int_distribution<size_t> d(s, idx.size() - 1);
      std::swap(idx[s], idx[d(rng)]);
    }
    std::vector<int32_t> prefix;
    for (int s = 0; s < o.shots; ++s) {
      const McItem& ex = task.shot_pool[idx[s]];
      const std::vector<int32_t> t = model.Tokenize(ex.context + ex.choices[ex.label] + "\n\n");
      if (prefix.size() + t.size() > static_cast<size_t>(o.max_prefix_tokens)) break;
      prefix.insert(prefix.end(), t.begin(), t.end());
    }
    if (prefix.empty()) {  // not even one example fits: keep its first tokens
      const McItem& ex = task.shot_pool[idx.empty() ? 0 : idx[0]];
      prefix = model.Tokenize(ex.context + ex.choices[ex.label] + "\n\n");
      prefix.resize(std::min<size_t>(prefix.size(), o.max_prefix_tokens));
    }
    groups[g].prefix = std::move(prefix);
  }
  for (int i = 0; i < n; ++i) {
    const int g = std::min(i / o.items_per_prefix, n_groups - 1);
    const McItem& it = task.items[i];
    EvalItem e;
    e.index = i;
    e.context = model.Tokenize(it.context);
    for (const std::string& c : it.choices) e.choices.push_back(model.Tokenize(c));
    e.label = it.label;
    if (e.context.empty()) throw InputError(task.name + " item " + std::to_string(i) + ": empty context");
    for (const auto& c : e.choices) {
      if (c.empty()) throw InputError(task.name + " item " + std::to_string(i) + ": empty choice");
    }
    groups[g].items.push_back(std::move(e));
  }
  return groups;
}

const char* SelectorName(Selector s) {
  switch (s) {
    case Selector::kFull: return "full";
    case Selector::kItf: return "itf";
    case Selector::kH2o: return "h2o";
    case Selector::kStatic: return "spi";
    case Selector::kRandom: return "random";
  }
  return "?";
}

PrefixSelection BuildSelection(const EvalConfig& config, const AttentionImportance& importance,
                               const AttentionImportance* static_importance, int n_prefix,
                               int probe_heads, std::uint64_t seed, SelectionStats* stats) {
  PrefixSelection sel;
  sel.n_prefix = n_prefix;
  const int n_layers = static_cast<int>(importance.per_kv_head.size());
  const int n_kv = n_layers ? static_cast<int>(importance.per_kv_head[0].size()) : 0;
  SelectionStats st;
  st.layers = n_layers;
  if (config.selector == Selector::kFull || n_prefix == 0) {
    st.kept_fraction = 1;
    if (stats) *stats = st;
    return sel;
  }
  const std::int64_t k = RetainedTokens(config.retention, n_prefix);
  const AttentionImportance& imp =
      config.selector == Selector::kStatic && static_importance ? *static_importance : importance;
  std::vector<float> rows(static_cast<size_t>(n_kv) * n_prefix);
  auto fill_rows = [&](int layer, int heads) {
    for (int h = 0; h < heads; ++h) {
      const std::vector<float>& col = imp.per_kv_head[layer][h];
      std::copy(col.begin(), col.begin() + n_prefix, rows.begin() + static_cast<size_t>(h) * n_prefix);
    }
  };
  double kept = 0;
  for (int l = 0; l < n_layers; ++l) {
    LayerKeep keep;
    switch (config.selector) {
      case Selector::kItf: {
        const int probes = std::min(probe_heads, n_kv);
        fill_rows(l, n_kv);
        ItfOptions io;
        io.probe_heads = probes;
        io.alpha = config.alpha;
        io.retention = config.retention;
        ItfDecision d = SelectItf(std::span<const float>(rows.data(), size_t(probes) * n_prefix),
                                  probes, n_prefix, io);
        if (d.fallback) {
          ++st.fallback_layers;
          keep = LayerKeep::PerKvHead(SelectPerHead(rows, n_kv, n_prefix, k));
        } else {
          keep = LayerKeep::Shared(std::move(d.voted));
        }
        break;
      }
      case Selector::kH2o:
      case Selector::kStatic:
        fill_rows(l, n_kv);
        keep = LayerKeep::PerKvHead(SelectPerHead(rows, n_kv, n_prefix, k));
        break;
      case Selector::kRandom: {
        std::mt19937_64 rng(Mix(seed ^ Mix(static_cast<std::uint64_t>(l) * 7919 + 1)));
        std::vector<int32_t> idx(n_prefix);
        for (int t = 0; t < n_prefix; ++t) idx[t] = t;
        for (std::int64_t s = 0; s < k; ++s) {
          std::uniform_int_distribution<std::int64_t> d(s, n_prefix - 1);
          std::swap(idx[s], idx[d(rng)]);
        }
        idx.resize(k);
        std::sort(idx.begin(), idx.end());
        keep = LayerKeep::Shared(std::move(idx));
        break;
      }
      case Selector::kFull:
        break;
    }
    if (keep.mode == LayerKeep::Mode::kShared) {
      kept += static_cast<double>(keep.shared.size()) / n_prefix;
    } else {
      double s = 0;
      for (const auto& h : keep.per_kv_head) s += static_cast<double>(h.size()) / n_prefix;
      kept += s / std::max<size_t>(1, keep.per_kv_head.size());
    }
    sel.layers.push_back(std::move(keep));
  }
  st.kept_fraction = n_layers ? kept / n_layers : 1;
  if (stats) *stats = st;
  return sel;
}

QueryScore ScoreQuery(const LlamaModel& model, KvCache* cache, const PrefixSelection& selection,
                      const EvalItem& item) {
  const int n_prefix = cache->n_tokens;
  const int vocab = model.config().vocab_size;
  QueryScore q;
  ForwardOptions fo;
  fo.update_cache = true;
  const ForwardResult ctx = model.Forward(item.context, cache, selection, fo);
  const std::span<const float> last = ctx.LastLogits(vocab);
  q.first_token = ArgMax(last);
  // log-softmax of the last context row: log p(first choice token).
  const float mx = *std::max_element(last.begin(), last.end());
  double z = 0;
  for (float v : last) z += std::exp(static_cast<double>(v) - mx);
  const double log_z = mx + std::log(z);
  ForwardOptions co;
  co.update_cache = false;
  for (const std::vector<int32_t>& c : item.choices) {
    double ll = static_cast<double>(last[c[0]]) - log_z;
    if (c.size() > 1) {
      const std::span<const int32_t> all(c);
      const ForwardResult r = model.Forward(all.first(c.size() - 1), cache, selection, co);
      for (double lp : model.NextTokenLogProbs(r, all.subspan(1))) ll += lp;
    }
    q.loglik.push_back(ll);
  }
  cache->Truncate(n_prefix);
  q.predicted = static_cast<int>(std::max_element(q.loglik.begin(), q.loglik.end()) - q.loglik.begin());
  return q;
}

std::vector<EvalConfig> EvalGrid(const EvalOptions& o) {
  std::vector<EvalConfig> grid = {{Selector::kFull, 1.0, 0}};
  for (Selector s : o.selectors) {
    if (s == Selector::kFull) continue;
    for (double r : o.retentions) {
      if (s == Selector::kItf) {
        for (double a : o.alphas) grid.push_back({s, r, a});
      } else {
        grid.push_back({s, r, 0});
      }
    }
  }
  return grid;
}

namespace {

bool SameSelection(const PrefixSelection& a, const PrefixSelection& b) {
  if (a.n_prefix != b.n_prefix || a.layers.size() != b.layers.size()) return false;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerKeep& x = a.layers[l];
    const LayerKeep& y = b.layers[l];
    if (x.mode != y.mode || x.shared != y.shared || x.per_kv_head != y.per_kv_head) return false;
  }
  return true;
}

std::int64_t ItemTokens(const EvalItem& it) {
  std::int64_t n = static_cast<std::int64_t>(it.context.size());
  for (const auto& c : it.choices) n += static_cast<std::int64_t>(c.size()) - 1;
  return n;
}

}  // namespace

EvalSummary EvaluateGroups(const LlamaModel& model, const std::string& task,
                           const std::vector<EvalGroup>& groups, const EvalOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<EvalConfig> grid = EvalGrid(o);
  EvalSummary out;
  for (const EvalConfig& c : grid) {
    AccuracyRow r;
    r.task = task;
    r.config = c;
    out.rows.push_back(r);
  }
  int total = 0, done = 0;
  for (const auto& g : groups) total += static_cast<int>(g.items.size());
  const int threads = std::max(1, o.threads);
  for (const EvalGroup& g : groups) {
    if (g.items.empty()) continue;
    KvCache base = model.NewCache();
    model.Prefill(g.prefix, &base);
    out.forward_tokens += static_cast<std::int64_t>(g.prefix.size());
    const int n_prefix = base.n_tokens;
    // The importance of every item's question against the full prefix (cache unchanged).
    std::vector<AttentionImportance> imp(g.items.size());
    for (size_t i = 0; i < g.items.size(); ++i) {
      ForwardOptions fo;
      fo.importance = true;
      fo.update_cache = false;
      ForwardResult r = model.Forward(g.items[i].context, &base, {}, fo);
      imp[i] = std::move(r.importance);
      imp[i].per_q_head.clear();
      out.forward_tokens += static_cast<std::int64_t>(g.items[i].context.size());
    }
    std::vector<KvCache> caches(threads, base);
    for (size_t i = 0; i < g.items.size(); ++i) {
      const EvalItem& item = g.items[i];
      const AttentionImportance* other = &imp[(i + 1) % g.items.size()];
      // Distinct selections of this item; configurations map onto them.
      std::vector<PrefixSelection> unique;
      std::vector<int> config_to_unique(grid.size());
      std::vector<SelectionStats> stats(grid.size());
      for (size_t c = 0; c < grid.size(); ++c) {
        const std::uint64_t seed =
            Mix(o.seed ^ Mix(static_cast<std::uint64_t>(item.index) * 1315423911ull +
                             static_cast<std::uint64_t>(std::llround(grid[c].retention * 1e6))));
        PrefixSelection s = BuildSelection(grid[c], imp[i], other, n_prefix, o.probe_heads, seed,
                                           &stats[c]);
        int u = -1;
        for (size_t j = 0; j < unique.size() && u < 0; ++j) {
          if (SameSelection(unique[j], s)) u = static_cast<int>(j);
        }
        if (u < 0) {
          u = static_cast<int>(unique.size());
          unique.push_back(std::move(s));
        }
        config_to_unique[c] = u;
      }
      std::vector<QueryScore> scores(unique.size());
      std::atomic<size_t> next{0};
      auto worker = [&](int t) {
        if (threads > 1) omp_set_num_threads(1);  // no nested teams on a shared 2-core box
        for (size_t j; (j = next.fetch_add(1)) < unique.size();) {
          scores[j] = ScoreQuery(model, &caches[t], unique[j], item);
        }
      };
      if (threads == 1) {
        worker(0);
      } else {
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
        for (auto& th : pool) th.join();
      }
      out.forward_tokens += static_cast<std::int64_t>(unique.size()) * ItemTokens(item);
      const QueryScore& full = scores[config_to_unique[0]];  // grid[0] is full
      for (size_t c = 0; c < grid.size(); ++c) {
        const QueryScore& q = scores[config_to_unique[c]];
        AccuracyRow& r = out.rows[c];
        ++r.items;
        r.correct += q.predicted == item.label;
        r.first_token_agree += q.first_token == full.first_token;
        r.kept_fraction_sum += stats[c].kept_fraction;
        r.layers += grid[c].selector == Selector::kItf ? stats[c].layers : 0;
        r.fallback_layers += stats[c].fallback_layers;
      }
      if (o.progress) o.progress(++done, total);
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kvtier
