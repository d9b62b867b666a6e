#include "core/stored_layout.h"

#include "core/check.h"
#include "core/options.h"
#include "core/selector.h"

namespace kvtier {

StoredLayout::StoredLayout(const ModelSpec& model, int chunk_tokens, int probe_heads)
    : chunk_tokens_(chunk_tokens),
      probe_heads_(probe_heads),
      kv_token_bytes_(model.KBytesPerTokenLayer()),
      probe_token_bytes_(Bytes(probe_heads) * model.RowBytes()),
      kinds_{KvKind::kKey, KvKind::kValue, KvKind::kProbeKey},
      num_kinds_(probe_heads > 0 ? 3 : 2) {
  KVTIER_CHECK(chunk_tokens >= 1, "StoredLayout: chunk_tokens must be >= 1");
  KVTIER_CHECK(probe_heads >= 0 && probe_heads <= model.kv_heads,
               "StoredLayout: probe_heads must be in [0, kv_heads]");
}

StoredLayout StoredLayout::Of(const ModelSpec& model, const SystemOptions& system) {
  const bool probe_keys = FindSelector(system.select).probe_keys;
  return StoredLayout(model, system.chunk_tokens, probe_keys ? system.itf_options.probe_heads : 0);
}

}  // namespace kvtier
