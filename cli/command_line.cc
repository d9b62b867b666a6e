#include "cli/command_line.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>

#include "core/errors.h"

namespace kvtier::cli {

namespace po = boost::program_options;

int CommandLineStyle() {
  return po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
}

std::string OptionNames(const po::options_description& options) {
  std::string names;
  for (const auto& o : options.options()) {
    const std::string name = o->canonical_display_name(po::command_line_style::allow_long);
    const std::string shorter =
        o->canonical_display_name(po::command_line_style::allow_dash_for_short);
    names += (names.empty() ? "" : ", ") + name;
    if (shorter.size() == 2 && shorter[0] == '-') names += " (" + shorter + ")";
  }
  return names;
}

namespace {

// Reads what boost keeps protected in error_with_option_name: the template, the substitutions
// and the canonical name and prefix, which its substitute_placeholders uses.
struct ErrorParts : po::error_with_option_name {
  static std::string Format(const po::error_with_option_name& e) {
    std::map<std::string, std::string> subs = e.*(&ErrorParts::m_substitutions);
    subs["canonical_option"] = (e.*(&ErrorParts::get_canonical_option_name))();
    subs["prefix"] = (e.*(&ErrorParts::get_canonical_option_prefix))();
    std::string text = e.m_error_template;
    // As boost: a placeholder whose value is missing or empty takes its default first.
    for (const auto& [name, from_to] : e.*(&ErrorParts::m_substitution_defaults)) {
      const auto it = subs.find(name);
      if (it != subs.end() && !it->second.empty()) continue;
      for (std::size_t at = text.find(from_to.first); at != std::string::npos;
           at = text.find(from_to.first, at + from_to.second.size())) {
        text.replace(at, from_to.first.size(), from_to.second);
      }
    }
    // One pass over the template: an inserted value is never searched again.
    std::string out;
    for (std::size_t i = 0; i < text.size();) {
      bool replaced = false;
      if (text[i] == '%') {
        for (const auto& [name, value] : subs) {
          if (text.compare(i + 1, name.size(), name) == 0 && i + 1 + name.size() < text.size() &&
              text[i + 1 + name.size()] == '%') {
            out += value;
            i += name.size() + 2;
            replaced = true;
            break;
          }
        }
      }
      if (!replaced) out += text[i++];
    }
    return out;
  }
  static bool HoldsPlaceholder(const po::error_with_option_name& e) {
    for (const auto& [name, value] : e.*(&ErrorParts::m_substitutions)) {
      if (value.find('%') != std::string::npos) return true;
    }
    return false;
  }
};

}  // namespace

std::string ErrorText(const po::error& e) {
  const auto* named = dynamic_cast<const po::error_with_option_name*>(&e);
  if (named == nullptr || !ErrorParts::HoldsPlaceholder(*named)) return e.what();
  return ErrorParts::Format(*named);
}

void ThrowCommandLineError(const std::string& command, const po::error& e,
                           const po::options_description& visible) {
  std::string what = std::string("command line: ") + ErrorText(e);
  if (dynamic_cast<const po::unknown_option*>(&e) != nullptr) {
    what += " (kvtier " + command + " takes " + OptionNames(visible) + ")";
  } else {
    what += " (kvtier " + command + " --help)";
  }
  throw InputError(what);
}

void StoreArgs(const std::string& command, const Args& args, const po::options_description& options,
               const po::options_description& visible, po::variables_map* vm,
               const po::positional_options_description* positional) {
  try {
    po::command_line_parser parser(args);
    parser.options(options).style(CommandLineStyle());
    if (positional != nullptr) parser.positional(*positional);
    po::store(parser.run(), *vm);
  } catch (const po::error& e) {
    ThrowCommandLineError(command, e, visible);
  }
}

void NotifyArgs(const std::string& command, po::variables_map* vm) {
  try {
    po::notify(*vm);
  } catch (const po::error& e) {
    throw InputError(std::string("command line: ") + ErrorText(e) + " (kvtier " + command +
                     " --help)");
  }
}

po::value_semantic* UnsignedValue(const std::string& name, std::uint64_t* var) {
  return po::value<std::string>()->notifier([name, var](const std::string& text) {
    std::uint64_t v = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, v);
    if (text.empty() || ptr != end || ec != std::errc()) {
      throw InputError(name + ": '" + text + "' is not a whole number in [0, " +
                       std::to_string(std::numeric_limits<std::uint64_t>::max()) + "]");
    }
    *var = v;
  });
}

void CheckOutputIsNotInput(const std::string& out, const char* flag, const std::string& in,
                           const char* what) {
  namespace fs = std::filesystem;
  if (out.empty() || in.empty()) return;
  std::error_code ec;
  const bool same =
      fs::absolute(out, ec).lexically_normal() == fs::absolute(in, ec).lexically_normal() ||
      fs::equivalent(out, in, ec);
  if (same) {
    throw InputError(out + ": " + flag + " is " + what + " " + in +
                     "; writing it would replace the input: name another output");
  }
}

void CheckOutputFile(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  if (path.empty()) throw InputError(std::string(flag) + ": an empty path names no file");
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    throw InputError(path + ": " + flag + " is a directory; name the file to write");
  }
  fs::path probe = p;
  if (!fs::exists(probe, ec)) {
    probe = p.has_parent_path() ? p.parent_path() : fs::path(".");
    while (!probe.empty() && !fs::exists(probe, ec)) probe = probe.parent_path();
    if (probe.empty()) probe = ".";
  }
  const auto fail = [&](const std::string& where, int err) {
    throw InputError(path + ": " + flag + " cannot be written (" + where + ": " +
                     std::strerror(err) + ")");
  };
  if (::access(probe.c_str(), W_OK) != 0) fail(probe.string(), errno);
  // access(2) answers yes to root for any writable-looking place: as root (CI, containers) a
  // path under /proc, or under a regular file, passed and failed after the work. So try what
  // the command will do: open the file for writing (without truncating it), or create and at
  // once remove a file beside where it will go.
  if (probe == p) {
    if (fs::is_regular_file(p, ec)) {
      const int fd = ::open(p.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) fail(p.string(), errno);
      ::close(fd);
    }
    return;
  }
  const fs::path trial = probe / (".kvtier-write-check-" + std::to_string(::getpid()));
  const int fd = ::open(trial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail(probe.string(), errno);
  ::close(fd);
  ::unlink(trial.c_str());
}

}  // namespace kvtier::cli
