#include "traces/mooncake.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/errors.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// Minimal JSON reader for one line: an object whose values are numbers, arrays of numbers, or
// anything else (skipped). Errors carry the column.
class LineParser {
 public:
  LineParser(const std::string& s, std::string where) : s_(s), where_(std::move(where)) {}

  struct Fields {
    bool has_ts = false, has_in = false, has_out = false, has_ids = false;
    double timestamp = 0, input_length = 0, output_length = 0;
    std::vector<double> hash_ids;
  };

  Fields Parse() {
    Fields f;
    Ws();
    Expect('{');
    Ws();
    if (Peek() == '}') {
      ++i_;
    } else {
      while (true) {
        Ws();
        const std::string key = String();
        Ws();
        Expect(':');
        Ws();
        if (key == "timestamp") {
          f.timestamp = Number(key), f.has_ts = true;
        } else if (key == "input_length") {
          f.input_length = Number(key), f.has_in = true;
        } else if (key == "output_length") {
          f.output_length = Number(key), f.has_out = true;
        } else if (key == "hash_ids") {
          f.has_ids = true;
          Expect('[');
          Ws();
          if (Peek() == ']') {
            ++i_;
          } else {
            while (true) {
              Ws();
              f.hash_ids.push_back(Number(key));
              Ws();
              if (Peek() == ',') {
                ++i_;
                continue;
              }
              Expect(']');
              break;
            }
          }
        } else {
          SkipValue();
        }
        Ws();
        if (Peek() == ',') {
          ++i_;
          continue;
        }
        Expect('}');
        break;
      }
    }
    Ws();
    if (i_ != s_.size()) Fail("unexpected text after the object");
    return f;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    throw TraceError(where_ + ": bad JSON line: " + what + " (column " + std::to_string(i_ + 1) + ")");
  }
  char Peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  void Expect(char c) {
    if (Peek() != c) Fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') ++i_;
      if (i_ < s_.size()) out += s_[i_++];
    }
    Expect('"');
    return out;
  }
  double Number(const std::string& key) {
    const char* begin = s_.c_str() + i_;
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(begin, &end);
    if (end == begin || errno == ERANGE || !std::isfinite(v)) Fail("'" + key + "': expected a number");
    i_ += static_cast<std::size_t>(end - begin);
    return v;
  }
  // Skips one JSON value of any nesting depth without recursion (a line of 10^5 '[' used to
  // overflow the stack): `open` holds the closing bracket of every container entered.
  void SkipValue() {
    std::string open;
    while (true) {
      const char c = Peek();
      if (c == '{' || c == '[') {
        ++i_;
        Ws();
        if (Peek() == (c == '{' ? '}' : ']')) {
          ++i_;  // empty container: a complete value
        } else {
          open.push_back(c == '{' ? '}' : ']');
          if (c == '{') Member();
          continue;  // the first element
        }
      } else if (c == '"') {
        String();
      } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 4, "null") == 0) {
        i_ += 4;
      } else if (s_.compare(i_, 5, "false") == 0) {
        i_ += 5;
      } else {
        Number("value");
      }
      // A value is complete: close containers until one has a next element.
      while (true) {
        if (open.empty()) return;
        Ws();
        if (Peek() == ',') {
          ++i_;
          Ws();
          if (open.back() == '}') Member();
          break;
        }
        Expect(open.back());
        open.pop_back();
      }
    }
  }
  // `"key" :` of an object member, leaving the position at its value.
  void Member() {
    String();
    Ws();
    Expect(':');
    Ws();
  }

  const std::string& s_;
  std::string where_;
  std::size_t i_ = 0;
};

// The lines of a JSON-lines file, read once through one descriptor (a pipe such as
// `<(zcat trace.jsonl.gz)` works) with a bound on the line length, so an endless input without
// a newline (/dev/zero) is an error instead of an ever-growing line.
class LineReader {
 public:
  static constexpr std::size_t kMaxLine = std::size_t(1) << 20;  // real lines: ~2 KB

  explicit LineReader(const std::string& path) : path_(path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      throw TraceError(path + ": is a directory, not a JSON-lines file");
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw TraceError(path + ": cannot open: " + std::strerror(errno));
  }
  ~LineReader() { ::close(fd_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n'; false at the end of the file. Throws TraceError.
  bool Next(std::string* line, std::int64_t lineno) {
    line->clear();
    while (true) {
      if (pos_ == end_) {
        if (eof_) return !line->empty();
        const ssize_t n = ::read(fd_, buf_, sizeof buf_);
        if (n < 0) {
          if (errno == EINTR) continue;
          throw TraceError(path_ + ": read error: " + std::strerror(errno));
        }
        if (n == 0) {
          eof_ = true;
          continue;
        }
        pos_ = 0;
        end_ = std::size_t(n);
      }
      const char* start = buf_ + pos_;
      const char* nl = static_cast<const char*>(std::memchr(start, '\n', end_ - pos_));
      const std::size_t take = nl ? std::size_t(nl - start) : end_ - pos_;
      if (line->size() + take > kMaxLine) {
        throw TraceError(path_ + ":" + std::to_string(lineno) + ": line longer than " +
                         std::to_string(kMaxLine >> 20) + " MiB (is it a JSON-lines file?)");
      }
      line->append(start, take);
      pos_ += take + (nl ? 1 : 0);
      if (nl) return true;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  char buf_[1 << 16];
  std::size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
};

// A JSON number as the shortest text that reads back as it ("1e+300", "2.5", "-1"), not
// std::to_string's fixed notation, which printed 1e300 as 301 digits.
std::string NumberText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  for (int digits = 1; digits < 17; ++digits) {
    char shorter[32];
    std::snprintf(shorter, sizeof shorter, "%.*g", digits, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

std::int64_t NonNegativeInt(double v, const std::string& where, const char* key) {
  if (v < 0) throw TraceError(where + ": " + key + " is negative (" + NumberText(v) + ")");
  if (v != std::floor(v)) {
    throw TraceError(where + ": " + key + " is not an integer (" + NumberText(v) + ")");
  }
  if (v > 9e15) {
    throw TraceError(where + ": " + key + " is too large (" + NumberText(v) + " > 9e15)");
  }
  return static_cast<std::int64_t>(v);
}

}  // namespace

MooncakeImportSummary ImportMooncake(const std::string& jsonl_path, const std::string& out_path,
                                     const MooncakeImportOptions& opt) {
  if (opt.block_tokens < 1 || opt.chunk_tokens < 1) {
    throw InputError("import-mooncake: --block-tokens (" + std::to_string(opt.block_tokens) +
                     ") and --chunk-tokens (" + std::to_string(opt.chunk_tokens) +
                     ") must be >= 1");
  }
  if (opt.block_tokens % opt.chunk_tokens != 0) {
    throw InputError("import-mooncake: chunk tokens (" + std::to_string(opt.chunk_tokens) +
                     ") must divide block tokens (" + std::to_string(opt.block_tokens) + ")");
  }
  {
    // The output replaces its file only at the end, by rename: named as the input, it would
    // replace the input with its own conversion.
    std::error_code ec;
    const fs::path in_abs = fs::absolute(jsonl_path, ec).lexically_normal();
    const fs::path out_abs = fs::absolute(out_path, ec).lexically_normal();
    if (in_abs == out_abs || fs::equivalent(jsonl_path, out_path, ec)) {
      throw InputError("import-mooncake: --out " + out_path + " is the input file " + jsonl_path +
                       "; name another output");
    }
  }
  LineReader in(jsonl_path);
  TraceHeader header;
  header.producer = "kvtier trace import-mooncake";
  header.model = opt.model;
  header.chunk_tokens = opt.chunk_tokens;
  std::string base = jsonl_path;
  if (auto p = base.find_last_of('/'); p != std::string::npos) base = base.substr(p + 1);
  header.metadata = {{"source", "mooncake-fast25:" + base},
                     {"block_tokens", std::to_string(opt.block_tokens)},
                     {"arrival", "trace"}};
  // TraceWriter writes <out>.partial and renames it at Close: a failed import (an exception
  // unwinding past the writer) leaves no half trace behind.
  MooncakeImportSummary sum;
  TraceWriter writer(out_path, header);
  const int split = opt.block_tokens / opt.chunk_tokens;
  std::string line;
  std::int64_t lineno = 0, prev_ts = -1, prev_line = 0;
  TraceRecord rec;
  while (in.Next(&line, lineno + 1)) {
    ++lineno;
    const std::string where = jsonl_path + ":" + std::to_string(lineno);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto f = LineParser(line, where).Parse();
    if (!f.has_ts || !f.has_in || !f.has_out || !f.has_ids) {
      throw TraceError(where + ": missing field (need timestamp, input_length, output_length, "
                       "hash_ids)");
    }
    const std::int64_t ts = NonNegativeInt(f.timestamp, where, "timestamp");
    if (ts < prev_ts) {
      throw TraceError(where + ": timestamp " + std::to_string(ts) + " is earlier than line " +
                       std::to_string(prev_line) + "'s " + std::to_string(prev_ts) +
                       " (requests must be in arrival order; sort the file by timestamp)");
    }
    prev_ts = ts;
    prev_line = lineno;
    const std::int64_t input = NonNegativeInt(f.input_length, where, "input_length");
    const std::int64_t output = NonNegativeInt(f.output_length, where, "output_length");
    if (input < 1) throw TraceError(where + ": input_length must be >= 1");
    // A trace's lengths are at most 2^40 tokens (traces/FORMAT.md, "Validation"); found by
    // fuzz_mooncake, which had the importer write a trace its own reader refused.
    if (input > (std::int64_t(1) << 40) || output > (std::int64_t(1) << 40)) {
      throw TraceError(where + ": input_length or output_length above 2^40 tokens");
    }
    const std::int64_t max_blocks = (input + opt.block_tokens - 1) / opt.block_tokens;
    if (std::int64_t(f.hash_ids.size()) > max_blocks) {
      throw TraceError(where + ": " + std::to_string(f.hash_ids.size()) +
                       " hash_ids for input_length " + std::to_string(input) + " (at most " +
                       std::to_string(max_blocks) + " blocks of " +
                       std::to_string(opt.block_tokens) + ")");
    }
    rec.Clear();
    Request& q = rec.request;
    q.id = RequestId(lineno - 1);
    q.arrival_s = double(ts) / 1000.0;
    q.tokens_per_symbol = opt.chunk_tokens;
    rec.prefix_kind = PrefixKind::kBlocks;
    const std::int64_t full = std::min<std::int64_t>((input - 1) / opt.block_tokens,
                                                     std::int64_t(f.hash_ids.size()));
    for (std::int64_t b = 0; b < full; ++b) {
      const std::int64_t id = NonNegativeInt(f.hash_ids[b], where, "hash_ids");
      for (int j = 0; j < split; ++j) q.prefix.push_back(std::uint64_t(id) * split + j);
    }
    q.query_tokens = input - full * opt.block_tokens;
    q.output_tokens = output;
    writer.Write(rec);
  }
  if (writer.records_written() == 0) {
    throw TraceError(jsonl_path + ": no requests (the file has no JSON lines); an empty trace "
                     "would replay nothing");
  }
  writer.Close();
  sum.records = writer.records_written();
  sum.bytes = writer.bytes_written();
  return sum;
}

}  // namespace kvtier
