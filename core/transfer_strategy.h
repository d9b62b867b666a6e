#pragma once
// Transfer strategies: how the selected rows of chunks move to the GPU (transfer.strategy), and
// how much of a chunk an SSD read fetches (transfer.ssd_read_unit). The LoadPlanner describes,
// chunk by chunk, which rows of which chunk a load needs from one source (CPU-cached chunks, or
// chunks just read from the SSD into host staging); AddRows turns that into the counts of the
// ops the strategy issues, and FinishOps completes them once every chunk is in. Executors charge
// (sim) or issue (hw) exactly what the ops say (core/executor.h, TransferOp):
//
//   strategy       ops                              counts
//   per_row        H2D kDma                         ios = runs; bytes = needed rows
//   per_chunk      H2D kDma                         ios = chunks; bytes = whole stored chunks
//   staged_gather  kCpuGather, then H2D kDma staged gather ios = runs, bytes = needed;
//                                                   H2D ios = kinds in the op, bytes = needed
//   batched        H2D kBatched                     ios = 1 call; descriptors = runs
//   device_gather  H2D kDeviceGather                ios = 1 launch; descriptors = runs
//
// A *run* is a maximal range of consecutive stored rows of one chunk among the needed rows
// (a whole chunk is one run). Cache promotions and demotions and the store's D2H are not loads
// of selected rows: they stay whole-chunk kDma ops, whatever the strategy.
//
// Adding a strategy: a value of TransferStrategy, one line in the table of
// transfer_strategy.cc (name, value, help), its case in AddRows (and in FinishOps if its op
// counts need the whole op), and, if it introduces a new CopyMethod, that method's cost in
// sim/sim_executor.cc and its execution in hw/. (A table and a switch, not a class per
// strategy: AddRows runs per chunk in the planner's hot loop, which makes no virtual calls.)
//
// Plain functions on plain data; thread-compatible.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/executor.h"
#include "core/registry.h"
#include "core/types.h"

namespace kvtier {

enum class TransferStrategy : std::uint8_t {
  kPerRow,
  kPerChunk,
  kStagedGather,
  kBatched,
  kDeviceGather,
};

enum class SsdReadUnit : std::uint8_t {
  kChunk,   // whole chunks (the paper; FlexGen reads whole tensors)
  kExtent,  // the 4 KiB-aligned extents of the chunk's stored bytes that hold the needed rows
};

struct TransferStrategyInfo {
  std::string_view name;
  TransferStrategy strategy;
  std::string_view help;
};
struct SsdReadUnitInfo {
  std::string_view name;
  SsdReadUnit unit;
  std::string_view help;
};

// The registration tables (transfer.strategy, transfer.ssd_read_unit) and their lookups; an
// unknown name throws ConfigError naming `key` and the valid names.
std::span<const TransferStrategyInfo> TransferStrategies();
std::vector<Choice> TransferStrategyChoices();
TransferStrategy FindTransferStrategy(std::string_view name,
                                      std::string_view key = "transfer.strategy");
std::string_view TransferStrategyName(TransferStrategy strategy);
std::span<const SsdReadUnitInfo> SsdReadUnits();
std::vector<Choice> SsdReadUnitChoices();
SsdReadUnit FindSsdReadUnit(std::string_view name,
                            std::string_view key = "transfer.ssd_read_unit");
std::string_view SsdReadUnitName(SsdReadUnit unit);

// Runs in `rows` (sorted ascending, distinct): 1 + the number of gaps. 0 for no rows.
inline std::uint32_t CountRuns(std::span<const std::uint16_t> rows) {
  if (rows.empty()) return 0;
  std::uint32_t runs = 1;
  for (std::size_t i = 1; i < rows.size(); ++i) runs += rows[i] != rows[i - 1] + 1;
  return runs;
}

// The rows of one chunk that one load needs from one source.
struct RowLoad {
  ChunkId chunk;
  KvKind kind = KvKind::kKey;
  std::span<const std::uint16_t> rows;  // sorted, distinct; empty only with whole
  std::uint32_t runs = 1;               // CountRuns(rows); 1 for a whole chunk
  Bytes bytes = 0;                      // bytes of the needed rows
  Bytes chunk_bytes = 0;                // bytes of the whole stored chunk
  bool whole = false;                   // every row of the chunk is needed
};

// The ops that move one source's rows to the GPU: a CPU gather (staged_gather only) and the
// H2D. Their kind, purpose, request and layer are set by the LoadPlanner when it submits.
struct RowOps {
  TransferOp gather;
  TransferOp h2d;
  std::uint8_t kinds = 0;  // bit k: rows of KvKind k are in the op
  bool empty() const { return h2d.bytes == 0; }
};

// Adds `load` to `ops` under `strategy`. `detail`: also list the chunk in the ops' `chunks`
// (hw moves real bytes; the simulator only needs the totals).
void AddRows(TransferStrategy strategy, const RowLoad& load, bool detail, RowOps* ops);

// Completes the counts that depend on the whole op (staged_gather: one H2D region per kind).
// REQUIRES: every chunk of the op was added.
void FinishOps(TransferStrategy strategy, RowOps* ops);

// SSD extents. The rows of a stored chunk lie back to back, row r at r * row_stride of the
// chunk's stored bytes (core/stored_layout.h, TokenBytes; hw/hw_executor.cc lays chunks out
// the same way); a chunk's stored bytes start 4 KiB-aligned on the device.
inline constexpr Bytes kExtentAlign = 4096;

// Appends to *out the 4 KiB-aligned extents that cover `rows` (sorted, distinct) of a chunk of
// `chunk_bytes` bytes whose rows are `row_stride` apart: one per run, offsets rounded down and
// ends rounded up to 4 KiB, overlapping or adjacent extents merged. Returns the chunk bytes
// the extents cover (each extent's part below chunk_bytes: an extent's tail past the end of
// the chunk is the padding of its 4 KiB-aligned slot, read but not counted, as a whole-chunk
// read counts chunk_bytes). When the extents cover the whole chunk, appends nothing and returns
// chunk_bytes (a whole-chunk read). REQUIRES: row_stride > 0; (max row + 1) * row_stride <=
// chunk_bytes.
Bytes AppendExtents(std::span<const std::uint16_t> rows, Bytes row_stride, Bytes chunk_bytes,
                    std::vector<Extent>* out);

}  // namespace kvtier
