#include "models/tokenizer.h"

#include <algorithm>
#include <functional>

#include "core/errors.h"
#include "models/gguf.h"

namespace kvtier {
namespace {

constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;

// --- UTF-8 -------------------------------------------------------------------------------------

struct CodeUnit {
  char32_t cp;     // 0xFFFD for an undecodable byte
  uint32_t begin;  // byte offset
  uint32_t len;    // bytes
};

std::vector<CodeUnit> DecodeUtf8(std::string_view s) {
  std::vector<CodeUnit> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    uint32_t len = 0;
    char32_t cp = 0;
    if (b0 < 0x80) {
      len = 1;
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2) {
      len = 2;
      cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3;
      cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
      len = 4;
      cp = b0 & 0x07;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (uint32_t k = 1; ok && k < len; ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if ((b & 0xC0) != 0x80) ok = false;
      cp = cp << 6 | (b & 0x3F);
    }
    // Reject overlong 3/4-byte forms, surrogates and > U+10FFFF.
    if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
               (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))) {
      ok = false;
    }
    if (!ok) {
      out.push_back({0xFFFD, static_cast<uint32_t>(i), 1});
      ++i;
    } else {
      out.push_back({cp, static_cast<uint32_t>(i), len});
      i += len;
    }
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | cp >> 6));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | cp >> 12));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | cp >> 18));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// --- Unicode categories (approximate; see tokenizer.h) -----------------------------------------

enum class Cat { kLetter, kNumber, kSpace, kOther };

bool InRange(char32_t c, char32_t lo, char32_t hi) { return c >= lo && c <= hi; }

Cat Category(char32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Cat::kLetter;
    if (c >= '0' && c <= '9') return Cat::kNumber;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return Cat::kSpace;
    return Cat::kOther;
  }
  if (c == 0xFFFD) return Cat::kOther;
  // White space (Unicode White_Space property).
  if (c == 0x85 || c == 0xA0 || c == 0x1680 || InRange(c, 0x2000, 0x200A) || c == 0x2028 ||
      c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000) {
    return Cat::kSpace;
  }
  // Numbers: Latin-1 superscripts/fractions, common decimal digit blocks, number forms,
  // enclosed alphanumerics, fullwidth digits.
  if (c == 0xB2 || c == 0xB3 || c == 0xB9 || InRange(c, 0xBC, 0xBE) ||
      InRange(c, 0x660, 0x669) || InRange(c, 0x6F0, 0x6F9) || InRange(c, 0x966, 0x96F) ||
      InRange(c, 0x9E6, 0x9EF) || InRange(c, 0xE50, 0xE59) || InRange(c, 0x2070, 0x2079) ||
      InRange(c, 0x2080, 0x2089) || InRange(c, 0x2150, 0x2189) || InRange(c, 0x2460, 0x249B) ||
      InRange(c, 0x24EA, 0x24FF) || InRange(c, 0x2776, 0x2793) || c == 0x3007 ||
      InRange(c, 0x3021, 0x3029) || InRange(c, 0xFF10, 0xFF19)) {
    return Cat::kNumber;
  }
  // Letters inside otherwise-symbolic Latin-1 range.
  if (c == 0xAA || c == 0xB5 || c == 0xBA) return Cat::kLetter;
  // Punctuation, symbols, controls and combining marks (marks are not \p{L}).
  if (InRange(c, 0x80, 0xBF) || c == 0xD7 || c == 0xF7 || InRange(c, 0x2B9, 0x2FF) ||
      InRange(c, 0x300, 0x36F) || c == 0x37E || c == 0x387 || InRange(c, 0x55A, 0x55F) ||
      InRange(c, 0x589, 0x58A) || InRange(c, 0x5BE, 0x5C7) || InRange(c, 0x600, 0x60F) ||
      c == 0x61B || InRange(c, 0x61D, 0x61F) || InRange(c, 0x64B, 0x65F) || c == 0x66A ||
      c == 0x6D4 || InRange(c, 0x964, 0x965) || InRange(c, 0x2010, 0x2027) ||
      InRange(c, 0x2030, 0x205E) || InRange(c, 0x2060, 0x206F) || InRange(c, 0x20A0, 0x20FF) ||
      InRange(c, 0x2100, 0x214F) || InRange(c, 0x2190, 0x245F) || InRange(c, 0x2500, 0x2775) ||
      InRange(c, 0x2794, 0x2BFF) || InRange(c, 0x2E00, 0x2E7F) || InRange(c, 0x3001, 0x3004) ||
      InRange(c, 0x3008, 0x3020) || c == 0x3030 || InRange(c, 0xFE00, 0xFE0F) ||
      InRange(c, 0xFE10, 0xFE6F) || c == 0xFEFF || InRange(c, 0xFF01, 0xFF0F) ||
      InRange(c, 0xFF1A, 0xFF20) || InRange(c, 0xFF3B, 0xFF40) || InRange(c, 0xFF5B, 0xFF65) ||
      InRange(c, 0xFFE0, 0xFFEE) || InRange(c, 0x1F000, 0x1FAFF) || InRange(c, 0xE0000, 0xE007F)) {
    return Cat::kOther;
  }
  return Cat::kLetter;
}

// --- GPT-2 byte <-> unicode map ----------------------------------------------------------------

struct ByteMap {
  char32_t byte_to_cp[256];
  std::unordered_map<char32_t, uint8_t> cp_to_byte;
  ByteMap() {
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
    bool direct[256] = {};
    for (int b : bs) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      byte_to_cp[b] = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& Bytes() {
  static const ByteMap kMap;
  return kMap;
}

// Splits `units` [begin, end) the way llama.cpp's unicode_regex_split_custom_gpt2 does.
void SplitGpt2(const std::vector<CodeUnit>& u, size_t begin, size_t end,
               std::vector<std::pair<size_t, size_t>>* pieces) {
  constexpr char32_t kNone = 0xFFFFFFFF;
  auto cp = [&](size_t p) { return p < end ? u[p].cp : kNone; };
  auto cat = [&](size_t p) { return p < end ? Category(u[p].cp) : Cat::kSpace; };
  auto valid = [&](size_t p) { return p < end; };
  size_t pos = begin;
  while (pos < end) {
    const size_t start = pos;
    const char32_t c = cp(pos);
    if (c == '\'' && pos + 1 < end) {
      const char32_t n1 = cp(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        pieces->push_back({start, pos + 2});
        pos += 2;
        continue;
      }
      if (pos + 2 < end) {
        const char32_t n2 = cp(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          pieces->push_back({start, pos + 3});
          pos += 3;
          continue;
        }
      }
    }
    const bool has2 = c != ' ' || valid(pos + 1);
    const Cat c2 = c == ' ' ? cat(pos + 1) : cat(pos);
    if (has2 && c2 == Cat::kLetter) {
      pos += (c == ' ');
      while (valid(pos) && cat(pos) == Cat::kLetter) ++pos;
      pieces->push_back({start, pos});
      continue;
    }
    if (has2 && c2 == Cat::kNumber) {
      pos += (c == ' ');
      while (valid(pos) && cat(pos) == Cat::kNumber) ++pos;
      pieces->push_back({start, pos});
      continue;
    }
    if (has2 && c2 == Cat::kOther && (c != ' ' || valid(pos + 1))) {
      pos += (c == ' ');
      while (valid(pos) && cat(pos) == Cat::kOther) ++pos;
      pieces->push_back({start, pos});
      continue;
    }
    size_t ws = 0;
    while (valid(pos + ws) && cat(pos + ws) == Cat::kSpace) ++ws;
    if (ws > 1 && valid(pos + ws)) {  // \s+(?!\S): leave the last space for the next word
      pos += ws - 1;
      pieces->push_back({start, pos});
      continue;
    }
    if (ws > 0) {
      pos += ws;
      pieces->push_back({start, pos});
      continue;
    }
    ++pos;  // unreachable with total categories, kept as in llama.cpp
    pieces->push_back({start, pos});
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::FromGguf(const GgufFile& file) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const std::string model = file.GetString("tokenizer.ggml.model");
  if (model != "gpt2") {
    throw ModelFileError(file.path() + ": metadata key tokenizer.ggml.model: '" + model +
                         "' is not supported (kvtier reads byte-level BPE, 'gpt2')");
  }
  t->pre_ = file.GetString("tokenizer.ggml.pre", "default");
  // llama.cpp presets whose first regex splits every \p{N} on its own.
  t->split_digits_ = t->pre_ == "smollm" || t->pre_ == "starcoder" || t->pre_ == "refact" ||
                     t->pre_ == "command-r" || t->pre_ == "codeshell" || t->pre_ == "exaone";
  t->tokens_ = file.GetStringArray("tokenizer.ggml.tokens");
  const int32_t n = static_cast<int32_t>(t->tokens_.size());
  if (file.Has("tokenizer.ggml.token_type")) {
    for (int64_t v : file.GetIntArray("tokenizer.ggml.token_type")) {
      t->types_.push_back(static_cast<int32_t>(v));
    }
    if (static_cast<int32_t>(t->types_.size()) != n) {
      throw ModelFileError(file.path() + ": metadata key tokenizer.ggml.token_type: " +
                           std::to_string(t->types_.size()) + " entries for " +
                           std::to_string(n) + " tokens");
    }
  } else {
    t->types_.assign(n, 1);
  }
  t->token_ids_.reserve(n);
  for (int32_t i = 0; i < n; ++i) t->token_ids_.emplace(t->tokens_[i], i);

  // Byte-level vocabularies normally hold all 256 byte symbols, but some (SmolLM2's lacks 21:
  // bytes 4, 6, 19, 20, 22, 29, 192, 193, 241-255) do not. Such bytes get -1 and are dropped by
  // Encode, as llama.cpp drops them. Fewer than 128 byte symbols means this is not byte-level BPE.
  const ByteMap& bm = Bytes();
  int present = 0;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(bm.byte_to_cp[b], &s);
    t->byte_token_[b] = t->Find(s);
    present += t->byte_token_[b] >= 0;
  }
  if (present < 128) {
    throw ModelFileError(file.path() + ": metadata key tokenizer.ggml.tokens: only " +
                         std::to_string(present) +
                         " of 256 byte symbols present; not a byte-level BPE vocabulary");
  }

  const std::vector<std::string> merges =
      file.Has("tokenizer.ggml.merges") ? file.GetStringArray("tokenizer.ggml.merges")
                                        : std::vector<std::string>{};
  t->merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);
    const auto bad = [&](const std::string& why) {
      return ModelFileError(file.path() + ": metadata key tokenizer.ggml.merges: merge #" +
                            std::to_string(r) + " '" + m + "': " + why);
    };
    if (sp == std::string::npos) throw bad("no space separator");
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    const int32_t l = t->Find(left), rt = t->Find(right), merged = t->Find(left + right);
    if (l < 0 || rt < 0 || merged < 0) throw bad("refers to a token not in the vocabulary");
    const uint64_t key = static_cast<uint64_t>(l) << 32 | static_cast<uint32_t>(rt);
    t->merges_.emplace(key, std::make_pair(static_cast<int32_t>(r), merged));  // first rank wins
  }

  for (int32_t i = 0; i < n; ++i) {
    if ((t->types_[i] == kTypeControl || t->types_[i] == kTypeUserDefined) &&
        !t->tokens_[i].empty()) {
      t->specials_.push_back(i);
      t->special_start_[static_cast<uint8_t>(t->tokens_[i][0])] = true;
    }
  }
  std::stable_sort(t->specials_.begin(), t->specials_.end(), [&](int32_t a, int32_t b) {
    return t->tokens_[a].size() > t->tokens_[b].size();
  });
  t->bos_id_ = static_cast<int32_t>(file.GetInt("tokenizer.ggml.bos_token_id", -1));
  t->eos_id_ = static_cast<int32_t>(file.GetInt("tokenizer.ggml.eos_token_id", -1));
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    const int64_t id = file.GetInt(key, -1);
    if (id >= n) {
      throw ModelFileError(file.path() + ": metadata key " + key + ": id " + std::to_string(id) +
                           " >= vocabulary size " + std::to_string(n));
    }
  }
  return t;
}

int32_t Tokenizer::Find(const std::string& token_text) const {
  auto it = token_ids_.find(token_text);
  return it == token_ids_.end() ? -1 : it->second;
}

std::vector<std::string> Tokenizer::PreTokenize(std::string_view text) const {
  const std::vector<CodeUnit> u = DecodeUtf8(text);
  std::vector<std::pair<size_t, size_t>> pieces;
  size_t seg = 0;
  for (size_t i = 0; i <= u.size(); ++i) {
    const bool boundary = i == u.size() || (split_digits_ && Category(u[i].cp) == Cat::kNumber);
    if (!boundary) continue;
    if (seg < i) SplitGpt2(u, seg, i, &pieces);
    if (i < u.size()) pieces.push_back({i, i + 1});
    seg = i + 1;
  }
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (const auto& [b, e] : pieces) {
    const uint32_t from = u[b].begin;
    const uint32_t to = u[e - 1].begin + u[e - 1].len;
    out.emplace_back(text.substr(from, to - from));
  }
  return out;
}

void Tokenizer::Bpe(std::string_view piece, std::vector<int32_t>* out) const {
  // Greedy: merge the adjacent pair of lowest rank (the leftmost of equal ranks) until none is
  // mergeable. The symbols form a linked list over the piece's byte positions and the candidate
  // pairs a heap ordered by (rank, left position), so a piece of n bytes costs O(n log n). The
  // rescan of every pair after each merge this replaces was quadratic in the piece's length: a
  // 16 KiB word without spaces took minutes (found by fuzz_tokenizer, whose -max_len hid it).
  const int32_t n = static_cast<int32_t>(piece.size());
  if (n == 0) return;
  // A byte without a token stays as a -1 symbol: it blocks merges across it (as in llama.cpp,
  // which merges on the byte-mapped text) and is dropped at the end.
  std::vector<int32_t> sym(n), prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = byte_token_[static_cast<uint8_t>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // A candidate is still current if `left` is alive, still followed by `right`, and neither
  // symbol changed since it was pushed (a merge only ever makes a symbol longer, so a symbol id
  // never comes back).
  struct Candidate {
    int32_t rank, left, right, left_sym, right_sym, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::vector<Candidate> heap;
  const auto push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = next[left];
    if (right < 0 || sym[left] < 0 || sym[right] < 0) return;
    const uint64_t key = static_cast<uint64_t>(sym[left]) << 32 | static_cast<uint32_t>(sym[right]);
    const auto it = merges_.find(key);
    if (it == merges_.end()) return;
    heap.push_back({it->second.first, left, right, sym[left], sym[right], it->second.second});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> gone(n, false);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate c = heap.back();
    heap.pop_back();
    if (gone[c.left] || next[c.left] != c.right || sym[c.left] != c.left_sym ||
        sym[c.right] != c.right_sym) {
      continue;  // stale: one of its symbols was merged away or into something else
    }
    sym[c.left] = c.merged;
    gone[c.right] = true;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) {
    if (sym[i] >= 0) out->push_back(sym[i]);
  }
}

void Tokenizer::EncodePlain(std::string_view text, std::vector<int32_t>* out) const {
  for (const std::string& piece : PreTokenize(text)) Bpe(piece, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  size_t plain_begin = 0;
  size_t i = 0;
  while (parse_special && i < text.size()) {
    int32_t hit = -1;
    if (special_start_[static_cast<uint8_t>(text[i])]) {
      for (int32_t id : specials_) {
        const std::string& s = tokens_[id];
        if (text.compare(i, s.size(), s) == 0) {
          hit = id;
          break;
        }
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    EncodePlain(text.substr(plain_begin, i - plain_begin), &out);
    out.push_back(hit);
    i += tokens_[hit].size();
    plain_begin = i;
  }
  EncodePlain(text.substr(plain_begin), &out);
  return out;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  const std::string& text = tokens_[id];
  if (types_[id] == kTypeControl || types_[id] == kTypeUserDefined) return text;
  std::string out;
  const ByteMap& bm = Bytes();
  for (const CodeUnit& cu : DecodeUtf8(text)) {
    auto it = bm.cp_to_byte.find(cu.cp);
    if (it != bm.cp_to_byte.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(text, cu.begin, cu.len);  // not a byte-mapped char: keep as is
    }
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += TokenBytes(id);
  return out;
}

}  // namespace kvtier
