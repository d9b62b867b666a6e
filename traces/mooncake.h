#pragma once
// Importer of the Mooncake FAST'25 request traces (JSON lines: `timestamp` in ms,
// `input_length`, `output_length`, `hash_ids` of 512-token blocks). Each line becomes one
// record with a block-level prefix:
//   - only full blocks are prefix: a request's reusable prefix is its first
//     floor((input_length - 1) / block_tokens) blocks (at least one input token is always
//     computed), capped at the number of hash_ids; the rest of the input is the query;
//   - each block is split into block_tokens / chunk_tokens symbols (hash_id * split + j), so
//     the radix tree matches at chunk granularity; a block still matches only as a whole and
//     only if all earlier blocks match (prefix-contiguous), exactly as in Mooncake;
//   - importance payload none (an experiment names an importance model).
// Bad input throws TraceError "<file>:<line>: ..." (InputError for the options): bad JSON
// (values of any nesting depth are skipped without recursion), missing or negative fields,
// timestamps out of arrival order, a line over 1 MiB, a file without requests, and an output
// path naming the input. The input is read once, so a pipe works.

#include <cstdint>
#include <string>

#include "traces/trace_format.h"

namespace kvtier {

struct MooncakeImportOptions {
  int block_tokens = 512;
  int chunk_tokens = 512;  // must divide block_tokens
  ModelDescriptor model = {"opt-13b", 40, 40, 40};
};

struct MooncakeImportSummary {
  std::int64_t records = 0;
  std::uint64_t bytes = 0;
};

MooncakeImportSummary ImportMooncake(const std::string& jsonl_path, const std::string& out_path,
                                     const MooncakeImportOptions& options);

}  // namespace kvtier
