#include "core/radix_tree.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>

#include "core/check.h"

namespace kvtier {

// ---- Segment -------------------------------------------------------------------------------

const Segment::Pack& Segment::PackOf(std::int64_t offset) const {
  auto it = std::upper_bound(packs.begin(), packs.end(), offset,
                             [](std::int64_t o, const Pack& p) { return o < p.begin; });
  KVTIER_DCHECK(it != packs.begin(), "segment offset before the first pack");
  return *(it - 1);
}

std::uint32_t Segment::ChunkOf(std::int64_t offset, int chunk_tokens) const {
  const Pack& pack = PackOf(offset);
  return pack.first_chunk +
         static_cast<std::uint32_t>((StoredPosition(offset) - pack.begin) / chunk_tokens);
}

std::uint16_t Segment::RowOf(std::int64_t offset, int chunk_tokens) const {
  const Pack& pack = PackOf(offset);
  return static_cast<std::uint16_t>((StoredPosition(offset) - pack.begin) % chunk_tokens);
}

int Segment::TokensInChunk(std::uint32_t index, int chunk_tokens) const {
  auto it = std::upper_bound(packs.begin(), packs.end(), index,
                             [](std::uint32_t i, const Pack& p) { return i < p.first_chunk; });
  KVTIER_DCHECK(it != packs.begin(), "chunk index before the first pack");
  const Pack& pack = *(it - 1);
  std::int64_t start = std::int64_t(index - pack.first_chunk) * chunk_tokens;
  return static_cast<int>(std::min<std::int64_t>(chunk_tokens, (pack.end - pack.begin) - start));
}

// ---- Node ----------------------------------------------------------------------------------

struct RadixTree::Node {
  std::uint64_t id = 0;
  Node* parent = nullptr;
  std::vector<std::uint64_t> symbols;  // the run this node adds below its parent
  std::uint32_t segment = 0;
  std::int64_t segment_begin = 0;      // original token offset of symbols[0] in the segment
  std::map<std::uint64_t, std::unique_ptr<Node>> children;  // keyed by first symbol
};

RadixTree::RadixTree(int tokens_per_symbol, int chunk_tokens)
    : tokens_per_symbol_(tokens_per_symbol), chunk_tokens_(chunk_tokens),
      root_(std::make_unique<Node>()) {
  KVTIER_CHECK(tokens_per_symbol >= 1 && chunk_tokens >= 1, "radix tree needs positive sizes");
}

RadixTree::~RadixTree() = default;

std::size_t RadixTree::node_count() const { return nodes_.size(); }

Match RadixTree::Lookup(std::span<const std::uint64_t> symbols) const {
  Match match;
  const Node* node = root_.get();
  std::size_t pos = 0;
  while (pos < symbols.size()) {
    auto it = node->children.find(symbols[pos]);
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    std::size_t n = 0;
    while (n < child->symbols.size() && pos + n < symbols.size() &&
           child->symbols[n] == symbols[pos + n]) {
      ++n;
    }
    MatchPiece piece;
    piece.prefix_begin = std::int64_t(pos) * tokens_per_symbol_;
    piece.prefix_end = std::int64_t(pos + n) * tokens_per_symbol_;
    piece.segment = child->segment;
    piece.segment_begin = child->segment_begin;
    piece.node = child->id;
    match.pieces.push_back(piece);
    pos += n;
    if (n < child->symbols.size()) break;
    node = child;
  }
  match.matched_symbols = static_cast<std::int64_t>(pos);
  match.reused_tokens = match.matched_symbols * tokens_per_symbol_;
  return match;
}

RadixTree::Node* RadixTree::Split(Node* node, std::int64_t at) {
  KVTIER_DCHECK(at > 0 && at < static_cast<std::int64_t>(node->symbols.size()),
                "split point inside the node");
  auto upper = std::make_unique<Node>();
  upper->id = next_node_++;
  upper->parent = node->parent;
  upper->symbols.assign(node->symbols.begin(), node->symbols.begin() + at);
  upper->segment = node->segment;
  upper->segment_begin = node->segment_begin;
  node->symbols.erase(node->symbols.begin(), node->symbols.begin() + at);
  node->segment_begin += at * tokens_per_symbol_;

  Node* parent = node->parent;
  auto slot = parent->children.find(upper->symbols.front());
  KVTIER_DCHECK(slot != parent->children.end() && slot->second.get() == node,
                "split node is its parent's child");
  std::unique_ptr<Node> lower = std::move(slot->second);
  lower->parent = upper.get();
  Node* upper_raw = upper.get();
  upper->children.emplace(lower->symbols.front(), std::move(lower));
  nodes_[upper_raw->id] = upper_raw;
  segment_nodes_[upper_raw->segment].push_back(upper_raw);
  slot->second = std::move(upper);
  return upper_raw;
}

std::uint32_t RadixTree::NewSegment(std::int64_t tokens) {
  Segment seg;
  seg.id = next_segment_++;
  KVTIER_CHECK(seg.id != 0, "segment ids exhausted");
  seg.tokens = tokens;
  seg.num_chunks = static_cast<std::uint32_t>((tokens + chunk_tokens_ - 1) / chunk_tokens_);
  KVTIER_CHECK(seg.num_chunks < kMaxChunksPerSegment, "segment has too many chunks");
  seg.packs.push_back(Segment::Pack{0, tokens, 0});
  segments_.emplace(seg.id, std::move(seg));
  return next_segment_ - 1;
}

std::uint32_t RadixTree::Insert(std::span<const std::uint64_t> symbols, const Match& match) {
  const std::size_t matched = static_cast<std::size_t>(match.matched_symbols);
  if (matched >= symbols.size()) return 0;
  // Walk to where the match ended; split when it ended inside a node.
  Node* node = root_.get();
  std::size_t pos = 0;
  while (pos < matched) {
    auto it = node->children.find(symbols[pos]);
    KVTIER_CHECK(it != node->children.end(), "Insert: tree changed since Lookup");
    Node* child = it->second.get();
    std::size_t take = std::min(child->symbols.size(), matched - pos);
    if (take < child->symbols.size()) {
      node = Split(child, static_cast<std::int64_t>(take));
    } else {
      node = child;
    }
    pos += take;
  }
  KVTIER_CHECK(node->children.find(symbols[pos]) == node->children.end(),
               "Insert: the match was not the longest");
  const std::int64_t new_symbols = static_cast<std::int64_t>(symbols.size() - pos);
  const std::int64_t new_tokens = new_symbols * tokens_per_symbol_;
  auto leaf = std::make_unique<Node>();
  leaf->id = next_node_++;
  leaf->parent = node;
  leaf->symbols.assign(symbols.begin() + static_cast<std::ptrdiff_t>(pos), symbols.end());
  leaf->segment = NewSegment(new_tokens);
  leaf->segment_begin = 0;
  const std::uint32_t segment = leaf->segment;
  nodes_[leaf->id] = leaf.get();
  segment_nodes_[segment].push_back(leaf.get());
  node->children.emplace(leaf->symbols.front(), std::move(leaf));
  stored_tokens_ += new_tokens;
  return segment;
}

std::vector<std::pair<std::int64_t, std::int64_t>> RadixTree::NodeRanges(std::uint32_t id) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  auto it = segment_nodes_.find(id);
  if (it == segment_nodes_.end()) return ranges;
  for (const Node* node : it->second) {
    ranges.emplace_back(node->segment_begin,
                        node->segment_begin +
                            std::int64_t(node->symbols.size()) * tokens_per_symbol_);
  }
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

namespace {

// An unsigned key that orders finite floats descending (a > b: key(a) < key(b)), -0 and +0
// alike (equal under a float comparison).
std::uint32_t DescendingFloatKey(float v) {
  if (v == 0) v = 0;
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);  // ascending with the float
  return ~u;
}

// Sorts `keys` by their high 32 bits, keeping the order of equal ones (LSD radix, a byte a
// pass; a pass whose byte is the same in every key is skipped). `tmp` is scratch.
void StableSortByHighWord(std::vector<std::uint64_t>* keys, std::vector<std::uint64_t>* tmp) {
  tmp->resize(keys->size());
  for (int shift = 32; shift < 64; shift += 8) {
    std::uint32_t count[257] = {};
    for (std::uint64_t k : *keys) ++count[((k >> shift) & 0xff) + 1];
    if (std::any_of(count + 1, count + 257,
                    [n = keys->size()](std::uint32_t c) { return c == n; })) {
      continue;
    }
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (std::uint64_t k : *keys) (*tmp)[count[(k >> shift) & 0xff]++] = k;
    keys->swap(*tmp);
  }
}

}  // namespace

void PackByImportance(std::span<const std::pair<std::int64_t, std::int64_t>> ranges,
                      std::span<const float> importance, int chunk_tokens, Segment* seg) {
  KVTIER_CHECK(std::int64_t(importance.size()) == seg->tokens,
               "PackByImportance: one importance value per stored token");
  seg->reordered = true;
  seg->packs.clear();
  seg->stored.resize(static_cast<std::size_t>(seg->tokens));
  std::uint32_t chunk = 0;
  // Descending mean importance, ties by original offset: deterministic (SPEC §IV-D1). One
  // 64-bit key per token, (descending importance) << 32 | offset in the range, written in
  // ascending offset order and radix-sorted stably by the importance half (the reorderer packs
  // every reused segment per request to weigh a repack: a stable sort through the importance
  // array was ~13% of a warm spec run, sim_bench).
  thread_local std::vector<std::uint64_t> keys, scratch;
  for (const auto& [begin, end] : ranges) {
    keys.resize(static_cast<std::size_t>(end - begin));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      keys[i] = std::uint64_t{DescendingFloatKey(importance[std::size_t(begin) + i])} << 32 |
                std::uint64_t{static_cast<std::uint32_t>(i)};
    }
    StableSortByHighWord(&keys, &scratch);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      seg->stored[std::size_t(begin) + std::size_t(keys[i] & 0xffffffffu)] =
          static_cast<std::uint32_t>(begin) + static_cast<std::uint32_t>(i);
    }
    seg->packs.push_back(Segment::Pack{begin, end, chunk});
    chunk += static_cast<std::uint32_t>((end - begin + chunk_tokens - 1) / chunk_tokens);
  }
  seg->num_chunks = chunk;
}

std::vector<std::pair<std::int64_t, std::int64_t>> RadixTree::RepackRanges(std::uint32_t id) const {
  const Segment* seg = FindSegment(id);
  KVTIER_CHECK(seg != nullptr, "RepackRanges: unknown segment");
  // Packs: the node ranges, plus any gap not referenced by a node (kept as its own pack).
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::int64_t cursor = 0;
  for (const auto& r : NodeRanges(id)) {
    if (r.first > cursor) ranges.emplace_back(cursor, r.first);
    ranges.push_back(r);
    cursor = r.second;
  }
  if (cursor < seg->tokens) ranges.emplace_back(cursor, seg->tokens);
  return ranges;
}

std::uint32_t RadixTree::Repack(std::uint32_t old_id, std::span<const float> importance) {
  auto it = segments_.find(old_id);
  KVTIER_CHECK(it != segments_.end(), "Repack: unknown segment");
  KVTIER_CHECK(static_cast<std::int64_t>(importance.size()) == it->second.tokens,
               "Repack: one importance value per stored token");
  Segment seg;
  seg.id = next_segment_++;
  seg.tokens = it->second.tokens;
  PackByImportance(RepackRanges(old_id), importance, chunk_tokens_, &seg);
  const std::uint32_t new_id = seg.id;
  auto refs = segment_nodes_.find(old_id);
  if (refs != segment_nodes_.end()) {
    for (Node* node : refs->second) node->segment = new_id;
    std::vector<Node*> moved = std::move(refs->second);
    segment_nodes_.erase(refs);
    segment_nodes_[new_id] = std::move(moved);
  }
  segments_.erase(it);
  segments_.emplace(new_id, std::move(seg));
  return new_id;
}

const Segment* RadixTree::FindSegment(std::uint32_t id) const {
  auto it = segments_.find(id);
  return it == segments_.end() ? nullptr : &it->second;
}

std::vector<std::uint32_t> RadixTree::MappingList(std::uint64_t node_id) const {
  auto it = nodes_.find(node_id);
  KVTIER_CHECK(it != nodes_.end(), "MappingList: unknown node");
  const Node* node = it->second;
  const Segment* seg = FindSegment(node->segment);
  KVTIER_CHECK(seg != nullptr, "MappingList: node references a missing segment");
  const std::int64_t n = std::int64_t(node->symbols.size()) * tokens_per_symbol_;
  const Segment::Pack& pack = seg->PackOf(node->segment_begin);
  std::vector<std::uint32_t> mapping(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    mapping[static_cast<std::size_t>(i)] =
        static_cast<std::uint32_t>(seg->StoredPosition(node->segment_begin + i) - pack.begin);
  }
  return mapping;
}

void RadixTree::CheckInvariants() const {
  std::int64_t tokens = 0;
  std::vector<const Node*> stack = {root_.get()};
  std::size_t visited = 0;
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    for (const auto& [first, child] : node->children) {
      KVTIER_CHECK(child->parent == node, "child's parent link");
      KVTIER_CHECK(!child->symbols.empty() && child->symbols.front() == first,
                   "child keyed by its first symbol");
      const Segment* seg = FindSegment(child->segment);
      KVTIER_CHECK(seg != nullptr, "node references a live segment");
      KVTIER_CHECK(child->segment_begin + std::int64_t(child->symbols.size()) * tokens_per_symbol_
                       <= seg->tokens,
                   "node range inside its segment");
      tokens += std::int64_t(child->symbols.size()) * tokens_per_symbol_;
      ++visited;
      stack.push_back(child.get());
    }
  }
  KVTIER_CHECK(visited == nodes_.size(), "node index matches the tree");
  std::size_t indexed = 0;
  for (const auto& [id, refs] : segment_nodes_) {
    for (const Node* node : refs) {
      KVTIER_CHECK(node->segment == id, "a segment's node index names another segment's node");
    }
    indexed += refs.size();
  }
  KVTIER_CHECK(indexed == nodes_.size(), "the segment node index covers every node once");
  KVTIER_CHECK(tokens == stored_tokens_, "stored tokens match the tree");
  for (const auto& [id, seg] : segments_) {
    KVTIER_CHECK(!seg.stored.empty() || !seg.reordered, "reordered segments have positions");
    if (!seg.stored.empty()) {
      std::vector<bool> used(seg.stored.size(), false);
      for (std::uint32_t p : seg.stored) {
        KVTIER_CHECK(p < seg.stored.size() && !used[p], "stored positions are a permutation");
        used[p] = true;
      }
    }
  }
}

}  // namespace kvtier
