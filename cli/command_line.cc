#include "cli/command_line.h"

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

void ThrowCommandLineError(const std::string& command, const po::error& e,
                           const po::options_description& visible) {
  std::string what = std::string("command line: ") + e.what();
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
    throw InputError(std::string("command line: ") + e.what() + " (kvtier " + command + " --help)");
  }
}

}  // namespace kvtier::cli
