#include "core/transfer_strategy.h"

#include <bit>

#include "core/check.h"

namespace kvtier {
namespace {

// The one table of transfer strategies. A new strategy adds one line here (and its case below).
constexpr TransferStrategyInfo kStrategies[] = {
    {"per_row", TransferStrategy::kPerRow,
     "one DMA per contiguous run of needed rows (a scattered copy)"},
    {"per_chunk", TransferStrategy::kPerChunk,
     "one DMA per chunk, moving the whole stored chunk (block-based engines)"},
    {"staged_gather", TransferStrategy::kStagedGather,
     "the CPU gathers the needed rows into pinned staging, one region per kind, then one DMA "
     "per region (FlexGen, which SPEC builds on)"},
    {"batched", TransferStrategy::kBatched,
     "one batched-copy call with a descriptor per run (cudaMemcpyBatchAsync)"},
    {"device_gather", TransferStrategy::kDeviceGather,
     "one GPU kernel gathers the runs from mapped pinned host memory (uses SMs)"},
};

constexpr SsdReadUnitInfo kReadUnits[] = {
    {"chunk", SsdReadUnit::kChunk, "read whole chunks (the paper)"},
    {"extent", SsdReadUnit::kExtent,
     "read the 4 KiB-aligned extents that cover the needed rows (one I/O per merged extent)"},
};

}  // namespace

std::span<const TransferStrategyInfo> TransferStrategies() { return kStrategies; }
std::vector<Choice> TransferStrategyChoices() { return ChoicesOf(TransferStrategies()); }
TransferStrategy FindTransferStrategy(std::string_view name, std::string_view key) {
  return FindEntry(TransferStrategies(), name, key, "transfer strategy").strategy;
}
std::string_view TransferStrategyName(TransferStrategy strategy) {
  for (const TransferStrategyInfo& info : kStrategies) {
    if (info.strategy == strategy) return info.name;
  }
  return "?";
}

std::span<const SsdReadUnitInfo> SsdReadUnits() { return kReadUnits; }
std::vector<Choice> SsdReadUnitChoices() { return ChoicesOf(SsdReadUnits()); }
SsdReadUnit FindSsdReadUnit(std::string_view name, std::string_view key) {
  return FindEntry(SsdReadUnits(), name, key, "SSD read unit").unit;
}
std::string_view SsdReadUnitName(SsdReadUnit unit) {
  for (const SsdReadUnitInfo& info : kReadUnits) {
    if (info.unit == unit) return info.name;
  }
  return "?";
}

void AddRows(TransferStrategy strategy, const RowLoad& load, bool detail, RowOps* ops) {
  TransferOp& h2d = ops->h2d;
  auto rows = [&] { return std::vector<std::uint16_t>(load.rows.begin(), load.rows.end()); };
  ops->kinds |= std::uint8_t(1u << static_cast<unsigned>(load.kind));
  switch (strategy) {
    case TransferStrategy::kPerRow:
      h2d.ios += load.runs;
      h2d.bytes += load.bytes;
      if (detail) h2d.chunks.push_back({load.chunk, load.bytes, rows(), {}});
      return;
    case TransferStrategy::kPerChunk:
      // The whole stored chunk moves, as block-based engines move a block.
      ++h2d.ios;
      h2d.bytes += load.chunk_bytes;
      if (detail) h2d.chunks.push_back({load.chunk, load.chunk_bytes, {}, {}});
      return;
    case TransferStrategy::kStagedGather:
      ops->gather.ios += load.runs;
      ops->gather.bytes += load.bytes;
      if (detail) ops->gather.chunks.push_back({load.chunk, load.bytes, rows(), {}});
      h2d.staged = true;
      h2d.bytes += load.bytes;  // ios: one per kind, in FinishOps
      if (detail) h2d.chunks.push_back({load.chunk, load.bytes, rows(), {}});
      return;
    case TransferStrategy::kBatched:
    case TransferStrategy::kDeviceGather:
      h2d.method = strategy == TransferStrategy::kBatched ? CopyMethod::kBatched
                                                           : CopyMethod::kDeviceGather;
      h2d.ios = 1;  // one call / one launch for the whole op
      h2d.descriptors += load.runs;
      h2d.bytes += load.bytes;
      if (detail) h2d.chunks.push_back({load.chunk, load.bytes, rows(), {}});
      return;
  }
}

void FinishOps(TransferStrategy strategy, RowOps* ops) {
  if (strategy == TransferStrategy::kStagedGather && ops->h2d.bytes > 0) {
    // One contiguous staging region per kind, one DMA each.
    ops->h2d.ios = std::uint32_t(std::popcount(ops->kinds));
  }
}

Bytes AppendExtents(std::span<const std::uint16_t> rows, Bytes row_stride, Bytes chunk_bytes,
                    std::vector<Extent>* out) {
  KVTIER_DCHECK(row_stride > 0, "AppendExtents: row_stride > 0");
  const std::size_t first = out->size();
  Bytes covered = 0;
  std::size_t i = 0;
  while (i < rows.size()) {
    std::size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    const Bytes begin = Bytes(rows[i]) * row_stride;
    const Bytes end = Bytes(rows[j - 1] + 1) * row_stride;
    KVTIER_DCHECK(end <= chunk_bytes, "AppendExtents: a row past the chunk");
    const Bytes lo = begin / kExtentAlign * kExtentAlign;
    const Bytes hi = (end + kExtentAlign - 1) / kExtentAlign * kExtentAlign;
    if (out->size() > first && out->back().offset + out->back().length >= lo) {
      Extent& last = out->back();  // overlapping or adjacent: merged
      if (hi > last.offset + last.length) last.length = hi - last.offset;
    } else {
      out->push_back({lo, hi - lo});
    }
    i = j;
  }
  for (std::size_t k = first; k < out->size(); ++k) {
    const Extent& e = (*out)[k];
    covered += std::min(e.offset + e.length, chunk_bytes) - e.offset;
  }
  if (out->size() == first + 1 && covered == chunk_bytes) {
    out->resize(first);  // the whole chunk
  }
  return covered;
}

}  // namespace kvtier
