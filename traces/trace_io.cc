#include "traces/trace_io.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/errors.h"
#include "core/input_file.h"
#include "core/types.h"

namespace kvtier {

namespace wire {
std::uint32_t Crc32(std::span<const std::uint8_t> bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const std::uint8_t* p = bytes.data();
  std::size_t n = bytes.size();
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}
}  // namespace wire

namespace {

constexpr std::uint32_t kMaxRecordBytes = 1u << 30;
constexpr std::uint32_t kMaxHeaderBytes = 1u << 24;
constexpr std::int64_t kMaxLengthTokens = std::int64_t(1) << 40;  // query and output lengths
constexpr char kEndTag[4] = {'K', 'E', 'N', 'D'};
constexpr std::uint64_t kExtDecodeTopK = 1;
constexpr std::uint64_t kExtDecodeTopKSets = 2;

void EncodeProcedural(const ProceduralParams& p, wire::ByteWriter* w) {
  w->U64(p.seed);
  w->Var(p.head_corr.size());
  for (double v : p.head_corr) w->F64(v);
  w->F64(p.layer_corr);
  w->F64(p.query_dependence);
  w->Var(static_cast<std::uint64_t>(p.sink_tokens));
  w->F64(p.sink_boost);
  w->F64(p.tail);
  // Version 2 appends `var model | var n | f64 field[n]` inside the length-prefixed block; a
  // version-1 block ends after `tail` (and is byte-identical to what older kvtier wrote).
  // Version 3 writes version 2's fields and then focus, focus_tokens, factors, loadings.
  // Version 4 writes version 3's fields with the number of loading rows before the loadings,
  // then skew.
  if (p.model != 1) {
    std::vector<double> fields = {p.persistent, p.persistent_query, p.smooth,
                                  double(p.smooth_tokens), p.head_spread,
                                  p.slow, p.slow_corr, p.persistent_corr,
                                  double(p.recency.size())};
    fields.insert(fields.end(), p.recency.begin(), p.recency.end());
    if (p.model == 3) {
      fields.insert(fields.end(), {p.focus, double(p.focus_tokens), double(p.factors)});
      fields.insert(fields.end(), p.loadings.begin(), p.loadings.end());
    } else if (p.model == 4) {
      fields.insert(fields.end(), {p.focus, double(p.focus_tokens), double(p.factors),
                                   double(p.loadings.size())});
      fields.insert(fields.end(), p.loadings.begin(), p.loadings.end());
      fields.push_back(p.skew);
    }
    w->Var(static_cast<std::uint64_t>(p.model));
    w->Var(fields.size());
    for (double v : fields) w->F64(v);
  }
}

bool DecodeProcedural(wire::ByteReader* r, ProceduralParams* p) {
  std::uint64_t n, sinks;
  if (!r->U64(&p->seed) || !r->Var(&n) || n == 0 || n > 4096 || n * 8 > r->remaining()) {
    return false;
  }
  p->head_corr.resize(n);
  for (auto& v : p->head_corr) r->F64(&v);
  r->F64(&p->layer_corr);
  r->F64(&p->query_dependence);
  if (!r->Var(&sinks) || sinks > (1u << 20)) return false;
  p->sink_tokens = static_cast<int>(sinks);
  r->F64(&p->sink_boost);
  r->F64(&p->tail);
  if (r->ok() && r->remaining() > 0) {  // version >= 2; fields beyond the known ones skipped
    std::uint64_t model = 0, n = 0;
    if (!r->Var(&model) || model < 2 || model > 4 || !r->Var(&n) || n > (1u << 20) ||
        n * 8 > r->remaining()) {
      return false;
    }
    p->model = static_cast<int>(model);
    std::vector<double> f(n);
    for (double& v : f) r->F64(&v);
    if (n < 9) return false;
    p->persistent = f[0];
    p->persistent_query = f[1];
    p->smooth = f[2];
    if (!(f[3] >= 1 && f[3] <= 65536)) return false;
    p->smooth_tokens = static_cast<int>(f[3]);
    p->head_spread = f[4];
    p->slow = f[5];
    p->slow_corr = f[6];
    p->persistent_corr = f[7];
    const double m = f[8];
    if (!(m >= 0 && m <= 16 && m == std::floor(m)) || 9 + std::size_t(m) > n) return false;
    p->recency.assign(f.begin() + 9, f.begin() + 9 + std::ptrdiff_t(m));
    if (model == 3) {
      const std::size_t at = 9 + std::size_t(m);
      if (at + 3 > n) return false;
      p->focus = f[at];
      const double ft = f[at + 1], k = f[at + 2];
      if (!(ft >= 1 && ft <= 65536 && ft == std::floor(ft))) return false;
      if (!(k >= 0 && k <= 64 && k == std::floor(k))) return false;
      p->focus_tokens = static_cast<int>(ft);
      p->factors = static_cast<int>(k);
      p->loadings.assign(f.begin() + std::ptrdiff_t(at + 3), f.end());
    } else if (model == 4) {
      const std::size_t at = 9 + std::size_t(m);
      if (at + 4 > n) return false;
      p->focus = f[at];
      const double ft = f[at + 1], k = f[at + 2], count = f[at + 3];
      if (!(ft >= 1 && ft <= 65536 && ft == std::floor(ft))) return false;
      if (!(k >= 0 && k <= 64 && k == std::floor(k))) return false;
      if (!(count >= 0 && count <= double(n) && count == std::floor(count)) ||
          at + 4 + std::size_t(count) + 1 > n) {
        return false;
      }
      p->focus_tokens = static_cast<int>(ft);
      p->factors = static_cast<int>(k);
      const auto first = f.begin() + std::ptrdiff_t(at + 4);
      p->loadings.assign(first, first + std::ptrdiff_t(count));
      p->skew = f[at + 4 + std::size_t(count)];  // fields after skew: a later version's
    }
  }
  return r->ok();
}

void EncodeHeader(const TraceHeader& h, wire::ByteWriter* w) {
  w->Str(h.producer);
  w->Str(h.model.name);
  w->Var(static_cast<std::uint64_t>(h.model.layers));
  w->Var(static_cast<std::uint64_t>(h.model.heads));
  w->Var(static_cast<std::uint64_t>(h.model.kv_heads));
  w->Var(static_cast<std::uint64_t>(h.chunk_tokens));
  w->U8(h.procedural ? 1 : 0);
  if (h.procedural) {
    wire::ByteWriter p;
    EncodeProcedural(*h.procedural, &p);
    w->Var(p.bytes().size());
    w->Raw(p.bytes().data(), p.bytes().size());
  }
  w->Var(h.metadata.size());
  for (const auto& [k, v] : h.metadata) {
    w->Str(k);
    w->Str(v);
  }
}

void EncodeRecord(const TraceRecord& rec, wire::ByteWriter* w) {
  const Request& q = rec.request;
  w->Var(q.id);
  w->F64(q.arrival_s);
  w->U8(static_cast<std::uint8_t>(rec.prefix_kind));
  w->Var(static_cast<std::uint64_t>(q.tokens_per_symbol));
  w->Var(q.prefix.size());
  std::uint64_t prev = 0;
  for (std::uint64_t s : q.prefix) {
    w->SVar(static_cast<std::int64_t>(s - prev));
    prev = s;
  }
  w->Var(static_cast<std::uint64_t>(q.query_tokens));
  w->Var(static_cast<std::uint64_t>(q.output_tokens));
  w->Var(rec.query_ids.size());
  prev = 0;
  for (std::uint64_t s : rec.query_ids) {
    w->SVar(static_cast<std::int64_t>(s - prev));
    prev = s;
  }
  w->U8(static_cast<std::uint8_t>(rec.importance));
  if (rec.importance == ImportanceKind::kProcedural) {
    w->U64(rec.query_key);
  } else if (rec.importance == ImportanceKind::kExplicit) {
    const ExplicitScores& e = rec.explicit_scores;
    w->Var(static_cast<std::uint64_t>(e.layers));
    w->Var(static_cast<std::uint64_t>(e.kv_heads));
    w->Var(static_cast<std::uint64_t>(e.tokens));
    w->U8(static_cast<std::uint8_t>(e.bits));
    auto* out = w->mutable_bytes();
    for (std::int64_t r = 0; r < e.rows(); ++r) {
      w->F32(e.lo[r]);
      w->F32(e.hi[r]);
      const std::uint16_t* c = e.codes.data() + r * e.tokens;
      if (e.bits == 8) {
        for (std::int64_t t = 0; t < e.tokens; ++t) out->push_back(static_cast<std::uint8_t>(c[t]));
      } else {
        w->Raw(c, static_cast<std::size_t>(e.tokens) * 2);
      }
    }
  }
  w->Var((rec.decode_topk ? 1 : 0) + (rec.decode_sets ? 1 : 0));
  if (rec.decode_topk) {
    wire::ByteWriter x;
    const DecodeTopK& d = *rec.decode_topk;
    x.Var(static_cast<std::uint64_t>(d.steps));
    x.Var(static_cast<std::uint64_t>(d.k));
    for (int s = 0; s < d.steps; ++s) {
      std::int64_t p = 0;
      for (int j = 0; j < d.k; ++j) {
        const std::int64_t v = d.positions[std::size_t(s) * d.k + j];
        x.SVar(v - p);
        p = v;
      }
    }
    w->Var(kExtDecodeTopK);
    w->Var(x.bytes().size());
    w->Raw(x.bytes().data(), x.bytes().size());
  }
  if (rec.decode_sets) {
    const DecodeTopKSets& d = *rec.decode_sets;
    wire::ByteWriter x;
    x.Var(static_cast<std::uint64_t>(d.steps));
    x.Var(static_cast<std::uint64_t>(d.k));
    x.Var(static_cast<std::uint64_t>(d.layers));
    x.Var(static_cast<std::uint64_t>(d.kv_heads));
    x.U8(static_cast<std::uint8_t>((d.output.empty() ? 0 : 1) | (d.prefetched.empty() ? 0 : 2)));
    for (int s = 0; s < d.steps; ++s) {
      x.Var(static_cast<std::uint64_t>(d.context[s]));
      x.Var(static_cast<std::uint64_t>(d.candidates[s]));
    }
    for (const auto* sets : {&d.output, &d.prefetched}) {
      for (const std::vector<std::int64_t>& set : *sets) {
        x.Var(set.size());
        std::int64_t p = 0;
        for (std::int64_t v : set) {
          x.SVar(v - p);
          p = v;
        }
      }
    }
    w->Var(kExtDecodeTopKSets);
    w->Var(x.bytes().size());
    w->Raw(x.bytes().data(), x.bytes().size());
  }
}

}  // namespace

std::string CheckRecord(const TraceHeader& header, const TraceRecord& rec) {
  const Request& q = rec.request;
  if (!std::isfinite(q.arrival_s) || q.arrival_s < 0) return "arrival time is negative or NaN";
  if (q.tokens_per_symbol < 1) return "tokens_per_symbol < 1";
  if (q.query_tokens < 0) return "negative query length";
  if (q.output_tokens < 0) return "negative output length";
  // The reader's bounds (DecodeRecord), so that a writer never writes what the reader refuses.
  if (q.tokens_per_symbol > (1 << 24)) return "tokens_per_symbol above 2^24";
  if (q.query_tokens > kMaxLengthTokens || q.output_tokens > kMaxLengthTokens) {
    return "query or output length above 2^40 tokens";
  }
  if (rec.prefix_kind != PrefixKind::kTokens && rec.prefix_kind != PrefixKind::kBlocks) {
    return "unknown prefix kind " + std::to_string(int(rec.prefix_kind));
  }
  if (rec.prefix_kind == PrefixKind::kTokens && q.tokens_per_symbol != 1) {
    return "token-level prefix with tokens_per_symbol " + std::to_string(q.tokens_per_symbol);
  }
  switch (rec.importance) {
    case ImportanceKind::kNone:
      break;
    case ImportanceKind::kProcedural:
      if (!header.procedural) return "procedural importance but the header has no importance model";
      break;
    case ImportanceKind::kExplicit: {
      const ExplicitScores& e = rec.explicit_scores;
      if (e.layers != header.model.layers) {
        return "explicit scores have " + std::to_string(e.layers) + " layers, model has " +
               std::to_string(header.model.layers);
      }
      if (e.kv_heads != header.model.kv_heads) {
        return "explicit scores have " + std::to_string(e.kv_heads) + " heads, model has " +
               std::to_string(header.model.kv_heads) + " kv_heads";
      }
      if (e.tokens != q.prefix_tokens()) {
        return "explicit scores cover " + std::to_string(e.tokens) + " tokens, prefix has " +
               std::to_string(q.prefix_tokens());
      }
      if (e.bits != 8 && e.bits != 16) return "explicit scores: bits must be 8 or 16";
      if (std::int64_t(e.lo.size()) != e.rows() || std::int64_t(e.hi.size()) != e.rows() ||
          std::int64_t(e.codes.size()) != e.rows() * e.tokens) {
        return "explicit scores: inconsistent sizes";
      }
      for (std::int64_t r = 0; r < e.rows(); ++r) {
        if (!std::isfinite(e.lo[r]) || !std::isfinite(e.hi[r]) || e.lo[r] > e.hi[r]) {
          return "layer " + std::to_string(r / e.kv_heads) + " head " +
                 std::to_string(r % e.kv_heads) + ": score range is NaN, infinite or inverted";
        }
      }
      if (e.bits == 8) {
        for (std::uint16_t c : e.codes) {
          if (c > 255) return "explicit scores: 8-bit code out of range";
        }
      }
      break;
    }
    default:
      return "unknown importance kind " + std::to_string(int(rec.importance));
  }
  if (rec.decode_sets) {
    const DecodeTopKSets& d = *rec.decode_sets;
    if (d.layers != header.model.layers || d.kv_heads != header.model.kv_heads) {
      return "decode top-k sets: " + std::to_string(d.layers) + " layers x " +
             std::to_string(d.kv_heads) + " heads, model has " +
             std::to_string(header.model.layers) + " x " + std::to_string(header.model.kv_heads);
    }
    const std::size_t n = static_cast<std::size_t>(d.steps) * d.layers * d.kv_heads;
    if (d.steps < 0 || d.k < 0 || d.context.size() != std::size_t(d.steps) ||
        d.candidates.size() != std::size_t(d.steps) || (!d.output.empty() && d.output.size() != n) ||
        (!d.prefetched.empty() && d.prefetched.size() != n)) {
      return "decode top-k sets: inconsistent sizes";
    }
    const std::int64_t limit = q.prefix_tokens() + q.query_tokens + q.output_tokens;
    for (int s = 0; s < d.steps; ++s) {
      if (d.context[s] < 0 || d.context[s] > limit || d.candidates[s] < 0 ||
          d.candidates[s] > d.context[s] + 1) {
        return "decode top-k sets: step " + std::to_string(s) + " context " +
               std::to_string(d.context[s]) + " / candidates " + std::to_string(d.candidates[s]) +
               " out of range (limit " + std::to_string(limit) + ")";
      }
    }
    for (const auto* sets : {&d.output, &d.prefetched}) {
      for (std::size_t i = 0; i < sets->size(); ++i) {
        const std::vector<std::int64_t>& set = (*sets)[i];
        const int s = static_cast<int>(i / (static_cast<std::size_t>(d.layers) * d.kv_heads));
        if (std::int64_t(set.size()) > d.k) return "decode top-k sets: a set larger than k";
        for (std::int64_t p : set) {
          if (p < 0 || p >= d.candidates[s]) {
            return "decode top-k sets: step " + std::to_string(s) + " position " +
                   std::to_string(p) + " out of range [0, " + std::to_string(d.candidates[s]) + ")";
          }
        }
      }
    }
  }
  if (rec.decode_topk) {
    const DecodeTopK& d = *rec.decode_topk;
    if (d.steps < 0 || d.k < 0 ||
        std::int64_t(d.positions.size()) != std::int64_t(d.steps) * d.k) {
      return "decode top-k: inconsistent sizes";
    }
    const std::int64_t limit = q.prefix_tokens() + q.query_tokens + q.output_tokens;
    for (std::int64_t p : d.positions) {
      if (p < 0 || p >= limit) {
        return "decode top-k position " + std::to_string(p) + " out of range [0, " +
               std::to_string(limit) + ")";
      }
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------- writer --

namespace {
// True if `path` exists and is not a regular file (/dev/null, /dev/stdout, a FIFO): such an
// output is written in place, never replaced by a rename.
bool IsSpecialFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
}

// The partial files of this process's open writers, for the stop signals' handler: a fixed
// table the handler only reads (a slot's path is written before it is marked used, and the
// handler reads a used slot's path; unlink is async-signal-safe). A writer whose path does
// not fit, or that finds every slot taken, is not in the table (a stop signal then leaves its
// partial file, as SIGKILL does).
struct PartialSlot {
  std::atomic<bool> used{false};
  char path[PATH_MAX];
};
constexpr int kPartialSlots = 8;
PartialSlot g_partials[kPartialSlots];
std::atomic<bool> g_handlers_installed{false};
static_assert(std::atomic<bool>::is_always_lock_free);

// SIGTERM, SIGINT or SIGHUP while a partial file is open: remove every registered partial
// file, then raise the signal again, whose disposition SA_RESETHAND has made the default:
// the process ends as the signal would have ended it.
extern "C" void RemovePartialFilesOnStop(int sig) {
  for (PartialSlot& slot : g_partials) {
    if (slot.used.load(std::memory_order_acquire)) ::unlink(slot.path);
  }
  ::raise(sig);
}

// Installs the handler once per process, for each stop signal whose disposition is still the
// default: an ignored signal (nohup, a background job) stays ignored, and a command's own
// handler (the simulator's children stop between requests) is kept.
void InstallStopHandlers() {
  if (g_handlers_installed.exchange(true)) return;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = RemovePartialFilesOnStop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &sa, nullptr);
  }
}

// Enters `path` in the table; returns its slot, or -1 when it does not fit.
int RegisterPartial(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  InstallStopHandlers();
  static std::mutex mu;  // writers of several threads; the handler takes no lock
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < kPartialSlots; ++i) {
    if (g_partials[i].used.load(std::memory_order_relaxed)) continue;
    std::memcpy(g_partials[i].path, path.c_str(), path.size() + 1);
    g_partials[i].used.store(true, std::memory_order_release);
    return i;
  }
  return -1;
}

void UnregisterPartial(int slot) {
  if (slot >= 0) g_partials[slot].used.store(false, std::memory_order_release);
}

}  // namespace

TraceWriter::TraceWriter(const std::string& path, const TraceHeader& header)
    : path_(path),
      partial_path_(IsSpecialFile(path) ? path : path + ".partial"),
      header_(header),
      exceptions_at_start_(std::uncaught_exceptions()) {
  if (header_.model.layers < 1 || header_.model.kv_heads < 1 || header_.model.heads < 1) {
    throw InputError(path + ": header: model needs layers, heads and kv_heads >= 1");
  }
  if (header_.procedural) header_.procedural->Validate(path + ": header: procedural");
  file_ = std::fopen(partial_path_.c_str(), "wb");
  if (!file_) {
    throw InputError(path + ": cannot create " + partial_path_ + ": " + std::strerror(errno));
  }
  if (partial_path_ != path_) partial_slot_ = RegisterPartial(partial_path_);
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  try {
    wire::ByteWriter h;
    EncodeHeader(header_, &h);
    Put(kTraceMagic, 8);
    const std::uint32_t version = kTraceVersion, len = static_cast<std::uint32_t>(h.bytes().size());
    Put(&version, 4);
    Put(&len, 4);
    Put(h.bytes().data(), len);
    const std::uint32_t crc = wire::Crc32(h.bytes());
    Put(&crc, 4);
  } catch (...) {
    Discard();
    throw;
  }
}

TraceWriter::~TraceWriter() {
  if (!file_) return;
  if (std::uncaught_exceptions() > exceptions_at_start_) {
    Discard();  // unwinding: whatever failed, no trace appears under path_
    return;
  }
  try {
    Close();
  } catch (...) {
    Discard();
  }
}

void TraceWriter::Discard() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
  if (partial_path_ != path_) std::remove(partial_path_.c_str());
  UnregisterPartial(partial_slot_);
  partial_slot_ = -1;
}

void TraceWriter::Put(const void* p, std::size_t n) {
  if (std::fwrite(p, 1, n, file_) != n) {
    throw InputError(path_ + ": write failed: " + std::strerror(errno));
  }
  bytes_ += n;
}

void TraceWriter::Write(const TraceRecord& record) {
  if (!file_) throw InputError(path_ + ": write after close");
  const std::string bad = CheckRecord(header_, record);
  if (!bad.empty()) {
    throw InputError(path_ + ": record " + std::to_string(records_) + ": " + bad);
  }
  buf_.Clear();
  EncodeRecord(record, &buf_);
  if (buf_.bytes().size() >= kMaxRecordBytes) {
    throw InputError(path_ + ": record " + std::to_string(records_) + ": larger than 1 GiB");
  }
  const std::uint32_t len = static_cast<std::uint32_t>(buf_.bytes().size());
  const std::uint32_t crc = wire::Crc32(buf_.bytes());
  Put(&len, 4);
  Put(buf_.bytes().data(), len);
  Put(&crc, 4);
  ++records_;
}

void TraceWriter::Close() {
  if (!file_) return;
  const std::uint32_t zero = 0;
  const std::uint64_t count = static_cast<std::uint64_t>(records_);
  Put(&zero, 4);
  Put(&count, 8);
  Put(kEndTag, 4);
  const bool ok = std::fflush(file_) == 0;
  const int err = errno;
  std::fclose(file_);
  file_ = nullptr;
  struct Unregister {  // after the rename or removal, so a stop signal never leaves it
    int* slot;
    ~Unregister() {
      UnregisterPartial(*slot);
      *slot = -1;
    }
  } unregister{&partial_slot_};
  if (!ok) {
    if (partial_path_ != path_) std::remove(partial_path_.c_str());
    throw InputError(path_ + ": write failed: " + std::strerror(err));
  }
  if (partial_path_ != path_ && std::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    const int rerr = errno;
    std::remove(partial_path_.c_str());
    throw InputError(path_ + ": cannot rename " + partial_path_ + " to it: " + std::strerror(rerr));
  }
}

// ---------------------------------------------------------------------------------- reader --

TraceReader::TraceReader(const std::string& path) : path_(path) {
  // A trace is read several times per run (checked, hashed, prewarmed, replayed): a FIFO would
  // block forever on its second open.
  RequireRegularFile(path, "trace file", InputKind::kTrace);
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) throw TraceError(path + ": cannot open: " + std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  struct stat st {};
  if (::fstat(::fileno(file_), &st) == 0) file_bytes_ = std::uint64_t(st.st_size);
  try {
    ReadHeader();
  } catch (...) {
    std::fclose(file_);  // the destructor does not run for a throwing constructor
    file_ = nullptr;
    throw;
  }
}

std::int64_t TraceReader::DeclaredRecords() const {
  // The end marker: a zero record length, the count (8 bytes), "KEND".
  std::uint8_t tail[16];
  if (file_bytes_ < sizeof tail ||
      ::pread(::fileno(file_), tail, sizeof tail, off_t(file_bytes_ - sizeof tail)) !=
          ssize_t(sizeof tail)) {
    return -1;
  }
  std::uint32_t len = 0;
  std::uint64_t count = 0;
  std::memcpy(&len, tail, 4);
  std::memcpy(&count, tail + 4, 8);
  if (len != 0 || std::memcmp(tail + 12, kEndTag, 4) != 0 || count > (1ull << 62)) return -1;
  return std::int64_t(count);
}

void TraceReader::ReadHeader() {
  const std::string& path = path_;
  char magic[8];
  if (std::fread(magic, 1, 8, file_) != 8 || std::memcmp(magic, kTraceMagic, 8) != 0) {
    throw TraceError(path + ": header: not a kvtier trace (bad magic)");
  }
  std::uint32_t version = 0, len = 0;
  if (std::fread(&version, 1, 4, file_) != 4) throw TraceError(path + ": header: truncated");
  if (version != kTraceVersion) {
    throw TraceError(path + ": header: unsupported format version " + std::to_string(version) +
                     " (this kvtier reads version " + std::to_string(kTraceVersion) + ")");
  }
  if (std::fread(&len, 1, 4, file_) != 4) throw TraceError(path + ": header: truncated");
  if (len > kMaxHeaderBytes) throw TraceError(path + ": header: length " + std::to_string(len) + " too large");
  if (len > file_bytes_) {
    throw TraceError(path + ": header: truncated (length " + std::to_string(len) +
                     " is more than the file holds)");
  }
  buf_.resize(len);
  std::uint32_t crc = 0;
  if (std::fread(buf_.data(), 1, len, file_) != len || std::fread(&crc, 1, 4, file_) != 4) {
    throw TraceError(path + ": header: truncated");
  }
  if (crc != wire::Crc32(buf_)) throw TraceError(path + ": header: CRC mismatch (corrupted)");
  bytes_ = 8 + 4 + 4 + len + 4;
  wire::ByteReader r(buf_);
  std::uint64_t layers = 0, heads = 0, kv_heads = 0, chunk = 0, nmeta = 0;
  std::uint8_t has_proc = 0;
  header_.version = version;
  r.Str(&header_.producer);
  r.Str(&header_.model.name);
  r.Var(&layers);
  r.Var(&heads);
  r.Var(&kv_heads);
  r.Var(&chunk);
  r.U8(&has_proc);
  if (!r.ok()) throw TraceError(path + ": header: malformed");
  if (layers < 1 || layers > kMaxLayers || heads < 1 || heads > 4096 || kv_heads < 1 ||
      kv_heads > heads || chunk > (1u << 24)) {
    throw TraceError(path + ": header: model shape out of range (layers " + std::to_string(layers) +
                     ", heads " + std::to_string(heads) + ", kv_heads " +
                     std::to_string(kv_heads) + ")");
  }
  header_.model.layers = int(layers);
  header_.model.heads = int(heads);
  header_.model.kv_heads = int(kv_heads);
  header_.chunk_tokens = int(chunk);
  if (has_proc > 1) throw TraceError(path + ": header: malformed procedural flag");
  if (has_proc) {
    std::uint64_t plen = 0;
    if (!r.Var(&plen) || plen > r.remaining()) throw TraceError(path + ": header: malformed");
    wire::ByteReader pr(std::span<const std::uint8_t>(r.pos(), plen));
    ProceduralParams p;
    if (!DecodeProcedural(&pr, &p)) throw TraceError(path + ": header: malformed procedural parameters");
    try {
      p.Validate(path + ": header: procedural");
    } catch (const InputError& e) {
      throw TraceError(e.what());
    }
    header_.procedural = p;
    r.Skip(plen);
  }
  if (!r.Var(&nmeta) || nmeta > r.remaining()) throw TraceError(path + ": header: malformed metadata");
  for (std::uint64_t i = 0; i < nmeta; ++i) {
    std::string k, v;
    if (!r.Str(&k) || !r.Str(&v)) throw TraceError(path + ": header: malformed metadata");
    header_.metadata.emplace_back(std::move(k), std::move(v));
  }
}

TraceReader::~TraceReader() {
  if (file_) std::fclose(file_);
}

void TraceReader::Fail(const std::string& what) const {
  throw TraceError(path_ + ": record " + std::to_string(records_) + ": " + what);
}

void TraceReader::ReadExact(void* p, std::size_t n, const char* what) {
  const std::size_t got = std::fread(p, 1, n, file_);
  bytes_ += got;
  if (got != n) {
    Fail(std::string("truncated file (") + what + ": wanted " + std::to_string(n) +
         " bytes, got " + std::to_string(got) + ")");
  }
}

bool TraceReader::Next(TraceRecord* record) {
  if (done_) return false;
  std::uint32_t len = 0;
  ReadExact(&len, 4, "record length; the end marker is missing");
  if (len == 0) {
    std::uint64_t count = 0;
    char tag[4];
    ReadExact(&count, 8, "end marker");
    ReadExact(tag, 4, "end marker");
    if (std::memcmp(tag, kEndTag, 4) != 0) Fail("malformed end marker");
    if (count != static_cast<std::uint64_t>(records_)) {
      Fail("end marker says " + std::to_string(count) + " records, read " +
           std::to_string(records_));
    }
    if (std::fgetc(file_) != EOF) Fail("data after the end marker");
    done_ = true;
    return false;
  }
  if (len > kMaxRecordBytes) Fail("record length " + std::to_string(len) + " exceeds 1 GiB (corrupted)");
  // Checked against the file's size before anything is allocated: a corrupted length in a small
  // file must not cost a 1 GiB allocation (the fuzzer found every such input 30x slower).
  if (len > file_bytes_ - std::min(bytes_, file_bytes_)) {
    Fail("truncated file (record body: wanted " + std::to_string(len) + " bytes, the file has " +
         std::to_string(file_bytes_ - std::min(bytes_, file_bytes_)) + " left)");
  }
  buf_.resize(len);
  ReadExact(buf_.data(), len, "record body");
  std::uint32_t crc = 0;
  ReadExact(&crc, 4, "record CRC");
  if (crc != wire::Crc32(buf_)) Fail("CRC mismatch (corrupted record)");
  DecodeRecord(record);
  const std::string bad = CheckRecord(header_, *record);
  if (!bad.empty()) Fail(bad);
  ++records_;
  return true;
}

void TraceReader::DecodeExtSets(std::span<const std::uint8_t> bytes, TraceRecord* rec) {
  wire::ByteReader x(bytes);
  std::uint64_t steps, k, layers, heads;
  std::uint8_t which = 0;
  if (!x.Var(&steps) || !x.Var(&k) || !x.Var(&layers) || !x.Var(&heads) || !x.U8(&which) ||
      layers != std::uint64_t(header_.model.layers) ||
      heads != std::uint64_t(header_.model.kv_heads) || steps > bytes.size() ||
      k > (1u << 24) || which > 3) {
    Fail("malformed decode top-k sets");
  }
  DecodeTopKSets d;
  d.steps = int(steps);
  d.k = int(k);
  d.layers = int(layers);
  d.kv_heads = int(heads);
  d.context.resize(steps);
  d.candidates.resize(steps);
  for (std::uint64_t s = 0; s < steps; ++s) {
    std::uint64_t c, l;
    if (!x.Var(&c) || !x.Var(&l) || c > (1ull << 40) || l > (1ull << 40)) {
      Fail("malformed decode top-k sets");
    }
    d.context[s] = std::int64_t(c);
    d.candidates[s] = std::int64_t(l);
  }
  const std::uint64_t n = steps * layers * heads;
  for (int set = 0; set < 2; ++set) {
    if (!(which & (1 << set))) continue;
    if (n > x.remaining()) Fail("malformed decode top-k sets");  // >= 1 byte per set
    auto& out = set == 0 ? d.output : d.prefetched;
    out.resize(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint64_t m;
      if (!x.Var(&m) || m > k || m > x.remaining()) Fail("malformed decode top-k sets");
      out[i].resize(m);
      std::int64_t p = 0;
      for (std::uint64_t j = 0; j < m; ++j) {
        std::int64_t dv;
        if (!x.SVar(&dv)) Fail("malformed decode top-k sets");
        p += dv;
        out[i][j] = p;
      }
    }
  }
  if (!x.ok() || x.remaining() != 0) Fail("malformed decode top-k sets");
  rec->decode_sets = std::move(d);
}

void TraceReader::DecodeRecord(TraceRecord* rec) {
  wire::ByteReader r(buf_);
  Request& q = rec->request;
  std::uint64_t tps = 0, n = 0, qt = 0, ot = 0;
  std::uint8_t kind = 0, imp = 0;
  r.Var(&q.id);
  r.F64(&q.arrival_s);
  r.U8(&kind);
  r.Var(&tps);
  if (!r.Var(&n) || n > r.remaining()) Fail("malformed prefix");
  if (tps < 1 || tps > (1u << 24)) Fail("tokens_per_symbol " + std::to_string(tps) + " out of range");
  rec->prefix_kind = static_cast<PrefixKind>(kind);
  q.tokens_per_symbol = int(tps);
  q.prefix.resize(n);
  std::uint64_t prev = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t z;
    if (!r.Var(&z)) Fail("malformed prefix symbols");
    prev += static_cast<std::uint64_t>(wire::UnZigZag(z));
    q.prefix[i] = prev;
  }
  if (!r.Var(&qt) || !r.Var(&ot)) Fail("malformed lengths");
  if (qt > kMaxLengthTokens || ot > kMaxLengthTokens) Fail("query or output length out of range");
  q.query_tokens = std::int64_t(qt);
  q.output_tokens = std::int64_t(ot);
  if (!r.Var(&n) || n > r.remaining()) Fail("malformed query ids");
  rec->query_ids.resize(n);
  prev = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t z;
    if (!r.Var(&z)) Fail("malformed query ids");
    prev += static_cast<std::uint64_t>(wire::UnZigZag(z));
    rec->query_ids[i] = prev;
  }
  if (!r.U8(&imp)) Fail("malformed importance kind");
  rec->importance = static_cast<ImportanceKind>(imp);
  rec->query_key = 0;
  if (rec->importance == ImportanceKind::kProcedural) {
    if (!r.U64(&rec->query_key)) Fail("malformed procedural payload");
  } else if (rec->importance == ImportanceKind::kExplicit) {
    ExplicitScores& e = rec->explicit_scores;
    std::uint64_t layers, heads, tokens;
    std::uint8_t bits;
    if (!r.Var(&layers) || !r.Var(&heads) || !r.Var(&tokens) || !r.U8(&bits)) {
      Fail("malformed explicit payload");
    }
    if (bits != 8 && bits != 16) Fail("explicit payload: bits " + std::to_string(bits) + " not 8 or 16");
    if (layers != std::uint64_t(header_.model.layers)) {
      Fail("explicit scores have " + std::to_string(layers) + " layers, model has " +
           std::to_string(header_.model.layers));
    }
    if (heads != std::uint64_t(header_.model.kv_heads)) {
      Fail("explicit scores have " + std::to_string(heads) + " heads, model has " +
           std::to_string(header_.model.kv_heads) + " kv_heads");
    }
    if (tokens > (1ull << 32)) Fail("explicit payload: token count out of range");
    const std::uint64_t rows = layers * heads;
    const std::uint64_t need = rows * (8 + tokens * (bits / 8));
    if (need > r.remaining()) Fail("explicit payload: truncated (needs " + std::to_string(need) + " bytes)");
    e.layers = int(layers);
    e.kv_heads = int(heads);
    e.tokens = std::int64_t(tokens);
    e.bits = bits;
    e.lo.resize(rows);
    e.hi.resize(rows);
    e.codes.resize(rows * tokens);
    for (std::uint64_t row = 0; row < rows; ++row) {
      r.F32(&e.lo[row]);
      r.F32(&e.hi[row]);
      std::uint16_t* c = e.codes.data() + row * tokens;
      if (bits == 16) {
        r.Raw(c, tokens * 2);
      } else {
        const std::uint8_t* p = r.pos();
        for (std::uint64_t t = 0; t < tokens; ++t) c[t] = p[t];
        r.Skip(tokens);
      }
    }
  } else if (imp > 2) {
    Fail("unknown importance kind " + std::to_string(imp));
  }
  std::uint64_t next = 0;
  if (!r.Var(&next) || next > r.remaining()) Fail("malformed extensions");
  rec->decode_topk.reset();
  rec->decode_sets.reset();
  for (std::uint64_t i = 0; i < next; ++i) {
    std::uint64_t tag, elen;
    if (!r.Var(&tag) || !r.Var(&elen) || elen > r.remaining()) Fail("malformed extension");
    if (tag == kExtDecodeTopK) {
      wire::ByteReader x(std::span<const std::uint8_t>(r.pos(), elen));
      std::uint64_t steps, k;
      if (!x.Var(&steps) || !x.Var(&k) || steps * k > elen) Fail("malformed decode top-k");
      DecodeTopK d;
      d.steps = int(steps);
      d.k = int(k);
      d.positions.resize(steps * k);
      for (std::uint64_t s = 0; s < steps; ++s) {
        std::int64_t p = 0;
        for (std::uint64_t j = 0; j < k; ++j) {
          std::int64_t dv;
          if (!x.SVar(&dv)) Fail("malformed decode top-k");
          p += dv;
          d.positions[s * k + j] = p;
        }
      }
      rec->decode_topk = std::move(d);
    } else if (tag == kExtDecodeTopKSets) {
      DecodeExtSets(std::span<const std::uint8_t>(r.pos(), elen), rec);
    }
    r.Skip(elen);  // unknown tags are skipped: later extensions need no format break
  }
  if (!r.ok()) Fail("malformed record");
  if (r.remaining() != 0) Fail("trailing bytes in record");
}

std::int64_t TraceRecordCountHint(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return 0;
  unsigned char tail[16];
  const bool ok = std::fseek(f, -16, SEEK_END) == 0 && std::fread(tail, 1, 16, f) == 16;
  std::fclose(f);
  // end = u32 0 | u64 record_count | "KEND" (little-endian).
  if (!ok || tail[0] != 0 || tail[1] != 0 || tail[2] != 0 || tail[3] != 0 ||
      std::memcmp(tail + 12, kEndTag, 4) != 0) {
    return 0;
  }
  std::uint64_t count = 0;
  for (int i = 7; i >= 0; --i) count = (count << 8) | tail[4 + i];
  return count > std::uint64_t(INT64_MAX) ? 0 : static_cast<std::int64_t>(count);
}

}  // namespace kvtier
