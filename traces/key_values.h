// The "key=value key=value ..." text form shared by the trace models' parameter strings
// (ProceduralParams::Parse, DecodeModelParams::Parse): one splitter, so both read the same
// separators and reject a word without '=' with the same message.
#pragma once

#include <sstream>
#include <string>

#include "core/errors.h"

namespace kvtier {

// Calls fn(key, value, item) for each whitespace-separated item of `text`, in order, where
// item is "key=value" split at its first '=' (the value may be empty or contain '='). Throws
// ConfigError "<where>: expected key=value, got '<item>'" for an item without '='; whatever fn
// throws passes through.
template <typename Fn>
void ForEachKeyValue(const std::string& text, const std::string& where, Fn&& fn) {
  std::istringstream in(text);
  std::string item;
  while (in >> item) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw ConfigError(where + ": expected key=value, got '" + item + "'");
    }
    fn(item.substr(0, eq), item.substr(eq + 1), item);
  }
}

}  // namespace kvtier
