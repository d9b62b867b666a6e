#include "hw/decode_home.h"

#include <algorithm>

#include "core/check.h"

namespace kvtier::hw {
namespace {

std::uint64_t Mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Piece i of `count` equal shares of `bytes` (the last ones take the remainder).
Bytes Share(Bytes bytes, std::uint64_t count, std::uint64_t i) {
  return bytes * (i + 1) / count - bytes * i / count;
}

}  // namespace

Bytes DecodeHome::BytesFor(const ModelSpec& model, std::int64_t tokens) {
  return Bytes(model.layers) * 2 * Bytes(std::max<std::int64_t>(1, tokens)) *
         model.KBytesPerTokenLayer();
}

Status DecodeHome::Create(const ModelSpec& model, std::int64_t tokens, Bytes max_piece,
                          DeviceBackend* device, std::unique_ptr<DecodeHome>* out) {
  tokens = std::max<std::int64_t>(1, tokens);
  HostArenaOptions ho;
  ho.slot_bytes = BytesFor(model, tokens);
  ho.slot_count = 1;
  std::unique_ptr<HostArena> arena;
  KVTIER_RETURN_IF_ERROR(device->AllocateHost(ho, &arena).Annotate("the decode home"));
  out->reset(new DecodeHome(model, tokens, std::max<Bytes>(1, max_piece), std::move(arena)));
  return Status::OK();
}

DecodeHome::DecodeHome(const ModelSpec& model, std::int64_t tokens, Bytes max_piece,
                       std::unique_ptr<HostArena> arena)
    : model_(model),
      tokens_(tokens),
      max_piece_(max_piece),
      token_bytes_(model.KBytesPerTokenLayer()),
      region_bytes_(Bytes(tokens) * model.KBytesPerTokenLayer()),
      arena_(std::move(arena)),
      held_(std::size_t(model.layers), 0),
      appended_(std::size_t(model.layers), 0),
      end_(std::size_t(model.layers), 0) {}

bool DecodeHome::Serves(const TransferOp& op) {
  if (!op.chunks.empty()) return false;
  switch (op.purpose) {
    case Purpose::kDecodeOffload: return op.kind == TransferKind::kD2H;
    case Purpose::kDecodeFetch:
    case Purpose::kDecodePrefetch:
      return op.kind == TransferKind::kCpuGather ||
             (op.kind == TransferKind::kH2D && op.layer >= 0);
    default: return false;
  }
}

std::byte* DecodeHome::region(int layer, KvKind kind) const {
  const Bytes index = Bytes(layer) * 2 + (kind == KvKind::kValue ? 1 : 0);
  return arena_->base() + index * region_bytes_;
}

std::int64_t DecodeHome::held(int layer) const {
  std::lock_guard<std::mutex> l(mu_);
  return held_[std::size_t(layer)];
}

std::uint64_t DecodeHome::wraps() const {
  std::lock_guard<std::mutex> l(mu_);
  return wraps_;
}

bool DecodeHome::WritePieces(std::byte* region, Bytes at, Bytes bytes, const DeviceAlloc& alloc,
                             std::vector<CopyPiece>* pieces) {
  bool wrapped = false;
  at %= region_bytes_;
  while (bytes > 0) {
    const Bytes n = std::min({bytes, region_bytes_ - at, max_piece_});
    pieces->push_back({region + at, alloc(n), n});
    bytes -= n;
    at += n;
    if (at == region_bytes_) {
      at = 0;
      wrapped = wrapped || bytes > 0;
    }
  }
  return wrapped;
}

void DecodeHome::OffloadPieces(const TransferOp& op, const DeviceAlloc& alloc,
                               std::vector<CopyPiece>* pieces) {
  KVTIER_CHECK(Serves(op) && op.kind == TransferKind::kD2H, "DecodeHome: not a decode offload");
  std::lock_guard<std::mutex> l(mu_);
  ++ops_;
  const int layers = model_.layers;
  // A join (layer -1) starts a new sequence: every layer from position 0, a layer's share each.
  const bool join = op.layer < 0;
  const int first = join ? 0 : op.layer, last = join ? layers - 1 : op.layer;
  for (int layer = first; layer <= last; ++layer) {
    const std::size_t li = std::size_t(layer);
    const Bytes bytes = join ? Share(op.bytes, std::uint64_t(layers), std::uint64_t(layer))
                             : op.bytes;
    if (join) end_[li] = 0, held_[li] = 0;
    const std::int64_t before = held_[li];
    const Bytes k = bytes / 2;
    bool wrapped = WritePieces(region(layer, KvKind::kKey), end_[li], k, alloc, pieces);
    wrapped = WritePieces(region(layer, KvKind::kValue), end_[li], bytes - k, alloc, pieces) ||
              wrapped;
    end_[li] += k;
    held_[li] = std::min<std::int64_t>(tokens_, std::int64_t(end_[li] / token_bytes_));
    appended_[li] = join ? 0 : held_[li] - before;
    wraps_ += wrapped ? 1 : 0;
  }
}

const std::byte* DecodeHome::SourceOf(int layer, KvKind kind, Bytes bytes,
                                      std::uint64_t salt) const {
  std::byte* base = region(layer, kind);
  const std::size_t li = std::size_t(layer);
  const Bytes filled = Bytes(held_[li]) * token_bytes_;
  if (bytes >= filled || bytes >= region_bytes_) return base;  // the whole layer, from 0
  // A row (or a few) somewhere in what the layer holds, aligned to a head row -- before the
  // last step's token: SpeCache's prefetch of a layer runs beside that layer's offload (both
  // follow its compute), which may still be writing it. (Whole-layer reads are ordered after
  // the layer's offloads by the engine's dependencies.)
  const Bytes settled = Bytes(held_[li] - appended_[li]) * token_bytes_;
  if (bytes >= settled) return base;
  const Bytes row = model_.RowBytes();
  const Bytes span = (settled - bytes) / row + 1;  // row-aligned starts that fit
  return base + (Mix(salt) % span) * row;
}

void DecodeHome::GatherPieces(const TransferOp& op, std::byte* dst, Bytes room,
                              std::vector<CopyPiece>* pieces, Bytes* k_bytes) {
  KVTIER_CHECK(Serves(op) && op.kind == TransferKind::kCpuGather,
               "DecodeHome: not a decode gather");
  std::lock_guard<std::mutex> l(mu_);
  const std::uint64_t salt = Mix(++ops_);
  const std::uint64_t runs = std::max<std::uint32_t>(1, op.ios);
  const int layer = std::max(0, op.layer);
  *k_bytes = 0;
  Bytes at = 0;
  for (std::uint64_t i = 0; i < runs && at < room; ++i) {
    const KvKind kind = runs > 1 && i >= runs / 2 ? KvKind::kValue : KvKind::kKey;
    const Bytes n = Share(op.bytes, runs, i);
    if (n == 0) continue;
    // A run larger than the region (a home smaller than the sequence) is read from its start.
    Bytes left = std::min(n, room - at);
    while (left > 0) {
      const Bytes m = std::min(left, region_bytes_);
      pieces->push_back({dst + at, SourceOf(layer, kind, m, salt + i), m});
      at += m;
      left -= m;
    }
    if (kind == KvKind::kKey) *k_bytes = at;
  }
}

void DecodeHome::FetchPieces(const TransferOp& op, std::uint32_t count, const DeviceAlloc& alloc,
                             std::vector<CopyPiece>* pieces) {
  KVTIER_CHECK(Serves(op) && op.kind == TransferKind::kH2D, "DecodeHome: not a decode fetch");
  std::lock_guard<std::mutex> l(mu_);
  const std::uint64_t salt = Mix(++ops_);
  const std::uint64_t n_pieces = std::max<std::uint32_t>(1, count);
  for (std::uint64_t i = 0; i < n_pieces; ++i) {
    const KvKind kind = n_pieces > 1 && i >= n_pieces / 2 ? KvKind::kValue : KvKind::kKey;
    Bytes left = Share(op.bytes, n_pieces, i);
    const std::byte* src = SourceOf(op.layer, kind, left, salt + i);
    // Whole-layer reads larger than a working-ring piece (offload_all) are split; head rows
    // (the top-k of per_row, batched, device_gather) stay one piece each.
    const std::byte* base = region(op.layer, kind);
    Bytes at = Bytes(src - base);
    while (left > 0) {
      const Bytes m = std::min({left, region_bytes_ - at, max_piece_});
      pieces->push_back({alloc(m), base + at, m});
      left -= m;
      at = (at + m) % region_bytes_;
    }
  }
}

}  // namespace kvtier::hw
