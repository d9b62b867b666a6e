// `kvtier config`: resolves an experiment file with its includes and command-line overrides,
// validates it by building the typed options, and prints the result with where each value
// came from. `--keys` prints the key table; `--check` validates only.

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "cli/commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"

namespace kvtier::cli {
namespace {

namespace po = boost::program_options;

const char* KeyTypeName(KeyType type) {
  switch (type) {
    case KeyType::kString: return "string";
    case KeyType::kInt: return "int";
    case KeyType::kDouble: return "double";
    case KeyType::kBool: return "bool";
    case KeyType::kBytes: return "bytes";
    case KeyType::kBandwidth: return "bandwidth";
    case KeyType::kDuration: return "duration";
    case KeyType::kRate: return "rate";
    case KeyType::kEnum: return "enum";
    case KeyType::kPath: return "path";
  }
  return "?";
}

std::string DefaultText(const KeySpec& spec) {
  if (spec.default_value == nullptr) return "(none)";
  if (*spec.default_value == '\0') return "\"\"";
  return spec.default_value;
}

void PrintKeys(bool markdown) {
  if (markdown) {
    std::printf("| key | type | default | choices | meaning |\n|---|---|---|---|---|\n");
    for (const KeySpec& k : AllKeys()) {
      std::string choices = k.choices ? k.choices : "";
      for (std::size_t i = 0; (i = choices.find('|', i)) != std::string::npos; i += 2) {
        choices.insert(i, "\\");  // a bare '|' would split the Markdown cell
      }
      std::printf("| `%s` | %s | %s | %s | %s |\n", k.name, KeyTypeName(k.type),
                  DefaultText(k).c_str(), choices.c_str(), k.doc);
    }
    return;
  }
  std::printf("%-28s %-9s %-12s %-16s %s\n", "key", "type", "default", "choices", "meaning");
  for (const KeySpec& k : AllKeys()) {
    std::printf("%-28s %-9s %-12s %-16s %s\n", k.name, KeyTypeName(k.type),
                DefaultText(k).c_str(), k.choices ? k.choices : "-", k.doc);
  }
}

}  // namespace

int RunConfig(const Args& args) {
  po::options_description desc(
      "usage: kvtier config --config EXPERIMENT.ini [--section.key=value ...] [options]\n"
      "       kvtier config --keys [--markdown]\n\n"
      "Prints the resolved configuration (defaults < model < hardware < system < experiment\n"
      "< command line) after validating it. Exit 2 on any configuration error.\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("config", po::value<std::string>(), "experiment INI file")
      ("keys", "print every configuration key (name, type, default, choices, meaning)")
      ("markdown", "with --keys: print a Markdown table")
      ("check", "validate only; print \"ok\"")
      ("no-origins", "print values without where they came from");

  po::variables_map vm;
  std::vector<std::string> overrides;
  try {
    // No guessing: `--c...` must never be mistaken for an abbreviation of --config/--check.
    const int style = po::command_line_style::default_style &
                      ~po::command_line_style::allow_guessing;
    po::parsed_options parsed =
        po::command_line_parser(args).options(desc).style(style).allow_unregistered().run();
    po::store(parsed, vm);
    po::notify(vm);
    overrides = po::collect_unrecognized(parsed.options, po::include_positional);
  } catch (const po::error& e) {
    throw InputError(std::string(e.what()) + " (kvtier config --help)");
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (vm.count("keys")) {
    PrintKeys(vm.count("markdown") > 0);
    return 0;
  }
  for (const std::string& o : overrides) {
    if (o.rfind("--", 0) != 0 || o.find('=') == std::string::npos) {
      throw InputError("unexpected argument '" + o +
                       "': overrides are written --section.key=value (kvtier config --help)");
    }
  }
  if (!vm.count("config")) {
    throw InputError("--config EXPERIMENT.ini is required (kvtier config --help)");
  }

  const Config config = Config::Load(vm["config"].as<std::string>(), overrides);
  BuildOptions(config);  // throws ConfigError on values the typed options reject
  if (vm.count("check")) {
    std::printf("ok\n");
    return 0;
  }
  const bool origins = vm.count("no-origins") == 0;
  if (origins) {
    std::string files;
    for (const std::string& f : config.files()) files += (files.empty() ? "" : ", ") + f;
    std::printf("; read from: %s\n", files.c_str());
  }
  std::fputs(config.Dump(origins).c_str(), stdout);
  return 0;
}

}  // namespace kvtier::cli
