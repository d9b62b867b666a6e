#include "core/tiered_cache.h"

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>

#include "core/check.h"

namespace kvtier {

// One resident chunk and its heap key.
struct TieredCache::HeapEntry {
  double priority = 0;
  std::uint64_t last_access = 0;
  ChunkId chunk;
  Bytes bytes = 0;
};

namespace {

// Above this many resident chunks the full O(n) invariant check is amortised (see
// TieredCache::AfterCall); below it every call runs it.
constexpr std::size_t kAlwaysFullCheckBelow = 32;

}  // namespace

// Indexed binary min-heap of one tier: heap_ holds the entries, pos_ maps a chunk to its slot,
// so Update/Remove of an arbitrary chunk are O(log n). SPEC §IV-D2 keeps "two min-heaps in CPU
// memory ... the heaps' tops indicate the lowest-scored chunks".
class TieredCache::TierHeap {
 public:
  // The heap key is (priority, last_access, chunk id), smallest first: the lowest priority
  // leaves first, among equals the least recently accessed, then the lowest id, so the order
  // never depends on hash-map iteration or insertion history.
  static bool KeyLess(const HeapEntry& a, const HeapEntry& b) {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.last_access != b.last_access) return a.last_access < b.last_access;
    return a.chunk.value < b.chunk.value;
  }

  TierHeap(Tier tier, Bytes capacity) : tier_(tier), capacity_(capacity) {}

  Tier tier() const { return tier_; }
  Bytes capacity() const { return capacity_; }
  Bytes used() const { return used_; }
  std::size_t size() const { return heap_.size(); }
  bool Contains(ChunkId chunk) const { return pos_.count(chunk) != 0; }

  const HeapEntry* Find(ChunkId chunk) const {
    auto it = pos_.find(chunk);
    return it == pos_.end() ? nullptr : &heap_[it->second];
  }

  // REQUIRES: !Contains(e.chunk), used() + e.bytes <= capacity().
  void Push(const HeapEntry& e) {
    std::size_t i = heap_.size();
    heap_.push_back(e);
    pos_[e.chunk] = i;
    used_ += e.bytes;
    SiftUp(i);
  }

  // Removes `chunk` and returns its entry. REQUIRES: Contains(chunk).
  HeapEntry Remove(ChunkId chunk) {
    auto it = pos_.find(chunk);
    KVTIER_CHECK(it != pos_.end(), "TierHeap::Remove of a chunk that is not resident");
    std::size_t i = it->second;
    pos_.erase(it);
    HeapEntry out = heap_[i];
    used_ -= out.bytes;
    std::size_t last = heap_.size() - 1;
    if (i != last) {
      heap_[i] = heap_[last];
      pos_[heap_[i].chunk] = i;
      heap_.pop_back();
      Fix(i);
    } else {
      heap_.pop_back();
    }
    return out;
  }

  // Re-keys a resident chunk. REQUIRES: Contains(chunk).
  void Update(ChunkId chunk, double priority, std::uint64_t last_access) {
    std::size_t i = pos_.at(chunk);
    heap_[i].priority = priority;
    heap_[i].last_access = last_access;
    Fix(i);
  }

  // Makes room for a chunk of `bytes` with `priority`: pops the minimum until it fits, each
  // popped chunk strictly below `priority` (ties keep the incumbent). On success the victims,
  // in eviction order, are in victims() and out of the heap; on failure nothing changed.
  // REQUIRES: bytes <= capacity().
  bool CollectVictims(double priority, Bytes bytes) {
    victims_.clear();
    Bytes free = capacity_ - used_;
    while (free < bytes) {
      if (heap_.empty() || !(priority > heap_[0].priority)) {
        for (const HeapEntry& v : victims_) Push(v);  // roll back
        victims_.clear();
        return false;
      }
      HeapEntry v = Remove(heap_[0].chunk);
      free += v.bytes;
      victims_.push_back(v);
    }
    return true;
  }
  // Scratch reused across calls so the hot path does not allocate once it has grown.
  const std::vector<HeapEntry>& victims() const { return victims_; }

  // Full O(n) check of capacity, byte accounting, heap property and index agreement.
  void Check() const {
    const std::string name(TierName(tier_));
    KVTIER_CHECK(used_ <= capacity_, (name + " tier over capacity").c_str());
    KVTIER_CHECK(pos_.size() == heap_.size(), (name + " index size != heap size").c_str());
    Bytes sum = 0;
    for (std::size_t i = 0; i < heap_.size(); ++i) {
      sum += heap_[i].bytes;
      auto it = pos_.find(heap_[i].chunk);
      KVTIER_CHECK(it != pos_.end() && it->second == i,
                   (name + " index disagrees with heap slot").c_str());
      if (i > 0) {
        KVTIER_CHECK(!KeyLess(heap_[i], heap_[(i - 1) / 2]),
                     (name + " heap property broken").c_str());
      }
      KVTIER_CHECK(heap_[i].bytes > 0 && heap_[i].bytes <= capacity_,
                   (name + " resident chunk has impossible size").c_str());
    }
    KVTIER_CHECK(sum == used_, (name + " used bytes != sum of resident bytes").c_str());
  }

  const std::vector<HeapEntry>& entries() const { return heap_; }

 private:
  void Swap(std::size_t a, std::size_t b) {
    std::swap(heap_[a], heap_[b]);
    pos_[heap_[a].chunk] = a;
    pos_[heap_[b].chunk] = b;
  }
  void SiftUp(std::size_t i) {
    while (i > 0) {
      std::size_t parent = (i - 1) / 2;
      if (!KeyLess(heap_[i], heap_[parent])) break;
      Swap(i, parent);
      i = parent;
    }
  }
  void SiftDown(std::size_t i) {
    const std::size_t n = heap_.size();
    for (;;) {
      std::size_t smallest = i;
      std::size_t l = 2 * i + 1;
      std::size_t r = l + 1;
      if (l < n && KeyLess(heap_[l], heap_[smallest])) smallest = l;
      if (r < n && KeyLess(heap_[r], heap_[smallest])) smallest = r;
      if (smallest == i) break;
      Swap(i, smallest);
      i = smallest;
    }
  }
  void Fix(std::size_t i) {
    if (i > 0 && KeyLess(heap_[i], heap_[(i - 1) / 2])) {
      SiftUp(i);
    } else {
      SiftDown(i);
    }
  }

  Tier tier_;
  Bytes capacity_;
  Bytes used_ = 0;
  std::vector<HeapEntry> heap_;
  std::unordered_map<ChunkId, std::size_t> pos_;
  std::vector<HeapEntry> victims_;
};

TieredCache::TieredCache(std::unique_ptr<CachePolicy> policy, const TieredCacheOptions& options)
    : policy_(std::move(policy)),
      options_(options),
      gpu_(std::make_unique<TierHeap>(Tier::kGpu, options.gpu_capacity)),
      cpu_(std::make_unique<TierHeap>(Tier::kCpu, options.cpu_capacity)) {
  KVTIER_CHECK(policy_ != nullptr, "TieredCache needs a policy");
  KVTIER_CHECK(options_.history_weight >= 0 && options_.history_weight <= 1,
               "history_weight must be in [0, 1]");
}

TieredCache::~TieredCache() = default;

Tier TieredCache::Where(ChunkId chunk) const {
  if (gpu_->Contains(chunk)) return Tier::kGpu;
  if (cpu_->Contains(chunk)) return Tier::kCpu;
  return Tier::kSsd;
}

Bytes TieredCache::used(Tier tier) const {
  switch (tier) {
    case Tier::kGpu: return gpu_->used();
    case Tier::kCpu: return cpu_->used();
    case Tier::kSsd: return 0;
  }
  return 0;
}

Bytes TieredCache::capacity(Tier tier) const {
  switch (tier) {
    case Tier::kGpu: return gpu_->capacity();
    case Tier::kCpu: return cpu_->capacity();
    case Tier::kSsd: return 0;
  }
  return 0;
}

std::size_t TieredCache::resident_chunks(Tier tier) const {
  switch (tier) {
    case Tier::kGpu: return gpu_->size();
    case Tier::kCpu: return cpu_->size();
    case Tier::kSsd: return 0;
  }
  return 0;
}

const ChunkStats* TieredCache::Stats(ChunkId chunk) const {
  auto it = stats_.find(chunk);
  return it == stats_.end() ? nullptr : &it->second;
}

TieredCache::TierHeap& TieredCache::HeapOf(Tier tier) {
  KVTIER_CHECK(tier != Tier::kSsd, "the SSD is not a cache tier");
  return tier == Tier::kGpu ? *gpu_ : *cpu_;
}

// Admits `cand` (not resident anywhere) into `target`, coming from `from`. Victims leave for
// the next tier down first (GPU -> CPU under the same rule, else dropped; CPU -> dropped), then
// the candidate's own move is appended. Nothing changes when it returns false.
bool TieredCache::Admit(const HeapEntry& cand, Tier from, Tier target,
                        std::vector<CacheMove>* moves) {
  TierHeap& heap = HeapOf(target);
  if (cand.bytes > heap.capacity()) return false;
  if (!heap.CollectVictims(cand.priority, cand.bytes)) return false;
  // Index loop: heap.victims() is not touched by the CPU admissions below (other heap).
  const std::vector<HeapEntry>& victims = heap.victims();
  for (std::size_t i = 0; i < victims.size(); ++i) {
    const HeapEntry& v = victims[i];
    if (target == Tier::kGpu) {
      if (!Admit(v, Tier::kGpu, Tier::kCpu, moves)) {
        moves->push_back(CacheMove{v.chunk, Tier::kGpu, Tier::kSsd, v.bytes});
      }
    } else {
      moves->push_back(CacheMove{v.chunk, Tier::kCpu, Tier::kSsd, v.bytes});
    }
  }
  heap.Push(cand);
  moves->push_back(CacheMove{cand.chunk, from, target, cand.bytes});
  return true;
}

void TieredCache::Access(ChunkId chunk, Bytes bytes, double important_ratio,
                         std::vector<CacheMove>* moves) {
  KVTIER_CHECK(bytes > 0, "Access of an empty chunk");
  KVTIER_CHECK(important_ratio >= 0 && important_ratio <= 1,
               "important_ratio must be in [0, 1]");
  ChunkStats& s = stats_[chunk];
  s.frequency += 1;
  // ema <- w * ema + (1 - w) * ratio, written as an increment so that a constant ratio stays
  // exactly constant (0.8 * 0.5 + 0.2 * 0.5 is not 0.5 in binary floating point).
  if (s.frequency == 1) {
    s.important_ratio = important_ratio;
  } else {
    s.important_ratio += (1 - options_.history_weight) * (important_ratio - s.important_ratio);
  }
  s.last_access = ++tick_;
  const double priority = policy_->Priority(s);

  if (const HeapEntry* e = gpu_->Find(chunk)) {
    KVTIER_DCHECK(e->bytes == bytes, "a chunk changed size");
    gpu_->Update(chunk, priority, s.last_access);  // in GPU -> stays
  } else if (const HeapEntry* c = cpu_->Find(chunk)) {
    KVTIER_DCHECK(c->bytes == bytes, "a chunk changed size");
    // Promotion is a swap: the candidate's CPU space is free for the GPU victims it displaces.
    HeapEntry cand = cpu_->Remove(chunk);
    cand.priority = priority;
    cand.last_access = s.last_access;
    if (!Admit(cand, Tier::kCpu, Tier::kGpu, moves)) cpu_->Push(cand);  // stays in CPU
  } else {
    HeapEntry cand{priority, s.last_access, chunk, bytes};
    if (!Admit(cand, Tier::kSsd, Tier::kGpu, moves)) Admit(cand, Tier::kSsd, Tier::kCpu, moves);
  }
  AfterCall(chunk);
}

bool TieredCache::Insert(ChunkId chunk, Bytes bytes, Tier tier, std::vector<CacheMove>* moves) {
  KVTIER_CHECK(bytes > 0, "Insert of an empty chunk");
  KVTIER_CHECK(tier != Tier::kSsd, "Insert into the SSD: use Erase to uncache");
  const Tier now = Where(chunk);
  if (now == tier) return true;
  auto it = stats_.find(chunk);
  const ChunkStats& s = it == stats_.end() ? ChunkStats{} : it->second;
  HeapEntry cand{policy_->Priority(s), s.last_access, chunk, bytes};
  if (now != Tier::kSsd) {
    cand = HeapOf(now).Remove(chunk);
    KVTIER_DCHECK(cand.bytes == bytes, "a chunk changed size");
  }
  const bool placed = Admit(cand, now, tier, moves);
  if (!placed && now != Tier::kSsd) HeapOf(now).Push(cand);  // back where it was
  AfterCall(chunk);
  return placed;
}

void TieredCache::Erase(ChunkId chunk, std::vector<CacheMove>* moves) {
  const Tier now = Where(chunk);
  if (now != Tier::kSsd) {
    HeapEntry e = HeapOf(now).Remove(chunk);
    moves->push_back(CacheMove{chunk, now, Tier::kSsd, e.bytes});
  }
  stats_.erase(chunk);
  AfterCall(chunk);
}

// The full check is O(n); the simulator calls Access ~10^6 times a second on caches of ~10^5
// chunks, so a full check per call would make every call O(n). Every call checks capacities
// and the touched chunk; the full check runs on every call while the caches are small (all unit
// and contract tests) and otherwise once per `resident chunks` calls (amortised O(1)).
void TieredCache::AfterCall(ChunkId touched) {
  KVTIER_DCHECK(gpu_->used() <= gpu_->capacity(), "gpu tier over capacity");
  KVTIER_DCHECK(cpu_->used() <= cpu_->capacity(), "cpu tier over capacity");
  KVTIER_DCHECK(!(gpu_->Contains(touched) && cpu_->Contains(touched)),
                "a chunk is in both the GPU and the CPU cache");
  const std::size_t resident = gpu_->size() + cpu_->size();
  if (++calls_since_full_check_ >= resident || resident < kAlwaysFullCheckBelow) {
    calls_since_full_check_ = 0;
#if defined(KVTIER_ENABLE_DCHECK)
    CheckInvariants();
#endif
  }
}

void TieredCache::CheckInvariants() const {
  gpu_->Check();
  cpu_->Check();
  const TierHeap& smaller = gpu_->size() <= cpu_->size() ? *gpu_ : *cpu_;
  const TierHeap& larger = &smaller == gpu_.get() ? *cpu_ : *gpu_;
  for (const HeapEntry& e : smaller.entries()) {
    KVTIER_CHECK(!larger.Contains(e.chunk), "a chunk is in both the GPU and the CPU cache");
  }
  // Keys are not stale: each resident's priority is what the policy says of its statistics.
  for (const TierHeap* heap : {gpu_.get(), cpu_.get()}) {
    for (const HeapEntry& e : heap->entries()) {
      auto it = stats_.find(e.chunk);
      const ChunkStats& s = it == stats_.end() ? ChunkStats{} : it->second;
      KVTIER_CHECK(e.priority == policy_->Priority(s) && e.last_access == s.last_access,
                   "a resident chunk's heap key is stale");
    }
  }
}

}  // namespace kvtier
