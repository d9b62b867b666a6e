#pragma once
// Helpers shared by the sim/hw parity tests (strategy_parity_test, decode_parity_test): a model
// with rows wide enough for extents and gathers to matter, a transfer op as one comparable line,
// and the backend call a transfer op stands for, as a key that sorts.

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>

#include "core/executor.h"
#include "tests/hw/backend_recorder.h"
#include "tests/testutil/tiny_model.h"

namespace kvtier::hw::fixture {

// Rows of 256 B (head_dim 128), 4 KV heads: one token's K (or V) in one layer is 1 KiB (probe
// keys of 3 heads: 768 B), so a 16-token chunk spans four 4 KiB extents and extent reads
// really read parts of chunks. 2 layers.
inline ModelSpec WideModel(const std::string& name) {
  ModelSpec m = kvtier::testing::TinyModel(2);
  m.name = name;
  m.hidden = 512;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 128;
  m.ffn = 1024;
  return m;
}

// A transfer op as the parity tests compare it between executors.
inline std::string Line(const TransferOp& op) {
  std::ostringstream o;
  o << TransferKindName(op.kind) << ' ' << PurposeName(op.purpose) << " r" << op.request << " l"
    << op.layer << " method " << int(op.method) << " staged " << op.staged << " ios " << op.ios
    << " desc " << op.descriptors << " bytes " << op.bytes;
  return o.str();
}

// One backend call, as a comparable key: what, direction, count, bytes.
using CallKey = std::tuple<int, int, std::uint64_t, Bytes>;

// The call a host-side transfer op (not an SSD read or write) makes: the count being the DMA
// calls of a Copy (at least one; its ios), the descriptors of a batched call or a device gather,
// the memcpys (ios) of a CPU gather.
inline CallKey ExpectedCall(const TransferOp& op) {
  const int dir = op.kind == TransferKind::kD2H ? int(CopyDirection::kDeviceToHost)
                                                : int(CopyDirection::kHostToDevice);
  if (op.kind == TransferKind::kCpuGather) return {Call::kGather, dir, op.ios, op.bytes};
  if (op.method == CopyMethod::kBatched) return {Call::kBatched, dir, op.descriptors, op.bytes};
  if (op.method == CopyMethod::kDeviceGather) {
    return {Call::kDeviceGather, dir, op.descriptors, op.bytes};
  }
  return {Call::kCopy, dir, std::max<std::uint32_t>(1, op.ios), op.bytes};
}

// The key of a call the Recorder saw: a Copy counts its DMA calls (copies), the others their
// pieces.
inline CallKey KeyOf(const Call& call) {
  const bool copy = call.what == Call::kCopy;
  return {call.what, int(call.direction), copy ? call.copies : call.pieces, call.bytes};
}

}  // namespace kvtier::hw::fixture
