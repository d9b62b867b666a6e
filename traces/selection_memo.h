#pragma once
// SelectionMemo: ITF decisions (or H2O's per-head selections) remembered across runs of one
// trace, so that a sweep pays for importance generation and exact top-k selection once per
// trace instead of once per point.
//
// Why it is sound: a layer's ITF decision (core/itf.h) depends only on the trace record, the
// layer, the number of reused tokens n, select.retention and itf.probe_heads (plus, for
// procedural importance, the replayed model's shape and workload.importance). It does not
// depend on the system's caches, the hardware or time. itf.alpha only moves the threshold, so
// the memo stores the similarity and the set a pass votes for (SelectItfAndVote) and the reader
// applies the run's own threshold. n can differ between systems (the radix tree matches what
// they kept), so every entry carries its n and is used only for the same n.
//
// H2O's selection of a layer (every KV head's top-k, k = ceil(retention * n)) depends on the same
// things but the probe heads; its memo (MakeH2oKey, a file of its own) stores what the pipeline
// reads of it: the heads' union and how many heads keep each of its tokens (Selection::kCounted),
// ~n/8 + |union| bytes a layer. A memo file stops growing at MaxFileBytes(): later decisions
// are computed in every run (a memo of the whole Mooncake trace's H2O selections would be
// ~4 GB); the entries kept are the first records', so a run of a trace prefix is all reused.
//
// A memo is a cache, never an input: a missing, stale or corrupt file is a warning and the
// decisions are computed. The file name hashes a key that names everything above plus the
// running executable (size and modification time), so a rebuilt kvtier never trusts decisions
// an older build made. Writers never modify a memo in place: a run that computes a decision
// the memo lacks writes a new file next to it (the old prefix copied, then its own records)
// and renames it over the old one at Finish(), so concurrent sweep processes and interrupted
// runs leave either the old or a complete new memo; a run that reuses everything writes nothing.
//
// File format (little-endian): "KVTSEL02", u32 key length, key bytes, u32 CRC-32 of the key;
// then entries in trace-record order, layers ascending within a record:
//   u64 ordinal (record index in the trace), u64 request id, u32 layer, u32 n, u32 k,
//   u32 CRC-32 (of the entry with this field zero), f64 similarity, u32 bits set, u32 counts,
//   u64 voted[ceil(n / 64)] (bit t set iff reused token t is in the set),
//   u8 count[counts] (H2O: the heads keeping each set token, in token order; ITF: none).
// ITF entries hold the voted set (k bits, no counts); H2O entries the heads' union (`bits` >= k
// tokens, one count >= 1 each) with k the per-head k.
//
// Usage (TraceScoreSource does this): Begin(ordinal, id) when a record enters the replay, in
// trace order; Find() / Store() per ITF layer; End(ordinal) when the record is done (any
// order: with concurrent requests they finish out of order); Finish() once after the run.
// Finish() also keeps the directory under MaxDirectoryBytes() (least recently used first).
// Not thread-safe (SimGrid actors are cooperative).

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/itf.h"
#include "core/model_spec.h"
#include "core/selection.h"
#include "core/types.h"

namespace kvtier {

// One layer's remembered decision.
struct MemoLayer {
  std::uint32_t n = 0;  // reused tokens it was made for; 0 = absent
  std::uint32_t k = 0;
  double similarity = 0;
  std::vector<std::uint64_t> voted_bits;  // ceil(n / 64) words
  std::vector<std::uint8_t> counts;       // H2O: heads keeping each set token; ITF: empty

  // Bits of a sorted token set of size k over n tokens.
  static MemoLayer FromVoted(std::int64_t n, std::int64_t k, double similarity,
                             const TokenSet& voted);
  // An H2O selection over n tokens with per-head k. REQUIRES: sel is kCounted, heads <= 255.
  static MemoLayer FromCounted(std::int64_t n, std::int64_t k, const Selection& sel);
  // The voted set, sorted ascending.
  TokenSet Voted() const;
  // The H2O selection of `heads` heads. REQUIRES: an H2O entry (counts not empty).
  Selection Counted(int heads) const;
};

struct SelectionMemoStats {
  std::uint64_t reused = 0;    // ITF layers answered from the memo
  std::uint64_t computed = 0;  // ITF layers computed (and stored)
  bool written = false;        // Finish() put a new memo in place
  std::uint64_t bytes_written = 0;  // into the new memo (0 when every decision was reused)
  std::uint64_t not_stored = 0;     // entries left out at MaxFileBytes()
};

class SelectionMemo {
 public:
  // Where memos live: $KVTIER_SELECTION_MEMO if set ("off" or "0" disables them: returns ""),
  // else ${KVTIER_CACHE:-$HOME/.cache/kvtier}/selections.
  static std::string DefaultDir();

  // Memos in a directory are kept under this many bytes, the least recently used deleted when
  // a new one is written: $KVTIER_SELECTION_MEMO_MAX_MB MiB, default 4 GiB.
  static std::uintmax_t MaxDirectoryBytes();

  // A memo file stops growing at this many bytes (its later decisions are computed in every
  // run): $KVTIER_SELECTION_MEMO_MAX_FILE_MB MiB, default 2 GiB (half the directory's default,
  // so a trace's ITF and H2O memos fit together).
  static std::uintmax_t MaxFileBytes();

  // The key of a replay: the trace's SHA-256, the replayed model's shape, the importance model
  // for records without scores, retention, probe heads, and the running executable.
  static std::string MakeKey(const std::string& trace_sha256, const ModelSpec& target,
                             const std::string& importance, double retention, int probe_heads);
  // The same for H2O's selections (every KV head's top-k). REQUIRES: target.kv_heads <= 255.
  static std::string MakeH2oKey(const std::string& trace_sha256, const ModelSpec& target,
                                const std::string& importance, double retention);

  // Opens the memo of `key` under `dir` (created if needed) for a model of `layers` layers; it
  // stops growing at `max_file_bytes`. Returns nullptr, after a warning on stderr, when `dir`
  // cannot be used.
  static std::unique_ptr<SelectionMemo> Open(const std::string& dir, const std::string& key,
                                             int layers,
                                             std::uintmax_t max_file_bytes = MaxFileBytes());
  ~SelectionMemo();  // removes an unfinished new file

  const std::string& path() const { return path_; }
  const SelectionMemoStats& stats() const { return stats_; }

  void Begin(std::uint64_t ordinal, RequestId id);
  // The remembered decision of (ordinal, layer) for `n` reused tokens, or nullptr.
  // REQUIRES: Begin(ordinal) and not yet End(ordinal).
  const MemoLayer* Find(std::uint64_t ordinal, int layer, std::int64_t n);
  // Records the decision the run used for (ordinal, layer) (`from_memo`: it came from Find).
  void Store(std::uint64_t ordinal, int layer, MemoLayer decision, bool from_memo);
  void End(std::uint64_t ordinal);
  // Completes the new memo and renames it into place when this run computed anything the old
  // one lacked; otherwise discards it. Warnings, never exceptions.
  void Finish();

 private:
  struct Record {
    RequestId id = 0;
    bool ended = false;
    std::uint64_t old_offset = 0;       // where its entries begin in the old memo
    std::vector<MemoLayer> remembered;  // by layer, from the old memo
    std::vector<MemoLayer> used;        // by layer, what this run used
  };
  SelectionMemo(std::string path, std::string key, int layers);
  void OpenReader();
  bool ReadEntry();  // into next_; false at the end or on a bad entry (reader closed)
  void ReaderFailed(const std::string& why);
  void StartWriting();
  void WriteEntry(std::uint64_t ordinal, RequestId id, int layer, const MemoLayer& m);
  void WriterFailed(const std::string& why);
  void FlushEnded();

  std::string path_;
  std::string tmp_path_;
  std::string key_;
  int layers_;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
  bool had_memo_ = false;
  bool reader_failed_ = false;
  bool writer_failed_ = false;
  bool full_ = false;  // max_file_bytes_ reached: nothing more is written
  std::uintmax_t max_file_bytes_ = MaxFileBytes();
  std::uint64_t valid_end_ = 0;  // old memo: bytes before this are read and checked
  // The next unread entry of the old memo.
  bool has_next_ = false;
  std::uint64_t next_ordinal_ = 0;
  RequestId next_id_ = 0;
  int next_layer_ = 0;
  MemoLayer next_;
  std::uint64_t entries_read_ = 0;
  std::map<std::uint64_t, Record> records_;  // in flight, by ordinal
  SelectionMemoStats stats_;
  std::vector<std::uint8_t> buf_;
};

}  // namespace kvtier
