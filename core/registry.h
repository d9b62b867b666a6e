#pragma once
// Registration tables: each kind of policy (selectors, schedules, cache policies, prefetch
// modes) has one constexpr table of entries -- a config name, a factory or value, a one-line
// help -- in its own .cc file. Everything that lists the names is derived from that table:
// the config key's valid choices (core/config_keys.cc), `kvtier config --keys`, and the error
// an unknown name gets. No second list exists anywhere, and an unknown name is always an
// error, never a silent default. (LevelDB/Ramulator's explicit tables; no static
// self-registration.)

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/errors.h"

namespace kvtier {

// One valid name of a policy key and what it means, for listings.
struct Choice {
  std::string_view name;
  std::string_view help;
};

// The entry of `table` named `name`. Throws ConfigError "<key>: unknown <what> '<name>'
// (valid: a, b, c)" when there is none. Entry needs `name`.
template <typename Entry>
const Entry& FindEntry(std::span<const Entry> table, std::string_view name, std::string_view key,
                       std::string_view what) {
  for (const Entry& entry : table) {
    if (entry.name == name) return entry;
  }
  std::string valid;
  for (const Entry& entry : table) {
    if (!valid.empty()) valid += ", ";
    valid += entry.name;
  }
  throw ConfigError(std::string(key) + ": unknown " + std::string(what) + " '" + std::string(name) +
                    "' (valid: " + valid + ")");
}

// The names and helps of `table`, in table order. Entry needs `name` and `help`.
template <typename Entry>
std::vector<Choice> ChoicesOf(std::span<const Entry> table) {
  std::vector<Choice> out;
  for (const Entry& entry : table) out.push_back({entry.name, entry.help});
  return out;
}

}  // namespace kvtier
