#include "core/tiered_cache.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <memory>
#include <unordered_map>
#include <utility>

#include "core/check.h"

namespace kvtier {

// A chunk with its heap key and record, as Admit hands candidates and victims around (inside a
// tier's heap a chunk is a TierHeap::Slot). `record` is the chunk's entry in chunks_, found
// without hashing (with 1.5 x 10^5 resident chunks, hash lookups on every swap and per tier
// dominated the profile of Access).
struct TieredCache::HeapEntry {
  double priority = 0;
  std::uint64_t last_access = 0;
  ChunkId chunk;
  Bytes bytes = 0;
  ChunkRecord* record = nullptr;
};

namespace {

// Above this many resident chunks the full O(n) invariant check is amortised (see
// TieredCache::AfterCall); below it every call runs it.
constexpr std::size_t kAlwaysFullCheckBelow = 32;
// ChunkRecord::bytes is 32 bits (the record is one cache line).
constexpr Bytes kMaxChunkBytes = 0xFFFFFFFFu;

}  // namespace

// ChunkId -> record without hashing. RadixTree numbers segments 1, 2, ... and a segment's
// chunks 0, 1, ..., so a record is found by array lookups: the segment's index (directly by
// segment id below kDenseSegments, through a hash map above: only synthetic ids get there),
// then the entry of (lane = layer * 4 + kind, chunk index) in it: nothing, the pool slot of
// the chunk's record, or the statistics of a chunk that left both tiers, held in the entry
// itself (below). Records live in a pool of blocks that never move (heap entries and ChunkRefs
// point at records) and reuse freed slots. Records first made together (one layer's chunks of a
// request) sit together in the pool.
// Replaces an unordered_map<ChunkId, ChunkRecord>: with ~10^6 records every lookup missed the
// cache on the bucket array and again on the node; those lookups were 15% of sim_bench's spec
// profile (perf, 2,000 requests).
// Memory: a 64-byte record per chunk ever accessed was 65% of a Mooncake replay's heap, growing
// by ~110 KB a request (as, 400 requests: 45.6 of 70.6 MB, massif); a chunk that left both
// tiers keeps only its statistics (none under lru), and a segment whose chunks have neither
// gives its index back. Under a policy that ranks by history (score, lfu) every chunk ever
// accessed keeps them, so on the whole Mooncake trace they were most of `spec`'s 1.49 GB peak
// (heaptrack: a 4-byte index entry, grown by doubling, pointing at 24 bytes in a pool, ~30
// bytes a chunk). They now sit in the index entry itself, 16 bytes: the moving average as the
// double it is, and the access count and last tick packed in one word while they fit (22 and
// 40 bits); a chunk whose count or tick does not fit keeps its 24 bytes in a side pool, so
// every value is kept exactly. Lanes grow by a quarter, not by doubling.
class TieredCache::ChunkTable {
 public:
  ChunkTable() { blocks_.push_back(std::make_unique<ChunkRecord[]>(kBlock)); }

  // The live record of `id`, or nullptr (also when it has statistics alone).
  ChunkRecord* Find(ChunkId id) const {
    const SegmentIndex* seg = Segment(id.segment());
    if (seg == nullptr) return nullptr;
    const Entry* e = seg->Get(Lane(id), id.index());
    return e != nullptr && IsRecord(*e) ? At(RecordSlot(*e)) : nullptr;
  }
  // The statistics kept for `id` without a record into *out; false if there are none.
  bool FindCold(ChunkId id, ChunkStats* out) const {
    const SegmentIndex* seg = Segment(id.segment());
    if (seg == nullptr) return false;
    const Entry* e = seg->Get(Lane(id), id.index());
    if (e == nullptr || e->tag == 0 || IsRecord(*e)) return false;
    *out = ColdStats(*e);
    return true;
  }

  // The record of `id`, made if it had none: with the statistics kept for it (accessed) or
  // default ones (tier kSsd). Second: made now.
  std::pair<ChunkRecord*, bool> FindOrCreate(ChunkId id) {
    SegmentIndex& seg = SegmentFor(id.segment());
    Entry& e = seg.EntryFor(Lane(id), id.index());
    if (IsRecord(e)) return {At(RecordSlot(e)), false};
    const Entry cold = e;
    const std::uint32_t slot = Allocate();
    e = Entry{kRecordBit | slot, 0};
    ChunkRecord* r = At(slot);
    *r = ChunkRecord{};
    r->chunk = id;
    r->live = true;
    if (cold.tag != 0) {
      r->stats = ColdStats(cold);
      r->accessed = true;
      FreeCold(cold);
    } else {
      ++seg.used;
    }
    ++size_;
    return {r, true};
  }

  // Frees the record (its address may be reused by the next FindOrCreate) and forgets the
  // chunk.
  void Erase(ChunkRecord* r) {
    SegmentIndex& seg = SegmentFor(r->chunk.segment());
    Entry& e = seg.EntryFor(Lane(r->chunk), r->chunk.index());
    KVTIER_CHECK(IsRecord(e) && At(RecordSlot(e)) == r,
                 "ChunkTable::Erase of a record it does not hold");
    free_.push_back(RecordSlot(e));
    e = Entry{};
    r->live = false;
    --size_;
    Unused(r->chunk.segment(), seg);
  }
  // Frees the record and keeps its statistics alone.
  void MakeCold(ChunkRecord* r) {
    Entry& e = SegmentFor(r->chunk.segment()).EntryFor(Lane(r->chunk), r->chunk.index());
    KVTIER_CHECK(IsRecord(e) && At(RecordSlot(e)) == r,
                 "ChunkTable::MakeCold of a record it does not hold");
    free_.push_back(RecordSlot(e));
    e = MakeColdEntry(r->stats);
    ++cold_size_;
    r->live = false;
    --size_;
  }
  // Forgets statistics kept without a record; false if there were none.
  bool EraseCold(ChunkId id) {
    SegmentIndex* seg = MutableSegment(id.segment());
    if (seg == nullptr) return false;
    Entry* e = seg->GetMutable(Lane(id), id.index());
    if (e == nullptr || e->tag == 0 || IsRecord(*e)) return false;
    FreeCold(*e);
    *e = Entry{};
    Unused(id.segment(), *seg);
    return true;
  }

  std::size_t size() const { return size_; }            // records
  std::size_t cold_size() const { return cold_size_; }  // statistics without a record

  // Calls f(record) for every live record, in pool order.
  template <typename F>
  void ForEach(F f) const {
    for (std::uint32_t s = 1; s < next_; ++s) {
      const ChunkRecord* r = At(s);
      if (r->live) f(*r);
    }
  }

 private:
  static constexpr std::uint32_t kBlockBits = 12;
  static constexpr std::uint32_t kBlock = 1u << kBlockBits;
  static constexpr std::uint32_t kDenseSegments = 1u << 22;
  // An index entry's tag: 0 = nothing; kRecordBit | pool slot = a live record; kWideBit | i =
  // statistics in wide_[i]; otherwise packed statistics, frequency (>= 1) << kTickBits | last
  // access, with `ratio` the moving average.
  static constexpr std::uint64_t kRecordBit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t kWideBit = std::uint64_t{1} << 62;
  static constexpr int kTickBits = 40;
  static constexpr std::uint64_t kTickMask = (std::uint64_t{1} << kTickBits) - 1;
  static constexpr std::uint64_t kMaxPackedFrequency = (std::uint64_t{1} << (62 - kTickBits)) - 1;
  struct Entry {
    std::uint64_t tag = 0;
    double ratio = 0;
  };
  static_assert(sizeof(Entry) == 16);
  static bool IsRecord(const Entry& e) { return (e.tag & kRecordBit) != 0; }
  static std::uint32_t RecordSlot(const Entry& e) { return static_cast<std::uint32_t>(e.tag); }

  Entry MakeColdEntry(const ChunkStats& s) {
    if (s.frequency >= 1 && s.frequency <= kMaxPackedFrequency && s.last_access <= kTickMask) {
      return Entry{s.frequency << kTickBits | s.last_access, s.important_ratio};
    }
    std::uint32_t i;
    if (!wide_free_.empty()) {
      i = wide_free_.back();
      wide_free_.pop_back();
      wide_[i] = s;
    } else {
      KVTIER_CHECK(wide_.size() < 0xFFFFFFFFu, "ChunkTable: more than 2^32 wide statistics");
      i = static_cast<std::uint32_t>(wide_.size());
      wide_.push_back(s);
    }
    return Entry{kWideBit | i, 0};
  }
  ChunkStats ColdStats(const Entry& e) const {
    if ((e.tag & kWideBit) != 0) return wide_[static_cast<std::uint32_t>(e.tag)];
    ChunkStats s;
    s.frequency = e.tag >> kTickBits;
    s.last_access = e.tag & kTickMask;
    s.important_ratio = e.ratio;
    return s;
  }
  // The cold entry `e` is going away.
  void FreeCold(const Entry& e) {
    if ((e.tag & kWideBit) != 0) wide_free_.push_back(static_cast<std::uint32_t>(e.tag));
    --cold_size_;
  }

  // Entries of one segment's chunks: lanes[lane][index], each made on demand, so memory
  // follows the chunks a segment actually has; `used` counts the nonzero entries, and the lanes
  // are freed when it falls to 0. Every lane of a segment has the same chunks, and a layer's
  // plan touches a segment's chunks in index order, so a lane is made as wide as the widest
  // index any lane of the segment has needed (`width`), and grows past it by a quarter: only
  // the first lanes grow step by step (doubling every lane cost ~1.4x the entries).
  struct SegmentIndex {
    std::vector<std::vector<Entry>> lanes;
    std::uint32_t used = 0;
    std::uint32_t width = 0;

    const Entry* Get(std::uint32_t lane, std::uint32_t index) const {
      if (lane >= lanes.size()) return nullptr;
      const std::vector<Entry>& l = lanes[lane];
      return index < l.size() ? &l[index] : nullptr;
    }
    Entry* GetMutable(std::uint32_t lane, std::uint32_t index) {
      return const_cast<Entry*>(Get(lane, index));
    }
    Entry& EntryFor(std::uint32_t lane, std::uint32_t index) {
      if (lane >= lanes.size()) lanes.resize(std::size_t(lane) + 1);
      std::vector<Entry>& l = lanes[lane];
      if (index >= l.size()) {
        const std::size_t grown =
            std::max<std::size_t>({std::size_t(index) + 1, l.size() + l.size() / 4, 8});
        const std::size_t n = index < width ? width : grown;
        l.reserve(n);
        l.resize(n);
      }
      width = std::max(width, index + 1);
      return l[index];
    }
  };

  static std::uint32_t Lane(ChunkId id) {
    return id.layer() * 4 + static_cast<std::uint32_t>(id.kind());
  }
  const SegmentIndex* Segment(std::uint32_t seg) const {
    if (seg < kDenseSegments) return seg < dense_.size() ? &dense_[seg] : nullptr;
    auto it = sparse_.find(seg);
    return it == sparse_.end() ? nullptr : &it->second;
  }
  SegmentIndex* MutableSegment(std::uint32_t seg) {
    return const_cast<SegmentIndex*>(Segment(seg));
  }
  SegmentIndex& SegmentFor(std::uint32_t seg) {
    if (seg >= kDenseSegments) return sparse_[seg];
    if (seg >= dense_.size()) dense_.resize(std::max<std::size_t>(seg + 1, 2 * dense_.size()));
    return dense_[seg];
  }
  // An entry of `seg` went back to 0.
  void Unused(std::uint32_t id, SegmentIndex& seg) {
    KVTIER_DCHECK(seg.used > 0, "ChunkTable: a segment's entry count underflows");
    if (--seg.used != 0) return;
    if (id >= kDenseSegments) {
      sparse_.erase(id);
    } else {
      std::vector<std::vector<Entry>>().swap(seg.lanes);
      seg.width = 0;
    }
  }
  ChunkRecord* At(std::uint32_t slot) const {
    return &blocks_[slot >> kBlockBits][slot & (kBlock - 1)];
  }
  std::uint32_t Allocate() {
    if (!free_.empty()) {
      const std::uint32_t s = free_.back();
      free_.pop_back();
      return s;
    }
    KVTIER_CHECK(next_ < 0xFFFFFFFFu, "ChunkTable: more than 2^32 chunk records");
    if ((next_ >> kBlockBits) >= blocks_.size()) {
      blocks_.push_back(std::make_unique<ChunkRecord[]>(kBlock));
    }
    return next_++;
  }

  std::vector<SegmentIndex> dense_;
  std::unordered_map<std::uint32_t, SegmentIndex> sparse_;
  std::vector<std::unique_ptr<ChunkRecord[]>> blocks_;
  std::vector<std::uint32_t> free_;
  std::uint32_t next_ = 1;  // slot 0: no record
  std::size_t size_ = 0;
  std::vector<ChunkStats> wide_;  // statistics whose count or tick does not pack
  std::vector<std::uint32_t> wide_free_;
  std::size_t cold_size_ = 0;
};

// Indexed 4-ary min-heap of one tier. A resident chunk gets a *handle* (a small integer, reused)
// while it is in the tier; the heap holds 32-byte slots (key, chunk, handle, bytes) and two
// dense arrays indexed by handle say where each slot is and whose record it is, so
// Update/Remove of an arbitrary chunk are O(log n) and sifting writes only the heap and the
// position array. (The position used to live in each chunk's record: one write to a record
// scattered in memory per level sifted, and with the slots' 40 bytes and branchy key compares,
// 53% of a Mooncake replay of `as`, where nearly every access evicts from both tiers.) SPEC
// §IV-D2 keeps "two min-heaps in CPU memory ... the heaps' tops indicate the lowest-scored
// chunks".
//
// With pins (several requests in flight) a tier's entries are split into *lanes*, each an
// indexed min-heap of its own: lane 0 holds every chunk as long as no victim search has found
// it pinned by another holder; a search that meets such a chunk at the top sets it aside, into
// lane 1 + g if holder g alone pins it (g may still evict it: its own chunk), else into the
// locked lane. A search for holder h compares the tops of lane 0 and lane 1 + h. Each pinned
// chunk is thus set aside once instead of being passed over by every search (popping and
// re-pushing thousands of pinned chunks per admission made a 4-prefill run 250x slower), and
// TieredCache::ReleasePins puts set-aside chunks back where their remaining pins say. Without
// pins everything stays in lane 0.
//
// Lane 0 is a heap plus a FIFO queue whose stored keys rise from front to back: a chunk whose
// key is above the last one queued is appended (O(1)), any other goes into the heap, and the
// lane's minimum is the smaller of the queue's front and the heap's top. Under lru every
// admission and every access carries the newest tick, so nearly every chunk is queued and
// eviction is a pop from the front instead of a heap removal (those removals, and sifting
// refreshed keys down, were ~45% of `as`'s time late in the Mooncake trace). Under lfu and
// score most keys are out of order and go to the heap, which then works as before. Keys are
// unique, so the minimum, and every outcome, is the same wherever an entry sits. A chunk taken
// out of the middle of the queue leaves a dead slot (its key kept, so the order check against
// the back still holds), skipped at the front and dropped when the queue is compacted.
class TieredCache::TierHeap {
 public:
  // Children per node. Four halve the depth of a binary heap of ~10^5 chunks (each level a cache
  // miss when sifting a promoted or evicted chunk); the four children of a node share two
  // cache lines. Outcomes do not depend on the arity nor on where entries sit in the array:
  // keys are unique, so the minimum is.
  static constexpr std::size_t kArity = 4;
  // How far ahead of the queue's front FreshenQueue fetches a record.
  static constexpr std::size_t kQueueAhead = 8;

  // One resident chunk in a lane's array.
  struct Slot {
    double priority = 0;  // the stored key (<= the record's: Update)
    std::uint64_t last_access = 0;
    std::uint64_t chunk = 0;  // ChunkId::value
    std::uint32_t handle = 0;
    std::uint32_t bytes = 0;
  };
  static_assert(sizeof(Slot) == 32, "four heap slots in two cache lines");

  // The heap key is (priority, last_access, chunk id), smallest first: the lowest priority
  // leaves first, among equals the least recently accessed, then the lowest id, so the order
  // never depends on hash-map iteration or insertion history. Without branches: children in a
  // heap are in no predictable order, and the mispredicted compares were a quarter of a sift.
  static bool KeyLess(const Slot& a, const Slot& b) {
    const bool lt = a.priority < b.priority, eq = a.priority == b.priority;
    const bool la_lt = a.last_access < b.last_access, la_eq = a.last_access == b.last_access;
    return lt | (eq & (la_lt | (la_eq & (a.chunk < b.chunk))));
  }

  static constexpr std::uint8_t kLocked = 1 + kMaxHolders;  // pinned by two or more holders
  static constexpr std::uint8_t kQueue = kLocked + 1;  // lane 0's queue (record->lane; lanes_)
  static constexpr std::uint32_t kDead = 0xFFFFFFFFu;  // a queue slot whose chunk left
  static constexpr std::uint8_t LaneOf(std::uint32_t pins) {
    if (pins == 0) return 0;
    if ((pins & (pins - 1)) != 0) return kLocked;
    return std::uint8_t(1 + std::countr_zero(pins));
  }

  TierHeap(Tier tier, Bytes capacity) : tier_(tier), capacity_(capacity), lanes_(kQueue + 1) {}

  Tier tier() const { return tier_; }
  Bytes capacity() const { return capacity_; }
  Bytes used() const { return used_; }
  std::size_t size() const { return size_; }
  // The record whose slot is `s`, and whether `record`'s slot says it is (a check).
  ChunkRecord* RecordOf(const Slot& s) const { return records_[s.handle]; }
  bool Holds(const ChunkRecord* record) const {
    if (record->heap_handle >= records_.size() || records_[record->heap_handle] != record) {
      return false;
    }
    const Slot& s = lanes_[record->lane][pos_[record->heap_handle]];
    return s.handle != kDead && RecordOf(s) == record;
  }
  // Calls f(entry) for every resident chunk (its stored key).
  template <typename F>
  void ForEach(F f) const {
    for (std::size_t lane = 0; lane < lanes_.size(); ++lane) {
      const std::vector<Slot>& slots = lanes_[lane];
      for (std::size_t i = lane == kQueue ? qhead_ : 0; i < slots.size(); ++i) {
        if (slots[i].handle != kDead) f(EntryFrom(slots[i]));
      }
    }
  }

  // Into lane 0. REQUIRES: e.record is resident nowhere, used() + e.bytes <= capacity().
  void Push(const HeapEntry& e) {
    KVTIER_DCHECK(e.record != nullptr && e.record->tier == Tier::kSsd,
                  "TierHeap::Push of a resident chunk");
    used_ += e.bytes;
    ++size_;
    e.record->tier = tier_;
    std::uint32_t h;
    if (!free_handles_.empty()) {
      h = free_handles_.back();
      free_handles_.pop_back();
    } else {
      KVTIER_DCHECK(records_.size() < 0xFFFFFFFFu, "TierHeap: more than 2^32 resident chunks");
      h = std::uint32_t(records_.size());
      records_.push_back(nullptr);
      pos_.push_back(0);
    }
    records_[h] = e.record;
    e.record->heap_handle = h;
    PushTo(0, Slot{e.priority, e.last_access, e.chunk.value, h, std::uint32_t(e.bytes)});
  }

  // Removes the chunk of `record` and returns its entry, keyed with the record's current
  // priority and last access. REQUIRES: it is in this tier.
  HeapEntry Remove(ChunkRecord* record) {
    KVTIER_CHECK(record->tier == tier_, "TierHeap::Remove of a chunk that is not resident");
    const Slot s = TakeFrom(record);
    records_[s.handle] = nullptr;
    free_handles_.push_back(s.handle);
    HeapEntry out{record->priority, record->stats.last_access, record->chunk, Bytes(s.bytes),
                  record};
    used_ -= out.bytes;
    --size_;
    record->tier = Tier::kSsd;
    return out;
  }

  // Re-keys a resident chunk whose record now holds `priority` and `last_access`. A key that
  // falls is sifted up at once; a key that rises is left for later (lazy): the stored key is
  // then below the record's, which keeps the heap property, and the top is refreshed before
  // anyone reads it (FreshenTop), so the minimum seen is always the true minimum. Every access
  // raises last_access, so under LRU and LFU (and mostly under score) keys only rise: sifting
  // them down the heap at once (~17 levels, a cache miss each, for 10^5 resident chunks) was
  // 7.5% of sim_bench's spec profile, for chunks that are mostly never evicted.
  // Whether a key must be sifted is decided from the record alone, so the slot, a cache miss
  // of its own, is read only to sift: the new key (priority, last_access) is below the stored
  // one iff priority < the stored priority (record->heap_priority), since last_access only
  // rises. A priority that fell usually stays above the stored key, which lagged behind its
  // earlier rises (reading the slot to find that out was 8% of sim_bench's spec profile).
  // REQUIRES: it is in this tier; the record already holds the new priority and last access.
  // A queued chunk whose new key is above the back's moves to the back at once (lru: every
  // access); one whose key fell leaves the queue (its order would break); else it is lazy too.
  void Update(ChunkRecord* record) {
    KVTIER_CHECK(record->tier == tier_, "TierHeap::Update of a chunk that is not resident");
    if (record->lane == kQueue) {
      const Slot key{record->priority, record->stats.last_access, record->chunk.value, 0, 0};
      if (!(record->priority < record->heap_priority) &&
          !KeyLess(lanes_[kQueue].back(), key)) {
        return;  // lazy: refreshed when it reaches the front (FreshenQueue)
      }
      Slot s = TakeFrom(record);
      s.priority = key.priority;
      s.last_access = key.last_access;
      PushTo(0, s);
      return;
    }
    if (!(record->priority < record->heap_priority)) return;  // at or above the stored key
    std::vector<Slot>& heap = lanes_[record->lane];
    const std::uint32_t i = pos_[record->heap_handle];
    Slot& s = heap[i];
    s.priority = record->priority;
    s.last_access = record->stats.last_access;
    record->heap_priority = s.priority;
    SiftUp(heap, i);
  }

  // Moves a set-aside chunk to the lane its pins now call for (TieredCache::ReleasePins); a
  // chunk in lane 0 stays (it is set aside when a search meets it).
  void Rehome(ChunkRecord* record) {
    if (record->lane == 0 || record->lane == kQueue) return;
    const std::uint8_t lane = LaneOf(record->pins);
    if (lane == record->lane) return;
    const Slot s = TakeFrom(record);
    PushTo(lane, s);
  }

  // Makes room for a chunk of `bytes` with `priority` on behalf of `holder` (-1: none): pops
  // the minimum of the chunks it may evict until it fits, each popped chunk strictly below
  // `priority` (ties keep the incumbent). A chunk pinned by another holder is never taken (it
  // is set aside, see above). On success the victims, in eviction order, are in victims() and
  // out of the heap; on failure nothing changed but where pinned chunks were set aside, which
  // changes no later outcome (heap keys are unique). REQUIRES: bytes <= capacity().
  bool CollectVictims(double priority, Bytes bytes, int holder, std::uint32_t skip_pins) {
    victims_.clear();
    Bytes free = capacity_ - used_;
    const std::size_t own = holder < 0 ? 0 : std::size_t(1 + holder);
    while (free < bytes) {
      SettleTop(0, skip_pins);
      const Slot* top = Top(0);
      if (own != 0) {
        SettleTop(own, skip_pins);
        const Slot* b = Top(own);
        if (b != nullptr && (top == nullptr || KeyLess(*b, *top))) top = b;
      }
      if (top == nullptr || !(priority > top->priority)) {
        for (const HeapEntry& v : victims_) Push(v);  // roll back (into lane 0)
        victims_.clear();
        return false;
      }
      HeapEntry v = Remove(RecordOf(*top));
      free += v.bytes;
      victims_.push_back(v);
    }
    return true;
  }
  // Scratch reused across calls so the hot path does not allocate once it has grown.
  const std::vector<HeapEntry>& victims() const { return victims_; }

  // O(n) check of capacity, byte accounting, heap property and each slot's record and handle.
  void Check() const {
    KVTIER_CHECK(used_ <= capacity_, "a tier is over capacity");
    Bytes sum = 0;
    std::size_t count = 0;
    std::size_t dead = 0;
    for (std::size_t lane = 0; lane < lanes_.size(); ++lane) {
      const std::vector<Slot>& heap = lanes_[lane];
      for (std::size_t i = lane == kQueue ? qhead_ : 0; i < heap.size(); ++i) {
        const Slot& s = heap[i];
        if (lane == kQueue) {
          if (i > qhead_) KVTIER_CHECK(KeyLess(heap[i - 1], s), "the queue's keys do not rise");
          if (s.handle == kDead) {
            KVTIER_CHECK(i != qhead_, "the queue's front is a dead slot");
            ++dead;
            continue;
          }
        }
        KVTIER_CHECK(s.handle < records_.size() && pos_[s.handle] == i,
                     "a heap slot's handle does not say where it is");
        const ChunkRecord* r = records_[s.handle];
        sum += s.bytes;
        ++count;
        KVTIER_CHECK(r != nullptr && r->tier == tier_ && r->lane == lane &&
                         r->heap_handle == s.handle && r->chunk.value == s.chunk,
                     "a heap slot's record disagrees with its tier, lane, handle or chunk");
        KVTIER_CHECK(s.bytes > 0 && s.bytes <= capacity_ && s.bytes == r->bytes,
                     "a resident chunk has an impossible size");
        const Slot truth{r->priority, r->stats.last_access, s.chunk, s.handle, s.bytes};
        KVTIER_CHECK(!KeyLess(truth, s), "a heap key is above its record's (a lost decrease)");
        KVTIER_CHECK(s.priority == r->heap_priority, "a record's copy of its heap key is stale");
        if (i > 0 && lane != kQueue) {
          KVTIER_CHECK(!KeyLess(s, heap[Parent(i)]), "heap property broken");
        }
        KVTIER_CHECK(lane == 0 || lane == kQueue || r->pins != 0,
                     "an unpinned chunk was left set aside");
      }
    }
    KVTIER_CHECK(dead == qdead_, "the queue miscounts its dead slots");
    KVTIER_CHECK(sum == used_, "used bytes != sum of resident bytes");
    KVTIER_CHECK(count == size_, "a tier miscounts its chunks");
    KVTIER_CHECK(records_.size() - free_handles_.size() == size_, "a tier miscounts its handles");
  }

 private:
  HeapEntry EntryFrom(const Slot& s) const {
    return HeapEntry{s.priority, s.last_access, ChunkId{s.chunk}, Bytes(s.bytes), RecordOf(s)};
  }
  // Until the top's stored key is its record's: refresh it and sift it down. Afterwards the
  // top is the true minimum of the lane (every stored key is at most its record's).
  void FreshenTop(std::vector<Slot>& heap) {
    while (!heap.empty()) {
      ChunkRecord* r = RecordOf(heap[0]);
      if (heap[0].priority == r->priority && heap[0].last_access == r->stats.last_access) return;
      heap[0].priority = r->priority;
      heap[0].last_access = r->stats.last_access;
      r->heap_priority = heap[0].priority;
      SiftDown(heap, 0);
    }
  }
  // Freshens the lane's top and sets aside tops pinned by a holder in `skip_pins`, until its
  // top may be evicted (or the lane is empty).
  void SettleTop(std::size_t lane, std::uint32_t skip_pins) {
    std::vector<Slot>& heap = lanes_[lane];
    for (;;) {
      if (lane == 0) FreshenQueue();  // first: it may push into the heap
      FreshenTop(heap);
      const Slot* top = Top(lane);
      if (top == nullptr || (RecordOf(*top)->pins & skip_pins) == 0) return;
      ChunkRecord* r = RecordOf(*top);
      const std::uint8_t to = LaneOf(r->pins);
      // Lane 1 + h holds chunks h alone pinned when set aside; another holder's pin since then
      // locks it.
      const Slot s = TakeFrom(r);
      PushTo(to == lane ? kLocked : to, s);
    }
  }

  // The smallest stored key of a lane: in lane 0 the queue's front or the heap's top.
  const Slot* Top(std::size_t lane) const {
    const Slot* h = lanes_[lane].empty() ? nullptr : &lanes_[lane][0];
    if (lane != 0 || qhead_ == lanes_[kQueue].size()) return h;
    const Slot* q = &lanes_[kQueue][qhead_];
    return h == nullptr || KeyLess(*q, *h) ? q : h;
  }
  // Until the queue's front holds its record's key: take it out and put it back (at the back
  // if its key is now the largest, else into the heap). As FreshenTop for the heap.
  void FreshenQueue() {
    const std::vector<Slot>& q = lanes_[kQueue];
    // Reading the front's record was a cache miss per eviction (~80% of SettleTop's samples,
    // 11% of an `as` replay of the Mooncake trace, perf): records lie where their requests
    // made them. Evictions walk the queue front to back, so the record kQueueAhead slots
    // behind the front is fetched now, while this one is checked. A hint: no outcome changes.
    if (const std::size_t ahead = qhead_ + kQueueAhead; ahead < q.size()) {
      const std::uint32_t h = q[ahead].handle;
      if (h != kDead) __builtin_prefetch(records_[h]);
    }
    while (qhead_ < q.size()) {
      ChunkRecord* r = RecordOf(q[qhead_]);
      if (q[qhead_].priority == r->priority && q[qhead_].last_access == r->stats.last_access) {
        return;
      }
      Slot s = TakeFrom(r);
      s.priority = r->priority;
      s.last_access = r->stats.last_access;
      PushTo(0, s);
    }
  }
  // Drops the dead slots at the queue's front; compacts it when dead slots are most of it.
  void TidyQueue() {
    std::vector<Slot>& q = lanes_[kQueue];
    while (qhead_ < q.size() && q[qhead_].handle == kDead) {
      ++qhead_;
      --qdead_;
    }
    if (qhead_ == q.size()) {
      q.clear();
      qhead_ = 0;
      return;
    }
    const std::size_t waste = qhead_ + qdead_;
    if (waste < 1024 || 2 * waste < q.size()) return;
    std::size_t out = 0;
    for (std::size_t i = qhead_; i < q.size(); ++i) {
      if (q[i].handle == kDead) continue;
      q[out] = q[i];
      pos_[q[out].handle] = std::uint32_t(out);
      ++out;
    }
    q.resize(out);
    qhead_ = 0;
    qdead_ = 0;
  }

  // Into `lane`; into lane 0: at the queue's back if its key is above the back's, else into
  // the heap.
  void PushTo(std::size_t lane, const Slot& s) {
    if (lane == 0) {
      std::vector<Slot>& q = lanes_[kQueue];
      if (q.empty() || KeyLess(q.back(), s)) {
        ChunkRecord* r = RecordOf(s);
        r->lane = kQueue;
        r->heap_priority = s.priority;
        pos_[s.handle] = std::uint32_t(q.size());
        q.push_back(s);
        return;
      }
    }
    std::vector<Slot>& heap = lanes_[lane];
    const std::size_t i = heap.size();
    heap.push_back(s);
    ChunkRecord* r = RecordOf(s);
    r->lane = std::uint8_t(lane);
    r->heap_priority = s.priority;
    pos_[s.handle] = std::uint32_t(i);
    SiftUp(heap, i);
  }
  // Takes the record's slot out of its lane (no accounting; the handle stays the record's).
  Slot TakeFrom(ChunkRecord* record) {
    std::vector<Slot>& heap = lanes_[record->lane];
    const std::size_t i = pos_[record->heap_handle];
    const Slot out = heap[i];
    if (record->lane == kQueue) {
      heap[i].handle = kDead;  // its key stays: the back's order check still holds
      ++qdead_;
      TidyQueue();
      record->lane = 0;
      return out;
    }
    const Slot last = heap.back();
    heap.pop_back();
    if (i < heap.size()) {
      if (i == 0) {
        PopRoot(heap, last);
      } else {
        heap[i] = last;
        pos_[last.handle] = std::uint32_t(i);
        Fix(heap, i);
      }
    }
    record->lane = 0;
    return out;
  }

  static std::size_t Parent(std::size_t i) { return (i - 1) / kArity; }
  // Index of the smallest of the children [first, last) (first < last).
  static std::size_t MinChild(const std::vector<Slot>& heap, std::size_t first,
                              std::size_t last) {
    std::size_t m = first;
    for (std::size_t c = first + 1; c < last; ++c) m = KeyLess(heap[c], heap[m]) ? c : m;
    return m;
  }
  void Place(std::vector<Slot>& heap, std::size_t i, const Slot& s) {
    heap[i] = s;
    pos_[s.handle] = std::uint32_t(i);
  }
  void SiftUp(std::vector<Slot>& heap, std::size_t i) {
    const Slot s = heap[i];
    while (i > 0) {
      const std::size_t parent = Parent(i);
      if (!KeyLess(s, heap[parent])) break;
      Place(heap, i, heap[parent]);
      i = parent;
    }
    Place(heap, i, s);
  }
  void SiftDown(std::vector<Slot>& heap, std::size_t i) {
    const Slot s = heap[i];
    const std::size_t n = heap.size();
    for (;;) {
      const std::size_t first = kArity * i + 1;
      if (first >= n) break;
      const std::size_t c = MinChild(heap, first, std::min(n, first + kArity));
      if (!KeyLess(heap[c], s)) break;
      Place(heap, i, heap[c]);
      i = c;
    }
    Place(heap, i, s);
  }
  // Removes the root, `last` (already popped off the end) taking a place: the hole goes down
  // to a leaf along the smaller children, then `last` rises from there (Floyd): it came from
  // the bottom, so it rarely rises far, and each level costs the children's compares only.
  void PopRoot(std::vector<Slot>& heap, const Slot& last) {
    const std::size_t n = heap.size();
    std::size_t hole = 0;
    for (;;) {
      const std::size_t first = kArity * hole + 1;
      if (first >= n) break;
      // The next level's slots, for whichever child wins: four loads in flight instead of one
      // miss after another (the slot loads were a third of a pop).
      const std::size_t next = kArity * first + 1;
      for (std::size_t k = 0; k < kArity && next + kArity * k < n; ++k) {
        const char* p = reinterpret_cast<const char*>(&heap[next + kArity * k]);
        __builtin_prefetch(p);
        __builtin_prefetch(p + 64);
      }
      const std::size_t c = MinChild(heap, first, std::min(n, first + kArity));
      Place(heap, hole, heap[c]);
      hole = c;
    }
    while (hole > 0) {
      const std::size_t parent = Parent(hole);
      if (!KeyLess(last, heap[parent])) break;
      Place(heap, hole, heap[parent]);
      hole = parent;
    }
    Place(heap, hole, last);
  }
  void Fix(std::vector<Slot>& heap, std::size_t i) {
    if (i > 0 && KeyLess(heap[i], heap[Parent(i)])) {
      SiftUp(heap, i);
    } else {
      SiftDown(heap, i);
    }
  }

  Tier tier_;
  Bytes capacity_;
  Bytes used_ = 0;
  std::size_t size_ = 0;
  std::vector<std::vector<Slot>> lanes_;  // [0] evictable, [1 + h] holder h's, [kLocked],
                                          // [kQueue] lane 0's queue (from qhead_ on)
  std::size_t qhead_ = 0;  // the queue's front: a live slot, or the end
  std::size_t qdead_ = 0;  // dead slots at or after qhead_
  std::vector<ChunkRecord*> records_;     // by handle: the resident chunk's record
  std::vector<std::uint32_t> pos_;        // by handle: its index in its lane
  std::vector<std::uint32_t> free_handles_;
  std::vector<HeapEntry> victims_;
};

TieredCache::TieredCache(std::unique_ptr<CachePolicy> policy, const TieredCacheOptions& options)
    : policy_(std::move(policy)),
      options_(options),
      gpu_(std::make_unique<TierHeap>(Tier::kGpu, options.gpu_capacity)),
      cpu_(std::make_unique<TierHeap>(Tier::kCpu, options.cpu_capacity)),
      chunks_(std::make_unique<ChunkTable>()) {
  KVTIER_CHECK(policy_ != nullptr, "TieredCache needs a policy");
  keep_history_ = policy_->RanksByHistory();
  KVTIER_CHECK(options_.history_weight >= 0 && options_.history_weight <= 1,
               "history_weight must be in [0, 1]");
  // The pin mask lives in the record's padding: a record stays one 64-byte cache line.
  static_assert(sizeof(ChunkRecord) == 64, "ChunkRecord grew past a cache line");
}

TieredCache::~TieredCache() = default;

Tier TieredCache::Where(ChunkId chunk) const {
  const ChunkRecord* r = chunks_->Find(chunk);
  return r == nullptr ? Tier::kSsd : r->tier;
}

// Records never move and their memory is never returned, so a pointer to one can always be
// read: it is current while the record is live and holds the same chunk (a freed slot may be
// reused for another). The simulator looks up every chunk of a layer twice, one layer apart
// (Where when it plans the prefetch, Access when the layer uses it); the ref saves the second
// lookup (with hashed records: total CPU -14%, spec, perf).
Tier TieredCache::Where(ChunkId chunk, ChunkRef* ref) const {
  const ChunkRecord* r = chunks_->Find(chunk);
  ref->record = r;
  ref->chunk = chunk;
  return r == nullptr ? Tier::kSsd : r->tier;
}

TieredCache::ChunkRecord* TieredCache::Current(const ChunkRef& ref, ChunkId chunk) const {
  // const_cast: the ref came from Where() (const) but names this cache's own record.
  auto* r = const_cast<ChunkRecord*>(static_cast<const ChunkRecord*>(ref.record));
  return r != nullptr && r->live && r->chunk == chunk ? r : nullptr;
}

void TieredCache::RetireRecord(ChunkRecord* r) {
  KVTIER_DCHECK(r->tier == Tier::kSsd && r->pins == 0, "retiring a cached or pinned record");
  if (r->accessed && keep_history_) {
    chunks_->MakeCold(r);
  } else {
    chunks_->Erase(r);
  }
}

Bytes TieredCache::used(Tier tier) const {
  switch (tier) {
    case Tier::kGpu:
      return gpu_->used();
    case Tier::kCpu:
      return cpu_->used();
    case Tier::kSsd:
      return 0;
  }
  return 0;
}

Bytes TieredCache::capacity(Tier tier) const {
  switch (tier) {
    case Tier::kGpu:
      return gpu_->capacity();
    case Tier::kCpu:
      return cpu_->capacity();
    case Tier::kSsd:
      return 0;
  }
  return 0;
}

std::size_t TieredCache::resident_chunks(Tier tier) const {
  switch (tier) {
    case Tier::kGpu:
      return gpu_->size();
    case Tier::kCpu:
      return cpu_->size();
    case Tier::kSsd:
      return 0;
  }
  return 0;
}

TieredCache::Footprint TieredCache::footprint() const {
  return Footprint{chunks_->size(), chunks_->cold_size()};
}

std::optional<ChunkStats> TieredCache::Stats(ChunkId chunk) const {
  const ChunkRecord* r = chunks_->Find(chunk);
  if (r == nullptr) {
    ChunkStats s;
    if (chunks_->FindCold(chunk, &s)) return s;
    return std::nullopt;
  }
  if (!r->accessed) return std::nullopt;
  return r->stats;
}

TieredCache::TierHeap& TieredCache::HeapOf(Tier tier) {
  KVTIER_CHECK(tier != Tier::kSsd, "the SSD is not a cache tier");
  return tier == Tier::kGpu ? *gpu_ : *cpu_;
}

void TieredCache::SetHolder(int holder) {
  KVTIER_CHECK(holder >= -1 && holder < kMaxHolders, "TieredCache: pin holder out of range");
  holder_ = holder;
  skip_pins_ = holder < 0 ? ~0u : ~(1u << holder);
  if (holder >= 0 && pinned_.size() <= std::size_t(holder)) pinned_.resize(std::size_t(holder) + 1);
}

void TieredCache::PinRecord(ChunkRecord* r) {
  const std::uint32_t bit = 1u << holder_;
  if ((r->pins & bit) != 0) return;
  r->pins |= bit;
  pinned_[std::size_t(holder_)].push_back(r);
}

void TieredCache::Pin(const ChunkRef& ref) {
  if (holder_ < 0 || ref.record == nullptr) return;
  ChunkRecord* r = Current(ref, ref.chunk);
  KVTIER_CHECK(r != nullptr, "TieredCache::Pin with a stale ChunkRef");
  PinRecord(r);
}

void TieredCache::ReleasePins(int holder) {
  KVTIER_CHECK(holder >= 0 && holder < kMaxHolders, "TieredCache: pin holder out of range");
  if (std::size_t(holder) >= pinned_.size()) return;
  const std::uint32_t bit = 1u << holder;
  std::vector<ChunkRecord*>& list = pinned_[std::size_t(holder)];
  for (ChunkRecord* r : list) {
    KVTIER_DCHECK(r->live && (r->pins & bit) != 0, "a pinned record was freed or lost its pin");
    r->pins &= ~bit;
    if (r->tier != Tier::kSsd) {
      HeapOf(r->tier).Rehome(r);  // a chunk set aside for this pin goes back
    } else if (r->pins == 0) {
      RetireRecord(r);  // evicted (or never admitted) while pinned: kept for its pin until now
    }
  }
  list.clear();
  AfterCall(nullptr);
}

std::size_t TieredCache::pinned_chunks(int holder) const {
  return holder >= 0 && std::size_t(holder) < pinned_.size() ? pinned_[std::size_t(holder)].size()
                                                             : 0;
}

bool TieredCache::Pinned(ChunkId chunk) const {
  const ChunkRecord* r = chunks_->Find(chunk);
  return r != nullptr && r->pins != 0;
}

// Admits `cand` (not resident anywhere) into `target`, coming from `from`. Victims leave for
// the next tier down first (GPU -> CPU under the same rule, else dropped; CPU -> dropped), then
// the candidate's own move is appended. Nothing changes when it returns false.
bool TieredCache::Admit(const HeapEntry& cand, Tier from, Tier target,
                        std::vector<CacheMove>* moves) {
  TierHeap& heap = HeapOf(target);
  if (cand.bytes > heap.capacity()) return false;
  if (!heap.CollectVictims(cand.priority, cand.bytes, holder_, skip_pins_)) return false;
  // Index loop: heap.victims() is not touched by the CPU admissions below (other heap).
  const std::vector<HeapEntry>& victims = heap.victims();
  for (std::size_t i = 0; i < victims.size(); ++i) {
    const HeapEntry& v = victims[i];
    if (target == Tier::kGpu && Admit(v, Tier::kGpu, Tier::kCpu, moves)) continue;
    moves->push_back(CacheMove{v.chunk, target, Tier::kSsd, v.bytes});
    // Nothing below reads a victim again (a chunk demoted by an earlier victim and displaced by
    // a later one was retired in that later admission).
    if (v.record->pins == 0) RetireRecord(v.record);
  }
  heap.Push(cand);
  moves->push_back(CacheMove{cand.chunk, from, target, cand.bytes});
  return true;
}

Tier TieredCache::Access(ChunkId chunk, Bytes bytes, double important_ratio,
                         std::vector<CacheMove>* moves) {
  KVTIER_CHECK(bytes > 0 && bytes <= kMaxChunkBytes, "Access of an empty or >= 4 GiB chunk");
  KVTIER_CHECK(important_ratio >= 0 && important_ratio <= 1, "important_ratio must be in [0, 1]");
  auto [r, is_new] = chunks_->FindOrCreate(chunk);
  return AccessRecord(r, is_new, chunk, bytes, important_ratio, moves);
}

Tier TieredCache::Access(ChunkId chunk, Bytes bytes, double important_ratio,
                         std::vector<CacheMove>* moves, const ChunkRef& ref) {
  ChunkRecord* r = Current(ref, chunk);
  if (r == nullptr) return Access(chunk, bytes, important_ratio, moves);
  KVTIER_CHECK(bytes > 0 && bytes <= kMaxChunkBytes, "Access of an empty or >= 4 GiB chunk");
  KVTIER_CHECK(important_ratio >= 0 && important_ratio <= 1, "important_ratio must be in [0, 1]");
  return AccessRecord(r, false, chunk, bytes, important_ratio, moves);
}

// Access() once the record is found. REQUIRES: the arguments were checked.
Tier TieredCache::AccessRecord(ChunkRecord* r, bool is_new, ChunkId chunk, Bytes bytes,
                               double important_ratio, std::vector<CacheMove>* moves) {
  r->chunk = chunk;
  KVTIER_DCHECK(is_new || r->bytes == bytes, "a chunk changed size");
  r->bytes = std::uint32_t(bytes);
  ChunkStats& s = r->stats;
  s.frequency += 1;
  // ema <- w * ema + (1 - w) * ratio, written as an increment so that a constant ratio stays
  // exactly constant (0.8 * 0.5 + 0.2 * 0.5 is not 0.5 in binary floating point).
  if (!r->accessed) {
    s.important_ratio = important_ratio;
    r->accessed = true;
  } else {
    s.important_ratio += (1 - options_.history_weight) * (important_ratio - s.important_ratio);
  }
  s.last_access = ++tick_;
  if (holder_ >= 0) PinRecord(r);  // the request uses this chunk: no other one evicts it
  const double priority = policy_->Priority(s);
  r->priority = priority;

  const Tier was = r->tier;
  switch (r->tier) {
    case Tier::kGpu:  // in GPU -> stays
      gpu_->Update(r);
      break;
    case Tier::kCpu: {
      // Promotion is a swap: the candidate's CPU space is free for the GPU victims it displaces.
      HeapEntry cand = cpu_->Remove(r);
      cand.priority = priority;
      cand.last_access = s.last_access;
      if (!Admit(cand, Tier::kCpu, Tier::kGpu, moves)) cpu_->Push(cand);  // stays in CPU
      break;
    }
    case Tier::kSsd: {
      const HeapEntry cand{priority, s.last_access, chunk, bytes, r};
      if (!Admit(cand, Tier::kSsd, Tier::kGpu, moves)) Admit(cand, Tier::kSsd, Tier::kCpu, moves);
      break;
    }
  }
  if (r->tier == Tier::kSsd && r->pins == 0) {  // admitted nowhere: only its statistics stay
    RetireRecord(r);
    r = nullptr;
  }
  AfterCall(r);
  return was;
}

bool TieredCache::Insert(ChunkId chunk, Bytes bytes, Tier tier, std::vector<CacheMove>* moves) {
  KVTIER_CHECK(bytes > 0 && bytes <= kMaxChunkBytes, "Insert of an empty or >= 4 GiB chunk");
  KVTIER_CHECK(tier != Tier::kSsd, "Insert into the SSD: use Erase to uncache");
  auto [r, is_new] = chunks_->FindOrCreate(chunk);
  KVTIER_DCHECK(is_new || r->bytes == bytes, "a chunk changed size");
  r->bytes = std::uint32_t(bytes);
  const Tier now = r->tier;
  if (now == tier) return true;
  r->priority = policy_->Priority(r->stats);
  HeapEntry cand{r->priority, r->stats.last_access, chunk, bytes, r};
  if (now != Tier::kSsd) cand = HeapOf(now).Remove(r);
  const bool placed = Admit(cand, now, tier, moves);
  if (!placed && now != Tier::kSsd) HeapOf(now).Push(cand);  // back where it was
  if (!placed && now == Tier::kSsd && r->pins == 0) {
    RetireRecord(r);  // its statistics, if any, stay
    r = nullptr;
  }
  AfterCall(r);
  return placed;
}

void TieredCache::Inherit(ChunkId chunk, Bytes bytes, const ChunkStats& stats) {
  KVTIER_CHECK(bytes > 0 && bytes <= kMaxChunkBytes, "Inherit of an empty or >= 4 GiB chunk");
  KVTIER_CHECK(stats.last_access <= tick_, "Inherit: a last access this cache never handed out");
  auto [r, is_new] = chunks_->FindOrCreate(chunk);
  KVTIER_CHECK(is_new, "Inherit of a chunk the cache already knows");
  r->bytes = std::uint32_t(bytes);
  r->stats = stats;
  r->accessed = true;
  r->priority = policy_->Priority(stats);
  RetireRecord(r);  // in no tier: only its statistics stay (none under lru)
  AfterCall(nullptr);
}

void TieredCache::Erase(ChunkId chunk, std::vector<CacheMove>* moves) {
  ChunkRecord* r = chunks_->Find(chunk);
  if (r == nullptr) {
    if (chunks_->EraseCold(chunk)) AfterCall(nullptr);
    return;
  }
  KVTIER_CHECK(r->pins == 0, "Erase of a chunk an in-flight request has pinned");
  if (r->tier != Tier::kSsd) {
    const Tier now = r->tier;
    HeapEntry e = HeapOf(now).Remove(r);
    moves->push_back(CacheMove{chunk, now, Tier::kSsd, e.bytes});
  }
  chunks_->Erase(r);
  AfterCall(nullptr);
}

// The full check is O(n); the simulator calls Access ~10^6 times a second on caches of ~10^5
// chunks, so a full check per call would make every call O(n). Every call checks capacities
// and the touched chunk; the full check (O(records)) runs on every call while the caches are
// small (all unit and contract tests) and otherwise once per 16 x `records` calls (amortised
// O(1); once per `records` calls it was ~5% of sim_bench's spec profile, mostly cache misses,
// and once per 4 x `records` still 6% once the rest of Access got faster).
inline void TieredCache::AfterCall(const ChunkRecord* touched) {
  KVTIER_DCHECK(gpu_->used() <= gpu_->capacity(), "gpu tier over capacity");
  KVTIER_DCHECK(cpu_->used() <= cpu_->capacity(), "cpu tier over capacity");
#if defined(KVTIER_ENABLE_DCHECK)
  // The touched chunk's heap slot is a cache miss of its own once heaps hold ~10^5 entries
  // (7% of sim_bench's spec profile when read on every call), so it is read on every 64th
  // call; the full check below covers every entry anyway. The rare work is out of line so
  // that the common path inlines into Access.
  const bool sample = touched != nullptr && touched->tier != Tier::kSsd && (tick_ & 63) == 0;
  const std::size_t resident = gpu_->size() + cpu_->size();
  const bool full =
      ++calls_since_full_check_ >= 16 * chunks_->size() || resident < kAlwaysFullCheckBelow;
  if (sample || full) [[unlikely]] SampledChecks(sample ? touched : nullptr, full);
#endif
}

void TieredCache::SampledChecks(const ChunkRecord* touched, bool full) {
  if (touched != nullptr) {
    const TierHeap& heap = touched->tier == Tier::kGpu ? *gpu_ : *cpu_;
    KVTIER_CHECK(heap.Holds(touched), "the touched chunk's record disagrees with its heap");
  }
  if (full) {
    calls_since_full_check_ = 0;
    CheckInvariants();
  }
}

void TieredCache::CheckInvariants() const {
  gpu_->Check();
  cpu_->Check();
  // Index agreement and exclusivity: every heap entry's record is the map's record of that
  // chunk (Check: the record names this heap and slot), and the records naming each tier are
  // exactly as many as the heap's entries, so no chunk is in two heaps or in a heap twice.
  std::size_t in_gpu = 0, in_cpu = 0, live = 0;
  chunks_->ForEach([&](const ChunkRecord& record) {
    ++live;
    in_gpu += record.tier == Tier::kGpu;
    in_cpu += record.tier == Tier::kCpu;
    KVTIER_CHECK(record.tier != Tier::kSsd || record.pins != 0,
                 "a record of a chunk neither cached nor pinned was kept");
    KVTIER_CHECK(chunks_->Find(record.chunk) == &record, "a record is not where its id says");
  });
  KVTIER_CHECK(live == chunks_->size(), "the chunk table miscounts its records");
  KVTIER_CHECK(in_gpu == gpu_->size() && in_cpu == cpu_->size(),
               "records and heaps disagree on how many chunks are cached");
  for (const TierHeap* heap : {gpu_.get(), cpu_.get()}) {
    heap->ForEach([&](const HeapEntry& e) {
      KVTIER_CHECK(chunks_->Find(e.chunk) == e.record,
                   "a heap entry points at another chunk's record");
      // The record's priority is what the policy says of its statistics (the heap key may lag
      // below it: TierHeap::Update; Check verifies it never lies above).
      KVTIER_CHECK(e.record->priority == policy_->Priority(e.record->stats),
                   "a resident chunk's priority is stale");
    });
  }
}

}  // namespace kvtier
