#pragma once
// TieredCache: the GPU and CPU prefix-KV caches above the SSD, which holds every chunk. The
// two caches are exclusive (a chunk is in at most one of them) and bounded in bytes. One
// CachePolicy ranks chunks in both tiers; each tier is an indexed min-heap on that priority,
// so its top is the chunk to give up first (SPEC §IV-D2, "Dual-cache replacement").
//
// Access rules (SPEC §IV-D2), applied by Access() after updating the chunk's statistics:
//   in GPU  -> stays.
//   in CPU  -> promoted to GPU if the GPU has room, or if its priority beats the GPU minimum
//              (the GPU victims are demoted to the CPU); otherwise stays in the CPU.
//   on SSD  -> (the caller has read it into CPU memory) admitted to the GPU under the same rule,
//              else admitted to the CPU if the CPU has room or it beats the CPU minimum,
//              else it stays on the SSD only.
// Victims leave for the next tier down: GPU -> CPU (if room or it beats the CPU minimum,
// else dropped), CPU -> dropped (the SSD copy remains). "Beats" means a strictly higher
// priority: ties keep the incumbent. Victims are taken from the heap top until the candidate
// fits; if the candidate does not beat one of them, nothing is evicted and it is not admitted.
// Among equal priorities the heap gives up the least recently accessed chunk, then the lowest
// chunk id. A chunk larger than a tier's capacity never enters that tier. Everything is
// deterministic: the same call sequence gives the same moves.
//
// Order of the moves one call appends: every eviction comes before the admission it makes room
// for (a GPU victim's own CPU evictions come before its GPU -> CPU move), and the accessed
// chunk's move comes last. A CPU -> GPU promotion is a swap: the promoted chunk's CPU bytes are
// free for the GPU victims it displaces. A chunk may appear twice in one call's moves (a GPU
// victim demoted to the CPU, then displaced there by a later victim); its last move is where it
// is.
//
// Memory follows what can still matter: a chunk that is in neither tier and not pinned keeps
// only its statistics (16 bytes in its index entry, exactly: tiered_cache.cc, ChunkTable), and
// none at all under a policy that does not rank by history (lru); a segment's index is freed
// when none of its chunks has either.
//
// Not thread-safe. Access is O(log n) with one direct-indexed lookup (no hashing), and O(1)
// when keys enter in rising order (lru: each tier's heap is paired with a FIFO queue for them,
// tiered_cache.cc TierHeap); a heap key that rises is re-sifted lazily, when it reaches the
// top (TierHeap::Update), which changes no outcome. Capacities are checked with KVTIER_DCHECK after every call and the touched chunk's
// heap slot after every 64th; the full CheckInvariants() (O(n)) runs after every call while
// fewer than 32 chunks are resident, and otherwise once per 16 x `known chunks` calls
// (amortised O(1)), so the checks stay on in every build.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/cache_policy.h"
#include "core/types.h"

namespace kvtier {

struct TieredCacheOptions {
  Bytes gpu_capacity = 0;
  Bytes cpu_capacity = 0;
  // Weight of the history in the moving average of the important ratio:
  // ema <- history_weight * ema + (1 - history_weight) * ratio  (first access: ema = ratio).
  double history_weight = 0.8;
};

// One residency change made by Access(): `chunk` moved from `from` to `to`. to == kSsd means
// the chunk left the caches (its SSD copy remains); from == kSsd means it was admitted.
struct CacheMove {
  ChunkId chunk;
  Tier from = Tier::kSsd;
  Tier to = Tier::kSsd;
  Bytes bytes = 0;
  friend bool operator==(const CacheMove&, const CacheMove&) = default;
};

class TieredCache {
 public:
  TieredCache(std::unique_ptr<CachePolicy> policy, const TieredCacheOptions& options);
  ~TieredCache();
  TieredCache(const TieredCache&) = delete;
  TieredCache& operator=(const TieredCache&) = delete;

  // Where `chunk` is now: kGpu, kCpu, or kSsd (not cached).
  Tier Where(ChunkId chunk) const;

  // A remembered lookup. Where(chunk, &ref) fills it; Access(chunk, ..., ref) with the same
  // chunk then skips the lookup if the ref is still current, i.e. the record it names still
  // holds that chunk (records are never moved or returned to the system, only reused);
  // otherwise it looks the chunk up as usual. A ref never changes what a call does, only how
  // fast it finds the chunk. The simulator plans a layer's prefetch (Where) one layer before it
  // uses the chunks (Access).
  struct ChunkRef {
    const void* record = nullptr;  // nullptr: the chunk was not cached (or pinned)
    ChunkId chunk;
  };
  Tier Where(ChunkId chunk, ChunkRef* ref) const;

  // Records one access to `chunk` (of `bytes`) that used `important_ratio` (in [0, 1]) of its
  // rows, then applies the access rules above. Appends the residency changes, in the order
  // they happen, to *moves (does not clear it). Returns where the chunk was before the access
  // (what Where() said just before the call), so a caller that needs both asks once.
  // REQUIRES: bytes > 0; the same chunk always has the same bytes.
  Tier Access(ChunkId chunk, Bytes bytes, double important_ratio, std::vector<CacheMove>* moves);
  // The same, with a ChunkRef that Where(chunk, &ref) filled.
  Tier Access(ChunkId chunk, Bytes bytes, double important_ratio, std::vector<CacheMove>* moves,
              const ChunkRef& ref);

  // Places `chunk` in `tier` without an access (pre-warming, storing new prefix KV), if it
  // fits after the usual victim rules. Returns false when it was not placed. Appends moves.
  // The chunk competes with its current priority: a never-accessed chunk has the priority of
  // an empty ChunkStats (0 for every policy), so it only takes free room. Returns true with no
  // move if it is already in `tier`; a chunk cached in the other tier moves if the rules allow,
  // else stays. Does not record an access. REQUIRES: bytes > 0, tier != kSsd.
  bool Insert(ChunkId chunk, Bytes bytes, Tier tier, std::vector<CacheMove>* moves);

  // Gives `chunk`, which the cache knows nothing of, the statistics `stats` (a repacked chunk's,
  // inherited from the chunks its rows came from: InheritStats, core/cache_policy.h), as if it
  // had been accessed with them: the policy ranks it by them (an Insert then places it with
  // that priority) and its next Access continues from them. Places nothing; under a policy that
  // does not rank by history (lru) nothing is kept, as for any chunk in no tier.
  // REQUIRES: bytes > 0; the chunk has no record (never accessed or inserted since its last
  // Erase); stats.last_access is a tick this cache has handed out (<= its current tick).
  void Inherit(ChunkId chunk, Bytes bytes, const ChunkStats& stats);

  // Removes `chunk` from the caches and forgets its statistics (its segment was repacked).
  // Appends a move to kSsd if it was cached.
  void Erase(ChunkId chunk, std::vector<CacheMove>* moves);

  Bytes used(Tier tier) const;
  Bytes capacity(Tier tier) const;
  std::size_t resident_chunks(Tier tier) const;
  const CachePolicy& policy() const { return *policy_; }
  // What the cache holds memory for: records (cached or pinned chunks) and statistics kept
  // without a record (chunks that left both tiers, under a policy that ranks by history).
  struct Footprint {
    std::size_t records = 0;
    std::size_t statistics = 0;
  };
  Footprint footprint() const;
  // Statistics of `chunk`, or none if it was never accessed (or, under a policy that does not
  // rank by history, if it is no longer cached or pinned).
  std::optional<ChunkStats> Stats(ChunkId chunk) const;

  // Pins, for callers that serve several requests at once (core/pipeline.h with
  // max_in_flight > 1). A *holder* is one in-flight request, numbered 0..kMaxHolders-1. After
  // SetHolder(h), every Access() pins its chunk for h, and Pin() pins a looked-up chunk for h;
  // victim selection (Access, Insert) then skips chunks pinned by any holder other than h, so a
  // request never loses a chunk it has decided to use to a concurrent one, while it still
  // evicts its own earlier chunks exactly as a lone request would. A candidate that finds no
  // unpinned victim it beats is not admitted (the usual failed admission). With no holder set
  // (-1, the default) nothing is pinned and every pinned chunk is skipped. A pinned chunk's
  // record lives until ReleasePins(h) of its last holder. Pins never change which chunk a call
  // with no pins outstanding picks.
  static constexpr int kMaxHolders = 32;
  // REQUIRES: -1 <= holder < kMaxHolders.
  void SetHolder(int holder);
  int holder() const { return holder_; }
  // Pins the chunk `ref` names (filled by Where(chunk, &ref), no call but Pin since) for the
  // current holder; no-op without a holder or when the chunk was not cached.
  void Pin(const ChunkRef& ref);
  // Drops every pin of `holder` (its request is done with its chunks).
  void ReleasePins(int holder);
  // Chunks `holder` has pinned (distinct), and whether `chunk` is pinned by anyone.
  std::size_t pinned_chunks(int holder) const;
  bool Pinned(ChunkId chunk) const;

  // Verifies capacity, exclusivity and heap/index agreement; aborts with a message if broken.
  void CheckInvariants() const;

 private:
  // Everything known about a cached or pinned chunk: one lookup per call finds its statistics,
  // its tier and heap slot (the heaps index chunks through these records, whose addresses
  // ChunkTable keeps stable). A record exists while the chunk is cached or pinned (or during a
  // call); then only its statistics are kept (ChunkTable), if the policy ranks by history.
  // `accessed` is false for a chunk only ever placed by Insert.
  struct ChunkRecord {
    ChunkId chunk;
    ChunkStats stats;
    double priority = 0;  // the policy's priority of `stats`, kept current
    bool accessed = false;
    bool live = false;  // false: a free slot of the ChunkTable
    Tier tier = Tier::kSsd;
    std::uint8_t lane = 0;   // which of its tier's heaps holds it (tiered_cache.cc, TierHeap)
    std::uint32_t pins = 0;  // bit h: pinned by holder h (lane and pins sit in padding: 64 B)
    // While cached: the priority its heap entry is keyed with (<= priority, TierHeap::Update),
    // so deciding whether a falling priority must be sifted reads no heap entry.
    double heap_priority = 0;
    std::uint32_t heap_handle = 0;  // its handle in the heap of `tier` (GPU or CPU only)
    std::uint32_t bytes = 0;     // < 4 GiB (checked by Access and Insert)
  };
  class ChunkTable;  // ChunkId -> record, indexed directly (tiered_cache.cc)
  struct HeapEntry;  // a resident chunk and its heap key (tiered_cache.cc)
  class TierHeap;    // indexed binary min-heap of one tier (tiered_cache.cc)

  TierHeap& HeapOf(Tier tier);
  // Admits `cand` (resident nowhere) into `target` after moving the victims down; false, with
  // nothing changed, when it does not fit or does not beat every victim it would need.
  bool Admit(const HeapEntry& cand, Tier from, Tier target, std::vector<CacheMove>* moves);
  // A record that is neither cached nor pinned gives way to its statistics alone (if they were
  // ever made, and the policy ranks by history), or to nothing.
  // REQUIRES: r->tier == kSsd, r->pins == 0.
  void RetireRecord(ChunkRecord* r);
  void PinRecord(ChunkRecord* r);
  // KVTIER_DCHECK of the invariants (see above); `touched` is the call's chunk, or nullptr.
  void AfterCall(const ChunkRecord* touched);
  [[gnu::noinline]] void SampledChecks(const ChunkRecord* touched, bool full);

  std::unique_ptr<CachePolicy> policy_;
  TieredCacheOptions options_;
  std::unique_ptr<TierHeap> gpu_;
  std::unique_ptr<TierHeap> cpu_;
  // Access with the record found (created if null) and whether it was just created.
  Tier AccessRecord(ChunkRecord* r, bool is_new, ChunkId chunk, Bytes bytes,
                    double important_ratio, std::vector<CacheMove>* moves);
  // The record a ref names, if it still holds `chunk`; else nullptr.
  ChunkRecord* Current(const ChunkRef& ref, ChunkId chunk) const;

  bool keep_history_ = true;  // policy_->RanksByHistory()
  std::unique_ptr<ChunkTable> chunks_;
  std::uint64_t tick_ = 0;
  std::size_t calls_since_full_check_ = 0;
  int holder_ = -1;
  std::uint32_t skip_pins_ = ~0u;  // victim selection skips records with (pins & skip_pins_)
  std::vector<std::vector<ChunkRecord*>> pinned_;  // per holder, its pinned records
};

}  // namespace kvtier
