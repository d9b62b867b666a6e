#pragma once
// StoredLayout: the one place that knows how a system stores a segment's KV (on the SSD, and
// chunk for chunk in the caches): which kinds every (layer, chunk) has -- keys and values
// always, and the probe heads' keys too when the system's selector reads them (ITF; stored
// redundantly so a probe reads few bytes, SPEC §VI-E) -- and how many bytes one token's row
// and one chunk of each kind are. The Pipeline's loads, stores, repacks and prewarm, and hw's
// chunk store prepopulation (hw/run_hw.cc) all ask it, so they cannot disagree.
//
// A small value type; thread-compatible.

#include <array>
#include <cstdint>
#include <span>

#include "core/model_spec.h"
#include "core/radix_tree.h"
#include "core/types.h"

namespace kvtier {

struct SystemOptions;

class StoredLayout {
 public:
  // `probe_heads` = 0: no probe-key chunks are stored.
  // REQUIRES: chunk_tokens >= 1; 0 <= probe_heads <= model.kv_heads.
  StoredLayout(const ModelSpec& model, int chunk_tokens, int probe_heads);

  // The layout `system` stores: its chunk size, and probe keys of its itf.probe_heads heads iff
  // its selector reads probe keys (core/selector.h, SelectorInfo::probe_keys).
  static StoredLayout Of(const ModelSpec& model, const SystemOptions& system);

  // The kinds every (layer, chunk) of a segment has, in store order: K, V, and PK if stored.
  std::span<const KvKind> kinds() const { return {kinds_.data(), num_kinds_}; }
  bool Has(KvKind kind) const { return kind != KvKind::kProbeKey || probe_heads_ > 0; }

  // Bytes of one token's row of `kind` in one layer: K or V of every KV head, or the keys of
  // the probe heads.
  Bytes TokenBytes(KvKind kind) const {
    return kind == KvKind::kProbeKey ? probe_token_bytes_ : kv_token_bytes_;
  }
  // Bytes of chunk `chunk` of `segment` of `kind` (a segment's last chunk may be short).
  Bytes ChunkBytes(const Segment& segment, std::uint32_t chunk, KvKind kind) const {
    return Bytes(segment.TokensInChunk(chunk, chunk_tokens_)) * TokenBytes(kind);
  }

  int chunk_tokens() const { return chunk_tokens_; }
  int probe_heads() const { return probe_heads_; }

 private:
  int chunk_tokens_;
  int probe_heads_;
  Bytes kv_token_bytes_;
  Bytes probe_token_bytes_;
  std::array<KvKind, 3> kinds_;
  std::size_t num_kinds_;
};

}  // namespace kvtier
