#pragma once
// Request: what arrives at the serving system — a prefix (reusable context) and a query.
// The prefix is identified by symbols: token ids (tokens_per_symbol = 1) or block hashes of
// imported request traces (e.g. Mooncake's 512-token blocks, tokens_per_symbol = 512). Two
// requests share a stored prefix exactly as far as their symbol sequences agree.

#include <cstdint>
#include <vector>

#include "core/types.h"

namespace kvtier {

struct Request {
  RequestId id = 0;
  Seconds arrival_s = 0;                  // trace time of arrival
  std::vector<std::uint64_t> prefix;      // token ids or block hashes
  int tokens_per_symbol = 1;              // tokens one prefix symbol stands for
  std::int64_t query_tokens = 0;          // tokens after the prefix (never reused)
  std::int64_t output_tokens = 0;         // decode length when known (SpeCache, later)

  std::int64_t prefix_tokens() const {
    return static_cast<std::int64_t>(prefix.size()) * tokens_per_symbol;
  }
};

}  // namespace kvtier
