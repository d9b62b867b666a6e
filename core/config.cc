#include "core/config.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>

#include <boost/program_options.hpp>

#include "core/errors.h"
#include "core/input_file.h"
#include "core/units.h"

namespace kvtier {
namespace po = boost::program_options;
namespace fs = std::filesystem;

std::string StripIniComments(std::istream& in, const std::string& path) {
  std::string out;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    out += line.substr(0, line.find_first_of("#;"));
    // An empty section name: Boost takes "[]" as the section "", reads the character before
    // the empty name (undefined behaviour) and names the keys below it ".key".
    const std::size_t b = out.find_last_of('\n') + 1;  // this line's start (npos + 1 = 0)
    const std::size_t open = out.find_first_not_of(" \t\r", b);
    const std::size_t close = out.find_last_not_of(" \t\r");
    if (open != std::string::npos && close != std::string::npos && close > open &&
        out[open] == '[' && out[close] == ']' &&
        out.find_first_not_of(" \t\r", open + 1) == close) {
      throw ConfigError(path + ":" + std::to_string(number) + ": empty section name '" +
                        out.substr(open, close - open + 1) + "' (expected '[section]')");
    }
    out += '\n';
  }
  return out;
}

const KeySpec* FindKey(std::string_view name) {
  for (const KeySpec& spec : AllKeys()) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

std::vector<Choice> KeyChoices(const KeySpec& spec) {
  if (spec.type != KeyType::kEnum) return {};
  if (spec.policies != nullptr) return spec.policies();
  std::vector<Choice> out;
  std::string_view rest = spec.choices != nullptr ? spec.choices : "";
  while (!rest.empty()) {
    const std::size_t bar = rest.find('|');
    out.push_back({rest.substr(0, bar), {}});
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  return out;
}

std::string KeyChoicesText(const KeySpec& spec) {
  std::string out;
  for (const Choice& c : KeyChoices(spec)) {
    if (!out.empty()) out += '|';
    out += c.name;
  }
  return out;
}

namespace {

// What replaced a removed key (or a removed value of `key` when `value` is given), or nullptr.
const RemovedKey* FindRemoved(std::string_view key, const std::string* value = nullptr) {
  for (const RemovedKey& r : RemovedKeys()) {
    if (key != r.name) continue;
    if (r.value == nullptr || (value != nullptr && *value == r.value)) return &r;
  }
  return nullptr;
}

// The error for a key that is not in the table: what replaced it if it was removed.
std::string UnknownKey(const std::string& where, const std::string& key) {
  if (const RemovedKey* r = FindRemoved(key); r != nullptr && r->value == nullptr) {
    return where + ": key '" + key + "' no longer exists: write " + r->replacement +
           " instead (docs/configuration.md)";
  }
  return where + ": unknown key '" + key + "' (kvtier config --keys lists every key)";
}

}  // namespace

void ValidateValue(const KeySpec& spec, const std::string& text) {
  switch (spec.type) {
    case KeyType::kString:
    case KeyType::kPath:
      return;
    case KeyType::kInt:
      ParseInt(text);
      return;
    case KeyType::kDouble:
      ParseDouble(text);
      return;
    case KeyType::kBool:
      ParseBool(text);
      return;
    case KeyType::kBytes:
      ParseBytes(text);
      return;
    case KeyType::kBandwidth:
      ParseBandwidth(text);
      return;
    case KeyType::kDuration:
      ParseDuration(text);
      return;
    case KeyType::kRate:
      ParseRate(text);
      return;
    case KeyType::kEnum: {
      std::string valid;
      for (const Choice& c : KeyChoices(spec)) {
        if (c.name == text) return;
        valid += (valid.empty() ? "" : ",") + std::string(c.name);
      }
      std::string message = "'" + text + "' is not one of: " + valid;
      if (const RemovedKey* r = FindRemoved(spec.name, &text); r != nullptr) {
        message += " (" + std::string(spec.name) + " = " + text + " was replaced by " +
                   r->replacement + ")";
      }
      throw std::invalid_argument(message);
    }
  }
}

bool SameValue(const KeySpec& spec, const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    switch (spec.type) {
      case KeyType::kString:
      case KeyType::kPath:
      case KeyType::kEnum:
        return false;
      case KeyType::kInt:
        return ParseInt(a) == ParseInt(b);
      case KeyType::kDouble:
        return ParseDouble(a) == ParseDouble(b);
      case KeyType::kBool:
        return ParseBool(a) == ParseBool(b);
      case KeyType::kBytes:
        return ParseBytes(a) == ParseBytes(b);
      case KeyType::kBandwidth:
        return ParseBandwidth(a) == ParseBandwidth(b);
      case KeyType::kDuration:
        return ParseDuration(a) == ParseDuration(b);
      case KeyType::kRate:
        return ParseRate(a) == ParseRate(b);
    }
  } catch (const std::invalid_argument&) {
  }
  return false;
}

namespace {

std::string Trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Maps each dotted key of an INI text to the line it is on (Boost does not report lines).
std::map<std::string, int> KeyLines(const std::string& text) {
  std::map<std::string, int> lines;
  std::istringstream in(text);
  std::string line, section;
  for (int number = 1; std::getline(in, line); ++number) {
    std::string t = Trim(line.substr(0, line.find_first_of("#;")));
    if (t.empty()) continue;
    if (t.front() == '[' && t.back() == ']') {
      section = Trim(t.substr(1, t.size() - 2));
      continue;
    }
    auto eq = t.find('=');
    if (eq == std::string::npos) continue;
    std::string key = Trim(t.substr(0, eq));
    std::string full = section.empty() ? key : section + "." + key;
    lines.emplace(full, number);  // first occurrence
  }
  return lines;
}

// Finds the first syntactically broken line (number and text), for Boost's "invalid line"
// errors; {0, ""} if none is found.
std::pair<int, std::string> FirstBadLine(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::string t = Trim(line.substr(0, line.find_first_of("#;")));
    if (t.empty()) continue;
    if (t.front() == '[' && t.back() == ']') continue;
    if (t.find('=') == std::string::npos) return {number, line};
  }
  return {0, ""};
}

// The text of an INI file, read once (a FIFO works; /dev/zero and directories are errors,
// core/input_file.h), with a UTF-8 byte-order mark dropped (editors on Windows write one) and
// NUL bytes refused (Boost would cut the value at one, silently).
std::string ReadIniText(const std::string& path) {
  std::string text = ReadInputFile(path, kMaxConfigFileBytes, "configuration file",
                                   InputKind::kConfig);
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  if (const auto nul = text.find('\0'); nul != std::string::npos) {
    const int line = 1 + int(std::count(text.begin(), text.begin() + std::ptrdiff_t(nul), '\n'));
    throw ConfigError(path + ":" + std::to_string(line) +
                      ": contains a NUL byte (is it a text file?)");
  }
  return text;
}

// Built once: ~100 option descriptions, each a few allocations, were rebuilt for every file read
// (four per experiment, more per sweep point). Read-only after construction.
const po::options_description& KeyTable() {
  static const po::options_description* const desc = [] {
    auto* d = new po::options_description;
    for (const KeySpec& spec : AllKeys()) {
      d->add_options()(spec.name, po::value<std::string>(), spec.doc);
    }
    return d;
  }();
  return *desc;
}

struct FileEntry {
  std::string key;
  std::string value;
  std::string origin;
};

// Reads one INI file into (key, value, origin) entries, rejecting unknown keys, bad values and
// keys set twice. `allow_include` is true for the experiment file only.
std::vector<FileEntry> ReadIni(const std::string& path, bool allow_include) {
  const std::string text = ReadIniText(path);
  auto lines = KeyLines(text);
  auto origin = [&](const std::string& key) {
    auto it = lines.find(key);
    return it == lines.end() ? path : path + ":" + std::to_string(it->second);
  };
  std::istringstream raw(text);
  std::stringstream stripped(StripIniComments(raw, path));
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::parse_config_file(stripped, KeyTable(), /*allow_unregistered=*/true);
  } catch (const po::error&) {
    // The message is ours: Boost's what() substitutes the line into its template until no
    // placeholder is left, so a line holding "%invalid_line%" never finished (the config fuzz
    // target's hang: `kvtier config` on the 20 bytes "%invalid_line%[lu\v\v" ran forever).
    const auto [bad, line] = FirstBadLine(text);
    if (bad == 0) {
      throw ConfigError(path + ": cannot be parsed as an INI file (expected 'key = value' "
                        "lines and '[section]' headers)");
    }
    std::string shown;  // control characters escaped, long lines cut
    for (const unsigned char ch : line.substr(0, 200)) {
      if ((ch < 0x20 && ch != '\t') || ch == 0x7F) {
        static const char kHex[] = "0123456789abcdef";
        shown += {'\\', 'x', kHex[ch >> 4], kHex[ch & 15]};
      } else {
        shown += char(ch);
      }
    }
    if (line.size() > 200) shown += "...";
    throw ConfigError(path + ":" + std::to_string(bad) + ": invalid line '" + shown +
                      "' (expected 'key = value' or '[section]')");
  }
  std::vector<FileEntry> entries;
  std::set<std::string> seen;
  for (const po::option& opt : parsed.options) {
    const std::string& key = opt.string_key;
    if (opt.unregistered || FindKey(key) == nullptr) {
      throw ConfigError(UnknownKey(origin(key), key));
    }
    if (!allow_include && key.rfind("include.", 0) == 0) {
      throw ConfigError(origin(key) + ": " + key +
                        ": only experiment files may include other files");
    }
    if (!seen.insert(key).second) {
      throw ConfigError(origin(key) + ": key '" + key + "' is set twice in this file");
    }
    std::string value = opt.value.empty() ? std::string() : Trim(opt.value.front());
    // Boost keeps inline comments; strip them as INI users expect.
    auto hash = value.find_first_of("#;");
    if (hash != std::string::npos) value = Trim(value.substr(0, hash));
    try {
      ValidateValue(*FindKey(key), value);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(origin(key) + ": " + key + ": " + e.what());
    }
    entries.push_back({key, value, origin(key)});
  }
  return entries;
}

std::pair<std::string, std::string> SplitOverride(const std::string& raw) {
  std::string s = raw;
  while (!s.empty() && s.front() == '-') s.erase(s.begin());
  auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("command line: '" + raw + "': expected --key=value");
  }
  return {Trim(s.substr(0, eq)), Trim(s.substr(eq + 1))};
}

// Resolves `[include] kind = value` relative to the experiment file.
std::string ResolveInclude(const std::string& kind_dir, const std::string& value,
                           const std::string& experiment_path, const std::string& origin) {
  fs::path base = fs::path(experiment_path).parent_path();
  fs::path candidate;
  const bool is_path = value.find('/') != std::string::npos ||
                       (value.size() > 4 && value.substr(value.size() - 4) == ".ini");
  if (is_path) {
    candidate = fs::path(value).is_absolute() ? fs::path(value) : base / value;
  } else {
    candidate = fs::path(FindConfigDir(experiment_path)) / kind_dir / (value + ".ini");
  }
  const std::string key =
      "include." + (kind_dir == "hardware" ? kind_dir : kind_dir.substr(0, kind_dir.size() - 1));
  // With an error_code: a name the file system refuses (longer than NAME_MAX, say) is the
  // value's error, not an internal one (fs::exists threw filesystem_error: the config fuzz
  // target's crash, `kvtier config` exit 1).
  std::error_code ec;
  const bool exists = fs::exists(candidate, ec);
  if (ec) {
    throw ConfigError(origin + ": " + key + ": cannot use " + candidate.string() + ": " +
                      ec.message());
  }
  if (!exists) {
    std::string known;
    for (const auto& n : IncludableNames(FindConfigDir(experiment_path), kind_dir)) {
      known += (known.empty() ? "" : ", ") + n;
    }
    throw ConfigError(origin + ": " + key + ": no file " + candidate.string() +
                      (known.empty() ? "" : " (known: " + known + ")"));
  }
  return candidate.lexically_normal().string();
}

}  // namespace

std::vector<std::string> IncludableNames(const std::string& config_dir,
                                         std::string_view kind_dir) {
  std::vector<std::string> names;
  const fs::path dir = fs::path(config_dir) / kind_dir;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".ini") names.push_back(e.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string FindConfigDir(const std::string& near_path) {
  if (const char* env = std::getenv("KVTIER_CONFIG_DIR"); env && *env) return env;
  std::error_code ec;
  fs::path p = fs::absolute(near_path.empty() ? fs::current_path() : fs::path(near_path), ec);
  for (; !p.empty() && p != p.root_path(); p = p.parent_path()) {
    if (p.filename() == "configs" && fs::is_directory(p / "models", ec)) return p.string();
    if (fs::is_directory(p / "configs" / "models", ec)) return (p / "configs").string();
  }
#ifdef KVTIER_DEFAULT_CONFIG_DIR
  return KVTIER_DEFAULT_CONFIG_DIR;
#else
  return "configs";
#endif
}

Config::Config() {
  for (const KeySpec& spec : AllKeys()) {
    if (spec.default_value != nullptr) values_[spec.name] = Value{spec.default_value, "default"};
  }
}

void Config::Set(const std::string& key, const std::string& text, const std::string& origin) {
  const KeySpec* spec = FindKey(key);
  if (spec == nullptr) throw ConfigError(UnknownKey(origin, key));
  try {
    ValidateValue(*spec, text);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(origin + ": " + key + ": " + e.what());
  }
  values_[key] = Value{text, origin};
}

Config Config::FromOverrides(const std::vector<std::string>& overrides) {
  Config config;
  for (const std::string& raw : overrides) {
    auto [key, value] = SplitOverride(raw);
    config.Set(key, value, "command line");
  }
  return config;
}

Config Config::Load(const std::string& experiment_path, const std::vector<std::string>& overrides) {
  Config config;
  std::map<std::string, std::string> cli;
  for (const std::string& raw : overrides) {
    auto [key, value] = SplitOverride(raw);
    if (FindKey(key) == nullptr) throw ConfigError(UnknownKey("command line", key));
    cli[key] = value;
  }
  std::vector<FileEntry> experiment = ReadIni(experiment_path, /*allow_include=*/true);
  config.files_.push_back(experiment_path);

  // Includes, weakest first: model, hardware, system.
  static const std::pair<const char*, const char*> kIncludes[] = {
      {"include.model", "models"}, {"include.hardware", "hardware"}, {"include.system", "systems"}};
  for (const auto& [key, dir] : kIncludes) {
    std::string value, origin;
    if (auto it = cli.find(key); it != cli.end()) {
      value = it->second;
      origin = "command line";
    } else {
      for (const FileEntry& e : experiment) {
        if (e.key == key) {
          value = e.value;
          origin = e.origin;
        }
      }
    }
    if (value.empty()) continue;
    std::string path = ResolveInclude(dir, value, experiment_path, origin);
    config.files_.push_back(path);
    for (const FileEntry& e : ReadIni(path, /*allow_include=*/false)) {
      config.values_[e.key] = Value{e.value, e.origin};
    }
  }
  for (const FileEntry& e : experiment) config.values_[e.key] = Value{e.value, e.origin};
  for (const auto& [key, value] : cli) config.Set(key, value, "command line");
  return config;
}

bool Config::Has(std::string_view key) const { return values_.find(key) != values_.end(); }

const Config::Value& Config::Get(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    throw ConfigError(std::string(key) + ": required key is not set (set it in the experiment "
                      "file or with --" + std::string(key) + "=...)");
  }
  return it->second;
}

std::string Config::Where(std::string_view key) const {
  auto it = values_.find(key);
  std::string origin = it == values_.end() ? "configuration" : it->second.origin;
  return origin + ": " + std::string(key);
}

std::string Config::Where(std::string_view key, std::string_view related) const {
  auto it = values_.find(key);
  auto rel = values_.find(related);
  std::string out = it == values_.end() ? "configuration: " + std::string(key)
                                        : it->second.origin + ": " + std::string(key) + " = " +
                                              it->second.text;
  if (rel != values_.end()) {
    out += " (with " + std::string(related) + " = " + rel->second.text + " from " +
           rel->second.origin + ")";
  }
  return out;
}

namespace {
template <typename F>
auto Typed(const Config& c, std::string_view key, F parse) {
  const auto& v = c.Get(key);
  try {
    return parse(v.text);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(c.Where(key) + ": " + e.what());
  }
}
}  // namespace

std::string Config::GetString(std::string_view key) const { return Get(key).text; }
long long Config::GetInt(std::string_view key) const {
  return Typed(*this, key, [](const std::string& t) { return ParseInt(t); });
}
double Config::GetDouble(std::string_view key) const {
  return Typed(*this, key, [](const std::string& t) { return ParseDouble(t); });
}
bool Config::GetBool(std::string_view key) const {
  return Typed(*this, key, [](const std::string& t) { return ParseBool(t); });
}
Bytes Config::GetBytes(std::string_view key) const {
  return Typed(*this, key, [](const std::string& t) { return ParseBytes(t); });
}
double Config::GetBandwidth(std::string_view key) const {
  return Typed(*this, key, [](const std::string& t) { return ParseBandwidth(t); });
}
Seconds Config::GetDuration(std::string_view key) const {
  return Typed(*this, key, [](const std::string& t) { return ParseDuration(t); });
}
double Config::GetRate(std::string_view key) const {
  return Typed(*this, key, [](const std::string& t) { return ParseRate(t); });
}

std::string Config::Dump(bool with_origins) const {
  std::size_t width = 0;
  for (const auto& [key, value] : values_) width = std::max(width, key.size() + value.text.size());
  std::string out;
  for (const auto& [key, value] : values_) {
    std::string line = key + " = " + value.text;
    if (with_origins) {
      line.resize(std::max(line.size(), width + 5), ' ');
      line += "  ; " + value.origin;
    }
    out += line + "\n";
  }
  return out;
}

std::string ExpandHome(const std::string& path) {
  const char* home = std::getenv("HOME");
  if (home == nullptr || path.rfind("~/", 0) != 0) return path;
  return std::string(home) + path.substr(1);
}

}  // namespace kvtier
