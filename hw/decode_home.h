#pragma once
// DecodeHome: where `kvtier hw` keeps the 16-bit KV of the sequence it decodes in CPU memory
// (issue 17), and how the decode batch's transfers (core/decode_engine.h) map onto it. Used by
// HwExecutor only; the simulator has no bytes to place.
//
// The decode engine plans by counts: its ops list no chunks (TransferOp::chunks is empty) --
// top-k positions are not modelled, only how many rows move and how -- so hw cannot be told
// which rows to move. It picks them itself, in a home laid out as the 16-bit cache would be:
// per layer, a K region and a V region of `tokens` token rows each (a token's row holds its
// kv_heads head rows of head_dim 16-bit values, back to back), in one host arena (pinned on the
// cuda backend). hw decodes one request at a time (decode.max_batch = 1), so the home holds one
// sequence:
//   D2H decode_offload, layer -1 (a request joins: its prompt's KV, Algorithm 1)
//                starts a new sequence: every layer's K and V regions are written from
//                position 0 with the op's bytes (a layer's share, half K, half V);
//   D2H decode_offload, layer l (a step's new KV)
//                appends the bytes at the end of layer l's K and V (half each);
//   kCpuGather decode_fetch / decode_prefetch, layer l (staged_gather's top-k)
//                `ios` rows (one run each: the engine counts scattered rows), the first half
//                from layer l's K, the second from its V, each a head row of the sequence at a
//                position drawn by a fixed hash from those the home holds (before the last
//                step's token, which the layer's offload may still be writing); laid out back to
//                back, K then V (the staged H2D copies the two regions);
//   H2D decode_fetch / decode_prefetch, layer l, not staged (per_row, per_chunk, batched,
//                device_gather; offload_all's stream of the whole layer)
//                as many pieces as the op has DMA calls (kDma: ios) or descriptors, the first
//                half from K, the second from V; a piece covering at least what the home holds
//                of the layer starts at position 0 (offload_all and per_chunk read the whole
//                layer), a smaller one (a head row) at a hashed position.
// Rows past `tokens` wrap around to position 0 (counted in wraps(): timing kept, the bytes of
// the earliest positions overwritten). Other decode ops -- kivi's H2D of a reused prefix's
// low-bit copy (layer -1), which has no home here -- stay bytes-only copies between the rings.
//
// Thread safety: the planning calls may come from the H2D, D2H and CPU lanes at once; the
// lengths are under a mutex. The bytes are copied by the caller, outside it.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/status.h"
#include "hw/arena.h"
#include "hw/device_backend.h"

namespace kvtier::hw {

class DecodeHome {
 public:
  // A home of `tokens` positions per layer (>= 1), allocated through `device` (host memory,
  // pinned by the cuda backend). Pieces it plans to or from device memory are at most
  // `max_piece` bytes (a working-ring allocation). OutOfSpace when the mapping cannot be made.
  static Status Create(const ModelSpec& model, std::int64_t tokens, Bytes max_piece,
                       DeviceBackend* device, std::unique_ptr<DecodeHome>* out);
  // Bytes of a home of `tokens` positions: layers x 2 x tokens x K bytes per token and layer.
  static Bytes BytesFor(const ModelSpec& model, std::int64_t tokens);

  // True for the ops this home serves (above): a bytes-only transfer of purpose decode_offload
  // (D2H), or decode_fetch / decode_prefetch (kCpuGather; H2D at a layer >= 0).
  static bool Serves(const TransferOp& op);

  // Where `n` device bytes go or come from (the executor's working ring).
  using DeviceAlloc = std::function<std::byte*(Bytes n)>;
  // The pieces of a D2H decode_offload: device memory from `alloc` into the home. Their bytes
  // sum to op.bytes. REQUIRES: Serves(op), op.kind == kD2H.
  void OffloadPieces(const TransferOp& op, const DeviceAlloc& alloc,
                     std::vector<CopyPiece>* pieces);
  // The pieces of a decode kCpuGather: op.ios rows (op.bytes split among them) into `dst`, back
  // to back, at most `room` bytes (a gather ring's size); the first *k_bytes of them are K rows.
  // REQUIRES: Serves(op), kind == kCpuGather.
  void GatherPieces(const TransferOp& op, std::byte* dst, Bytes room,
                    std::vector<CopyPiece>* pieces, Bytes* k_bytes);
  // The pieces of a decode H2D: `count` pieces (>= 1) from the home to device memory from
  // `alloc`, bytes summing to op.bytes. REQUIRES: Serves(op), kind == kH2D.
  void FetchPieces(const TransferOp& op, std::uint32_t count, const DeviceAlloc& alloc,
                   std::vector<CopyPiece>* pieces);

  std::int64_t tokens() const { return tokens_; }
  // Positions layer `layer` holds now (<= tokens()).
  std::int64_t held(int layer) const;
  // Writes that went past tokens() and wrapped to position 0.
  std::uint64_t wraps() const;
  // Start of layer `layer`'s K (kind kKey) or V region. For tests.
  std::byte* region(int layer, KvKind kind) const;

 private:
  DecodeHome(const ModelSpec& model, std::int64_t tokens, Bytes max_piece,
             std::unique_ptr<HostArena> arena);
  // Pieces writing `bytes` at byte `at` of a region (wrapping at its end) from device memory
  // `alloc` gives. Returns true if it wrapped. REQUIRES: mu_ held.
  bool WritePieces(std::byte* region, Bytes at, Bytes bytes, const DeviceAlloc& alloc,
                   std::vector<CopyPiece>* pieces);
  // A source of `bytes` inside layer `layer`'s `kind` region: position 0 when it covers what
  // the region holds, else a hashed head row. REQUIRES: mu_ held.
  const std::byte* SourceOf(int layer, KvKind kind, Bytes bytes, std::uint64_t salt) const;

  ModelSpec model_;
  std::int64_t tokens_;
  Bytes max_piece_;
  Bytes token_bytes_;   // one token's K (or V) in one layer: kv_heads head rows
  Bytes region_bytes_;  // tokens_ x token_bytes_
  std::unique_ptr<HostArena> arena_;
  mutable std::mutex mu_;
  std::vector<std::int64_t> held_;  // per layer: positions written (capped at tokens_)
  std::vector<std::int64_t> appended_;  // per layer: positions the last step's offload added
  std::vector<Bytes> end_;          // per layer: the next write's byte offset in its regions
  std::uint64_t ops_ = 0;           // ops planned (the hash's salt)
  std::uint64_t wraps_ = 0;
};

}  // namespace kvtier::hw
