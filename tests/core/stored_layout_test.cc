// StoredLayout: which kinds a system stores per (layer, chunk) and how many bytes they are,
// derived by hand for a tiny model.

#include "core/stored_layout.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/options.h"

namespace kvtier {
namespace {

ModelSpec Tiny() {
  ModelSpec m;
  m.name = "tiny";
  m.layers = 2;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 4;
  m.dtype_bytes = 2;
  return m;  // one head's row: 4 * 2 = 8 B; K or V of one token (4 heads): 32 B
}

TEST(StoredLayoutTest, KeysAndValuesAndProbeKeysOnlyForItf) {
  SystemOptions sys;
  sys.chunk_tokens = 4;
  sys.itf_options.probe_heads = 3;
  sys.select = "h2o";
  const StoredLayout h2o = StoredLayout::Of(Tiny(), sys);
  EXPECT_EQ(std::vector<KvKind>(h2o.kinds().begin(), h2o.kinds().end()),
            (std::vector<KvKind>{KvKind::kKey, KvKind::kValue}));
  EXPECT_FALSE(h2o.Has(KvKind::kProbeKey));
  sys.select = "itf";
  const StoredLayout itf = StoredLayout::Of(Tiny(), sys);
  EXPECT_EQ(std::vector<KvKind>(itf.kinds().begin(), itf.kinds().end()),
            (std::vector<KvKind>{KvKind::kKey, KvKind::kValue, KvKind::kProbeKey}));
  EXPECT_TRUE(itf.Has(KvKind::kProbeKey));
  EXPECT_EQ(itf.TokenBytes(KvKind::kKey), 32u);
  EXPECT_EQ(itf.TokenBytes(KvKind::kValue), 32u);
  EXPECT_EQ(itf.TokenBytes(KvKind::kProbeKey), 3u * 8);  // 3 probe heads' keys
  EXPECT_EQ(itf.chunk_tokens(), 4);
}

TEST(StoredLayoutTest, ChunkBytesFollowTheSegmentsTokens) {
  // A 10-token segment in 4-token chunks: 4, 4 and 2 tokens.
  RadixTree tree(1, 4);
  std::vector<std::uint64_t> prefix(10);
  for (std::uint64_t i = 0; i < 10; ++i) prefix[i] = 100 + i;
  const std::uint32_t id = tree.Insert(prefix, tree.Lookup(prefix));
  const Segment& seg = *tree.FindSegment(id);
  const StoredLayout layout(Tiny(), 4, 3);
  EXPECT_EQ(layout.ChunkBytes(seg, 0, KvKind::kKey), 4u * 32);
  EXPECT_EQ(layout.ChunkBytes(seg, 2, KvKind::kValue), 2u * 32);
  EXPECT_EQ(layout.ChunkBytes(seg, 2, KvKind::kProbeKey), 2u * 24);
  // The model's own chunk sizes agree for a full chunk.
  EXPECT_EQ(layout.ChunkBytes(seg, 0, KvKind::kKey), Tiny().ChunkBytes(4));
  EXPECT_EQ(layout.ChunkBytes(seg, 0, KvKind::kProbeKey), Tiny().ProbeChunkBytes(4, 3));
}

}  // namespace
}  // namespace kvtier
