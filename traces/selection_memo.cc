#include "traces/selection_memo.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/check.h"
#include "traces/wire.h"

namespace kvtier {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'T', 'S', 'E', 'L', '0', '2'};
// ordinal, id, layer, n, k, crc, similarity, bits set, counts
constexpr std::size_t kEntryHeader = 48;
constexpr std::uint32_t kMaxTokens = 1u << 26;
constexpr std::uint32_t kMaxKey = 1u << 16;

std::size_t Words(std::uint32_t n) { return (std::size_t(n) + 63) / 64; }

std::uint64_t Fnv1a64(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Size, modification time and path of the running executable: a rebuilt kvtier (or a
// different tool) gets a different key, so it never trusts decisions another build made.
std::string ExecutableStamp() {
  struct stat st;
  if (::stat("/proc/self/exe", &st) != 0) return "unknown";
  std::error_code ec;
  const std::string path = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  return std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + ":" + path;
}

void Warn(const std::string& path, const std::string& what) {
  std::fprintf(stderr, "kvtier: selection memo %s: %s\n", path.c_str(), what.c_str());
}

// New memos left by processes that no longer exist (killed runs): "<memo>.tmp.<pid>".
void RemoveOrphans(const std::filesystem::path& dir, const std::string& memo_name) {
  std::error_code ec;
  const std::string prefix = memo_name + ".tmp.";
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    char* rest = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &rest, 10);
    if (pid <= 0 || rest == nullptr || *rest != '\0') continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code rm;
      std::filesystem::remove(it->path(), rm);
    }
  }
}

// Keeps the directory's memos under `limit` bytes by deleting the least recently used ones
// (modification time: a reused memo is touched) other than `keep`. Each rebuilt kvtier and
// each trace or retention makes its own memo, so without this the directory only grows.
void TrimDirectory(const std::filesystem::path& dir, const std::filesystem::path& keep,
                   std::uintmax_t limit) {
  struct Memo {
    std::filesystem::file_time_type when;
    std::uintmax_t bytes;
    std::filesystem::path path;
  };
  std::vector<Memo> memos;
  std::uintmax_t total = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".kvsel") continue;
    std::error_code e1, e2;
    const auto bytes = std::filesystem::file_size(it->path(), e1);
    const auto when = std::filesystem::last_write_time(it->path(), e2);
    if (e1 || e2) continue;
    total += bytes;
    if (it->path() != keep) memos.push_back({when, bytes, it->path()});
  }
  std::sort(memos.begin(), memos.end(),
            [](const Memo& a, const Memo& b) { return a.when < b.when; });
  for (const Memo& m : memos) {
    if (total <= limit) break;
    std::error_code rm;
    if (std::filesystem::remove(m.path, rm)) total -= m.bytes;
  }
}

}  // namespace

MemoLayer MemoLayer::FromVoted(std::int64_t n, std::int64_t k, double similarity,
                               const TokenSet& voted) {
  KVTIER_CHECK(n >= 1 && n <= kMaxTokens && k >= 0 && k <= n, "MemoLayer: bad n or k");
  MemoLayer m;
  m.n = static_cast<std::uint32_t>(n);
  m.k = static_cast<std::uint32_t>(k);
  m.similarity = similarity;
  m.voted_bits.assign(Words(m.n), 0);
  for (std::int32_t t : voted) m.voted_bits[std::size_t(t) >> 6] |= std::uint64_t{1} << (t & 63);
  return m;
}

MemoLayer MemoLayer::FromCounted(std::int64_t n, std::int64_t k, const Selection& sel) {
  KVTIER_CHECK(sel.kind == Selection::Kind::kCounted && sel.heads >= 1 && sel.heads <= 255,
               "MemoLayer: an H2O entry needs a counted selection of at most 255 heads");
  MemoLayer m = FromVoted(n, k, 0, {});
  m.k = static_cast<std::uint32_t>(k);
  for (std::int32_t t : sel.shared) m.voted_bits[std::size_t(t) >> 6] |= std::uint64_t{1} << (t & 63);
  m.counts.assign(sel.counts.begin(), sel.counts.end());
  return m;
}

Selection MemoLayer::Counted(int heads) const {
  KVTIER_CHECK(!counts.empty(), "MemoLayer: not an H2O entry");
  Selection s;
  s.kind = Selection::Kind::kCounted;
  s.heads = heads;
  s.shared.reserve(counts.size());
  for (std::size_t w = 0; w < voted_bits.size(); ++w) {
    for (std::uint64_t bits = voted_bits[w]; bits != 0; bits &= bits - 1) {
      s.shared.push_back(static_cast<std::int32_t>(w * 64 + std::countr_zero(bits)));
    }
  }
  KVTIER_CHECK(s.shared.size() == counts.size(), "MemoLayer: counts do not match the set");
  s.counts.assign(counts.begin(), counts.end());
  return s;
}

TokenSet MemoLayer::Voted() const {
  TokenSet out(k);
  std::size_t i = 0;
  for (std::size_t w = 0; w < voted_bits.size(); ++w) {
    for (std::uint64_t bits = voted_bits[w]; bits != 0 && i < k; bits &= bits - 1) {
      out[i++] = static_cast<std::int32_t>(w * 64 + std::countr_zero(bits));
    }
  }
  KVTIER_CHECK(i == k, "MemoLayer: fewer voted bits than k");
  return out;
}

std::string SelectionMemo::DefaultDir() {
  if (const char* v = std::getenv("KVTIER_SELECTION_MEMO"); v != nullptr && *v != '\0') {
    const std::string s = v;
    return s == "off" || s == "0" ? std::string() : s;
  }
  if (const char* c = std::getenv("KVTIER_CACHE"); c != nullptr && *c != '\0') {
    return std::string(c) + "/selections";
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return "";
  return std::string(home) + "/.cache/kvtier/selections";
}

std::uintmax_t SelectionMemo::MaxFileBytes() {
  if (const char* v = std::getenv("KVTIER_SELECTION_MEMO_MAX_FILE_MB"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0') return std::uintmax_t(mb) << 20;
  }
  return std::uintmax_t{2048} << 20;
}

std::string SelectionMemo::MakeH2oKey(const std::string& trace_sha256, const ModelSpec& target,
                                      const std::string& importance, double retention) {
  KVTIER_CHECK(target.kv_heads >= 1 && target.kv_heads <= 255,
               "an H2O selection memo counts at most 255 heads");
  return MakeKey(trace_sha256, target, importance, retention, 0) + "h2o: every head's top-k\n";
}

std::string SelectionMemo::MakeKey(const std::string& trace_sha256, const ModelSpec& target,
                                   const std::string& importance, double retention,
                                   int probe_heads) {
  char ret[40];
  std::snprintf(ret, sizeof ret, "%.17g", retention);
  return "kvtier selection memo 1\ntrace_sha256=" + trace_sha256 + "\nmodel=" + target.name +
         " layers=" + std::to_string(target.layers) +
         " kv_heads=" + std::to_string(target.kv_heads) + "\nimportance=" + importance +
         "\nretention=" + ret + "\nprobe_heads=" + std::to_string(probe_heads) +
         "\nexecutable=" + ExecutableStamp() + "\n";
}

std::unique_ptr<SelectionMemo> SelectionMemo::Open(const std::string& dir, const std::string& key,
                                                   int layers, std::uintmax_t max_file_bytes) {
  KVTIER_CHECK(layers >= 1, "SelectionMemo needs layers >= 1");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir, ec)) {
    Warn(dir, "cannot create the directory (" + ec.message() +
                  "); ITF decisions are computed and not remembered");
    return nullptr;
  }
  const std::string name = Hex64(Fnv1a64(key)) + ".kvsel";
  RemoveOrphans(dir, name);
  std::unique_ptr<SelectionMemo> memo(new SelectionMemo(dir + "/" + name, key, layers));
  memo->max_file_bytes_ = max_file_bytes;
  memo->OpenReader();
  // The new memo, started only once this run has something the old one lacks (StartWriting):
  // a run that reuses every decision writes nothing.
  memo->tmp_path_ = memo->path_ + ".tmp." + std::to_string(::getpid());
  return memo;
}

// Opens the new memo. Everything before the oldest record still in flight was reused
// unchanged (a computed decision starts the writer before its record ends), so the old memo's
// bytes up to that record's first entry are its prefix: copied, header included, as read and
// checked. Without an old memo it starts with a new header.
void SelectionMemo::StartWriting() {
  if (out_ != nullptr || writer_failed_) return;
  out_ = std::fopen(tmp_path_.c_str(), "wb");
  if (out_ == nullptr) {
    WriterFailed(std::string("cannot create ") + tmp_path_ + ": " + std::strerror(errno));
    return;
  }
  std::setvbuf(out_, nullptr, _IOFBF, 1 << 20);
  if (had_memo_) {
    const std::uint64_t end = records_.empty() ? valid_end_ : records_.begin()->second.old_offset;
    std::FILE* old = std::fopen(path_.c_str(), "rb");
    std::vector<char> chunk(1 << 20);
    std::uint64_t left = end;
    while (old != nullptr && left > 0) {
      const std::size_t want = std::size_t(std::min<std::uint64_t>(left, chunk.size()));
      if (std::fread(chunk.data(), 1, want, old) != want ||
          std::fwrite(chunk.data(), 1, want, out_) != want) {
        break;
      }
      left -= want;
    }
    if (old != nullptr) std::fclose(old);
    stats_.bytes_written += end - left;
    if (left > 0) WriterFailed("cannot copy the old memo into " + tmp_path_);
    return;
  }
  const auto len = static_cast<std::uint32_t>(key_.size());
  const std::uint32_t crc =
      wire::Crc32({reinterpret_cast<const std::uint8_t*>(key_.data()), key_.size()});
  if (std::fwrite(kMagic, 1, sizeof kMagic, out_) != sizeof kMagic ||
      std::fwrite(&len, 4, 1, out_) != 1 ||
      std::fwrite(key_.data(), 1, key_.size(), out_) != key_.size() ||
      std::fwrite(&crc, 4, 1, out_) != 1) {
    WriterFailed("cannot write " + tmp_path_);
    return;
  }
  stats_.bytes_written += sizeof kMagic + 8 + key_.size();
}

SelectionMemo::SelectionMemo(std::string path, std::string key, int layers)
    : path_(std::move(path)), key_(std::move(key)), layers_(layers) {}

SelectionMemo::~SelectionMemo() {
  if (in_ != nullptr) std::fclose(in_);
  if (out_ != nullptr) {
    std::fclose(out_);
    std::remove(tmp_path_.c_str());
  }
}

void SelectionMemo::OpenReader() {
  in_ = std::fopen(path_.c_str(), "rb");
  if (in_ == nullptr) return;  // no memo yet
  std::setvbuf(in_, nullptr, _IOFBF, 1 << 20);
  char magic[sizeof kMagic];
  std::uint32_t len = 0;
  if (std::fread(magic, 1, sizeof magic, in_) != sizeof magic ||
      std::memcmp(magic, kMagic, sizeof magic) != 0 || std::fread(&len, 4, 1, in_) != 1 ||
      len > kMaxKey) {
    ReaderFailed("not a selection memo of this version");
    return;
  }
  std::string key(len, '\0');
  std::uint32_t crc = 0;
  if (std::fread(key.data(), 1, len, in_) != len || std::fread(&crc, 4, 1, in_) != 1 ||
      crc != wire::Crc32({reinterpret_cast<const std::uint8_t*>(key.data()), key.size()})) {
    ReaderFailed("corrupt header");
    return;
  }
  if (key != key_) {  // a 64-bit name collision: another replay's memo, silently replaced
    std::fclose(in_);
    in_ = nullptr;
    return;
  }
  had_memo_ = true;
  ReadEntry();
}

bool SelectionMemo::ReadEntry() {
  has_next_ = false;
  if (in_ == nullptr) return false;
  // Where the unconsumed part begins: this entry if it is good, else where the good part ends.
  valid_end_ = std::uint64_t(std::ftell(in_));
  buf_.resize(kEntryHeader);
  const std::size_t got = std::fread(buf_.data(), 1, kEntryHeader, in_);
  if (got == 0 && std::feof(in_)) {  // the end
    std::fclose(in_);
    in_ = nullptr;
    return false;
  }
  const std::string where = "entry " + std::to_string(entries_read_ + 1);
  if (got != kEntryHeader) {
    ReaderFailed(where + " is truncated");
    return false;
  }
  std::uint64_t ordinal, id;
  std::uint32_t layer, n, k, crc, set_bits, ncounts;
  double similarity;
  std::memcpy(&ordinal, &buf_[0], 8);
  std::memcpy(&id, &buf_[8], 8);
  std::memcpy(&layer, &buf_[16], 4);
  std::memcpy(&n, &buf_[20], 4);
  std::memcpy(&k, &buf_[24], 4);
  std::memcpy(&crc, &buf_[28], 4);
  std::memcpy(&similarity, &buf_[32], 8);
  std::memcpy(&set_bits, &buf_[40], 4);
  std::memcpy(&ncounts, &buf_[44], 4);
  // ITF: k set tokens, no counts; H2O: the union (>= k tokens), a count each.
  if (layer >= std::uint32_t(layers_) || n == 0 || n > kMaxTokens || k > n || set_bits > n ||
      (ncounts == 0 ? set_bits != k : (ncounts != set_bits || set_bits < k))) {
    ReaderFailed(where + " has an impossible layer, n, k or counts");
    return false;
  }
  if (entries_read_ > 0 && (ordinal < next_ordinal_ ||
                            (ordinal == next_ordinal_ && int(layer) <= next_layer_))) {
    ReaderFailed(where + " is out of order");
    return false;
  }
  const std::size_t words = Words(n);
  buf_.resize(kEntryHeader + words * 8 + ncounts);
  if (std::fread(buf_.data() + kEntryHeader, 1, words * 8 + ncounts, in_) !=
      words * 8 + ncounts) {
    ReaderFailed(where + " is truncated");
    return false;
  }
  std::memset(&buf_[28], 0, 4);
  if (wire::Crc32(buf_) != crc) {
    ReaderFailed(where + " fails its CRC");
    return false;
  }
  next_.n = n;
  next_.k = k;
  next_.similarity = similarity;
  next_.voted_bits.resize(words);
  std::memcpy(next_.voted_bits.data(), buf_.data() + kEntryHeader, words * 8);
  next_.counts.assign(buf_.begin() + std::ptrdiff_t(kEntryHeader + words * 8), buf_.end());
  std::uint64_t bits = 0;
  for (std::uint64_t w : next_.voted_bits) bits += std::uint64_t(std::popcount(w));
  if (bits != set_bits || (n % 64 != 0 && (next_.voted_bits.back() >> (n % 64)) != 0) ||
      std::find(next_.counts.begin(), next_.counts.end(), 0) != next_.counts.end()) {
    ReaderFailed(where + " does not hold its tokens below n, each counted");
    return false;
  }
  next_ordinal_ = ordinal;
  next_id_ = id;
  next_layer_ = int(layer);
  ++entries_read_;
  has_next_ = true;
  return true;
}

void SelectionMemo::ReaderFailed(const std::string& why) {
  Warn(path_, why + "; the rest is computed and the memo rewritten");
  reader_failed_ = true;
  has_next_ = false;
  if (in_ != nullptr) std::fclose(in_);
  in_ = nullptr;
}

void SelectionMemo::WriterFailed(const std::string& why) {
  Warn(path_, why + "; this run's decisions are not remembered");
  writer_failed_ = true;
  if (out_ != nullptr) {
    std::fclose(out_);
    std::remove(tmp_path_.c_str());
  }
  out_ = nullptr;
}

void SelectionMemo::Begin(std::uint64_t ordinal, RequestId id) {
  KVTIER_CHECK(records_.empty() || records_.rbegin()->first < ordinal,
               "SelectionMemo::Begin: records must begin in trace order");
  Record& r = records_[ordinal];
  r.id = id;
  r.remembered.resize(std::size_t(layers_));
  r.used.resize(std::size_t(layers_));
  while (has_next_ && next_ordinal_ < ordinal) ReadEntry();  // records this run skips
  r.old_offset = valid_end_;
  while (has_next_ && next_ordinal_ == ordinal) {
    if (next_id_ != id) {
      ReaderFailed("record " + std::to_string(ordinal) + " is request " +
                   std::to_string(next_id_) + " in the memo but " + std::to_string(id) +
                   " in the trace");
      break;
    }
    r.remembered[std::size_t(next_layer_)] = std::move(next_);
    next_ = MemoLayer{};
    ReadEntry();
  }
}

const MemoLayer* SelectionMemo::Find(std::uint64_t ordinal, int layer, std::int64_t n) {
  auto it = records_.find(ordinal);
  KVTIER_CHECK(it != records_.end() && layer >= 0 && layer < layers_,
               "SelectionMemo::Find: record not begun or layer out of range");
  const MemoLayer& m = it->second.remembered[std::size_t(layer)];
  return m.n != 0 && std::int64_t(m.n) == n ? &m : nullptr;
}

void SelectionMemo::Store(std::uint64_t ordinal, int layer, MemoLayer decision, bool from_memo) {
  auto it = records_.find(ordinal);
  KVTIER_CHECK(it != records_.end() && layer >= 0 && layer < layers_,
               "SelectionMemo::Store: record not begun or layer out of range");
  it->second.used[std::size_t(layer)] = std::move(decision);
  ++(from_memo ? stats_.reused : stats_.computed);
  if (!from_memo) StartWriting();
}

void SelectionMemo::End(std::uint64_t ordinal) {
  auto it = records_.find(ordinal);
  if (it == records_.end()) return;
  it->second.ended = true;
  FlushEnded();
}

// Writes finished records in trace order: a record is written once every record before it
// has ended too. Per layer: what this run used, else what the old memo remembered.
void SelectionMemo::FlushEnded() {
  while (!records_.empty() && records_.begin()->second.ended) {
    const std::uint64_t ordinal = records_.begin()->first;
    Record& r = records_.begin()->second;
    for (int l = 0; l < layers_; ++l) {
      const MemoLayer& used = r.used[std::size_t(l)];
      const MemoLayer& old = r.remembered[std::size_t(l)];
      if (used.n != 0) {
        WriteEntry(ordinal, r.id, l, used);
      } else if (old.n != 0) {
        WriteEntry(ordinal, r.id, l, old);
      }
    }
    records_.erase(records_.begin());
  }
}

void SelectionMemo::WriteEntry(std::uint64_t ordinal, RequestId id, int layer,
                               const MemoLayer& m) {
  if (out_ == nullptr) return;
  const std::size_t words = Words(m.n);
  KVTIER_CHECK(m.voted_bits.size() == words, "MemoLayer: bits do not match n");
  const std::size_t size = kEntryHeader + words * 8 + m.counts.size();
  // At MaxFileBytes() the memo stops: what it holds stays a prefix of the trace's records.
  if (full_ || stats_.bytes_written + size > max_file_bytes_) {
    full_ = true;
    ++stats_.not_stored;
    return;
  }
  std::uint32_t set_bits = 0;
  for (std::uint64_t w : m.voted_bits) set_bits += std::uint32_t(std::popcount(w));
  const auto ncounts = static_cast<std::uint32_t>(m.counts.size());
  buf_.resize(size);
  const std::uint64_t id64 = id;
  const auto layer32 = static_cast<std::uint32_t>(layer);
  const std::uint32_t zero = 0;
  std::memcpy(&buf_[0], &ordinal, 8);
  std::memcpy(&buf_[8], &id64, 8);
  std::memcpy(&buf_[16], &layer32, 4);
  std::memcpy(&buf_[20], &m.n, 4);
  std::memcpy(&buf_[24], &m.k, 4);
  std::memcpy(&buf_[28], &zero, 4);
  std::memcpy(&buf_[32], &m.similarity, 8);
  std::memcpy(&buf_[40], &set_bits, 4);
  std::memcpy(&buf_[44], &ncounts, 4);
  std::memcpy(&buf_[kEntryHeader], m.voted_bits.data(), words * 8);
  if (ncounts > 0) std::memcpy(&buf_[kEntryHeader + words * 8], m.counts.data(), ncounts);
  const std::uint32_t crc = wire::Crc32(buf_);
  std::memcpy(&buf_[28], &crc, 4);
  if (std::fwrite(buf_.data(), 1, buf_.size(), out_) != buf_.size()) {
    WriterFailed(std::string("cannot write ") + tmp_path_ + ": " + std::strerror(errno));
    return;
  }
  stats_.bytes_written += buf_.size();
}

void SelectionMemo::Finish() {
  for (auto& [ordinal, r] : records_) r.ended = true;  // an interrupted run: keep what it made
  FlushEnded();
  if (reader_failed_) StartWriting();  // rewrite a damaged memo even if nothing was computed
  if (out_ == nullptr) {
    // Everything came from the memo (or a write failed): it stays, marked recently used.
    std::error_code ec;
    if (had_memo_) {
      std::filesystem::last_write_time(path_, std::filesystem::file_time_type::clock::now(), ec);
    }
    return;
  }
  // Records beyond this run's last (a shorter run than the memo's): keep them.
  while (has_next_) {
    WriteEntry(next_ordinal_, next_id_, next_layer_, next_);
    ReadEntry();
  }
  if (out_ == nullptr) return;  // a write failed
  const bool ok = std::fflush(out_) == 0 && std::ferror(out_) == 0;
  const bool closed = std::fclose(out_) == 0;
  out_ = nullptr;
  if (!ok || !closed) {
    Warn(path_, "cannot write " + tmp_path_ + "; this run's decisions are not remembered");
    std::remove(tmp_path_.c_str());
    return;
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    Warn(path_, std::string("cannot rename the new memo into place: ") + std::strerror(errno));
    std::remove(tmp_path_.c_str());
    return;
  }
  stats_.written = true;
  const std::filesystem::path file(path_);
  TrimDirectory(file.parent_path(), file, MaxDirectoryBytes());
}

std::uintmax_t SelectionMemo::MaxDirectoryBytes() {
  if (const char* v = std::getenv("KVTIER_SELECTION_MEMO_MAX_MB"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0') return std::uintmax_t(mb) << 20;
  }
  return std::uintmax_t{4096} << 20;
}

}  // namespace kvtier
