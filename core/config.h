#pragma once
// Config: the fully resolved key/value configuration of one run, with where each value came
// from. Experiment files are INI files read with Boost.Program_options; a section and a key
// join with a dot (`[cache] gpu_capacity = 10GiB` -> `cache.gpu_capacity`), and the same keys
// override from the command line (`--cache.gpu_capacity=4GiB`).
//
// An experiment file may name a model, a hardware profile and a system to include:
//   [include]
//   model = opt-13b              ; configs/models/opt-13b.ini (or a path ending in .ini)
//   hardware = a100-pcie4-nvme   ; configs/hardware/...
//   system = spec                ; configs/systems/...
// Precedence, strongest first: command line, the experiment file, the system file, the
// hardware file, the model file, the defaults of the key table (core/config_keys.cc).
//
// Every key must be in the key table; unknown keys, values that do not parse as the key's
// type, and keys set twice in one file are ConfigErrors naming the file, line and key. The
// resolved configuration (`Dump`) is what runs store, so a result row can be reproduced.

#include <istream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/registry.h"
#include "core/types.h"

namespace kvtier {

enum class KeyType { kString, kInt, kDouble, kBool, kBytes, kBandwidth, kDuration, kRate, kEnum,
                     kPath };

struct KeySpec {
  const char* name;           // "cache.gpu_capacity"
  KeyType type;
  const char* default_value;  // nullptr: no default (Has() is false until set)
  const char* choices;        // kEnum with a fixed list: "opt|llama"; otherwise nullptr
  const char* doc;            // one line, with the unit
  // kEnum naming a policy: its registration table's names and helps (core/registry.h), the
  // only list of them; `choices` is then nullptr.
  std::vector<Choice> (*policies)() = nullptr;
};

// The one table of every configuration key (core/config_keys.cc).
std::span<const KeySpec> AllKeys();
const KeySpec* FindKey(std::string_view name);

// The valid values of a kEnum key, in order, with their one-line helps when the key names a
// policy (empty helps for a fixed list). Empty for other types.
std::vector<Choice> KeyChoices(const KeySpec& spec);
// "a|b|c": the valid values of a kEnum key; empty for other types.
std::string KeyChoicesText(const KeySpec& spec);

// A key that no longer exists and what replaced it ("itf.enabled" -> "select.policy = itf"),
// or a value of a key that was moved elsewhere ("prefetch.mode = cake" -> "schedule.policy =
// cake"). Setting one is a ConfigError saying so.
struct RemovedKey {
  const char* name;
  const char* value;        // nullptr: any value of the key
  const char* replacement;  // what to write instead
};
std::span<const RemovedKey> RemovedKeys();

// The names (file stems, sorted) of the .ini files in `config_dir`/`kind_dir`/ that an
// experiment can include by name (kind_dir: "models", "hardware", "systems").
std::vector<std::string> IncludableNames(const std::string& config_dir,
                                         std::string_view kind_dir);

class Config {
 public:
  struct Value {
    std::string text;    // as written (trimmed)
    std::string origin;  // "configs/x.ini:12", "command line", "default"
  };

  // Defaults only.
  Config();

  // Loads `experiment_path` with its includes and then `overrides` ("key=value" or
  // "--key=value"). Throws ConfigError with file, line and key.
  static Config Load(const std::string& experiment_path, const std::vector<std::string>& overrides);
  // Defaults plus `overrides`; for tests and runs without a file.
  static Config FromOverrides(const std::vector<std::string>& overrides);

  // Sets `key` (validated against the key table) from `origin`.
  void Set(const std::string& key, const std::string& text, const std::string& origin);

  bool Has(std::string_view key) const;
  const Value& Get(std::string_view key) const;  // throws ConfigError if unset

  // Typed getters; the value was validated when set, so these only fail on programming errors
  // (asking for a key of another type) or unset keys without default (ConfigError).
  std::string GetString(std::string_view key) const;
  long long GetInt(std::string_view key) const;
  double GetDouble(std::string_view key) const;
  bool GetBool(std::string_view key) const;
  Bytes GetBytes(std::string_view key) const;
  double GetBandwidth(std::string_view key) const;  // bytes/s
  Seconds GetDuration(std::string_view key) const;
  double GetRate(std::string_view key) const;       // 1/s

  // "key = value    ; origin" lines, sorted by key; what `kvtier config` prints.
  std::string Dump(bool with_origins = true) const;
  // Files this configuration was read from (experiment first, then includes).
  const std::vector<std::string>& files() const { return files_; }
  // A ConfigError message prefix for `key`: "file:line: key" or "command line: key".
  std::string Where(std::string_view key) const;
  // The same for a check of `key` against `related`, naming where each was set, so the file
  // that set the offending value is named whichever of the two it is:
  // "models/m.ini:6: model.kv_heads = 32 (with model.heads = 33 from exp.ini:4)".
  std::string Where(std::string_view key, std::string_view related) const;

 private:
  std::map<std::string, Value, std::less<>> values_;
  std::vector<std::string> files_;
};

// INI text of `in` with ';' and '#' comments (whole-line and inline) cut, one output line per
// input line so line numbers still match. Boost.Program_options only knows '#' comments; every
// kvtier INI reader goes through this. An empty section header ("[]") is a ConfigError naming
// `path` and the line (Boost's reader has undefined behaviour on it).
std::string StripIniComments(std::istream& in, const std::string& path);

// Validates `text` against `spec`; throws std::invalid_argument saying what was expected.
void ValidateValue(const KeySpec& spec, const std::string& text);
// Whether `a` and `b` are one value of `spec`'s type written two ways ("0.5" and "0.50",
// "1GiB" and "1024MiB", "30s" and "30000ms", "true" and "1"); text equality for strings,
// paths and enums. False when either is not a valid value (its own error comes elsewhere).
bool SameValue(const KeySpec& spec, const std::string& a, const std::string& b);

// The directory holding models/, hardware/, systems/ (and experiments/): $KVTIER_CONFIG_DIR,
// else the nearest ancestor `configs/` of `near_path`, else the source tree's configs/.
std::string FindConfigDir(const std::string& near_path);

// `path` with a leading "~/" replaced by $HOME/ (unchanged without one, or without $HOME).
std::string ExpandHome(const std::string& path);

}  // namespace kvtier
