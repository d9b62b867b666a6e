// The "key=value key=value ..." text form shared by the trace models' parameter strings
// (ProceduralParams::Parse, DecodeModelParams::Parse): one splitter, so both read the same
// separators and reject a word without '=' with the same message.
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/errors.h"

namespace kvtier {

// Calls fn(key, value, item) for each whitespace-separated item of `text`, in order, where
// item is "key=value" split at its first '=' (the value may be empty or contain '='). Throws
// ConfigError "<where>: expected key=value, got '<item>'" for an item without '=', and
// "<where>: '<key>' given twice" for a repeated key (`seed=1 seed=2` ran with the last one,
// silently); whatever fn throws passes through.
template <typename Fn>
void ForEachKeyValue(const std::string& text, const std::string& where, Fn&& fn) {
  std::istringstream in(text);
  std::string item;
  std::vector<std::string> seen;
  while (in >> item) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw ConfigError(where + ": expected key=value, got '" + item + "'");
    }
    std::string key = item.substr(0, eq);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      throw ConfigError(where + ": '" + key + "' given twice");
    }
    seen.push_back(key);
    fn(key, item.substr(eq + 1), item);
  }
}

// A number's whole text (std::stod alone stops at the first character it cannot read:
// `tail=1.5x` read as 1.5). Throws std::invalid_argument, or std::out_of_range.
inline double ParseNumber(const std::string& v) {
  std::size_t used = 0;
  const double x = std::stod(v, &used);
  if (used != v.size()) throw std::invalid_argument(v);
  return x;
}

// A comma list of whole numbers ("0.9,0.8"); empty text gives an empty list.
inline std::vector<double> ParseNumbers(const std::string& value) {
  std::vector<double> out;
  std::istringstream vs(value);
  for (std::string v; std::getline(vs, v, ',');) out.push_back(ParseNumber(v));
  return out;
}

// A seed's text: digits only (std::stoull takes a sign: "-1" read as 2^64 - 1). Throws
// std::invalid_argument, or std::out_of_range past 2^64 - 1.
inline std::uint64_t ParseSeed(const std::string& v) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
    throw std::invalid_argument(v);
  }
  return std::stoull(v);
}

}  // namespace kvtier
