// `kvtier config`: resolves an experiment file with its includes and command-line overrides,
// validates it by building the typed options, and prints the result with where each value
// came from (each system's, with --systems). `--keys` prints the key table; `--check`
// validates only. Its command line is every experiment command's (cli/experiment_args.h).

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/experiment_args.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "models/layer_table.h"

namespace kvtier::cli {
namespace {

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

// A policy key's choices come with one line each (their registration table's help): listed
// under the key, and in Markdown in its meaning cell.
void PrintKeys(bool markdown) {
  if (markdown) {
    std::printf("| key | type | default | choices | meaning |\n|---|---|---|---|---|\n");
    for (const KeySpec& k : AllKeys()) {
      std::string choices = KeyChoicesText(k);
      for (std::size_t i = 0; (i = choices.find('|', i)) != std::string::npos; i += 2) {
        choices.insert(i, "\\");  // a bare '|' would split the Markdown cell
      }
      std::string meaning = k.doc;
      for (const Choice& c : KeyChoices(k)) {
        if (!c.help.empty()) meaning += "<br>`" + std::string(c.name) + "`: " + std::string(c.help);
      }
      std::printf("| `%s` | %s | %s | %s | %s |\n", k.name, KeyTypeName(k.type),
                  DefaultText(k).c_str(), choices.c_str(), meaning.c_str());
    }
    return;
  }
  std::printf("%-28s %-9s %-12s %-16s %s\n", "key", "type", "default", "choices", "meaning");
  for (const KeySpec& k : AllKeys()) {
    const std::string choices = KeyChoicesText(k);
    std::printf("%-28s %-9s %-12s %-16s %s\n", k.name, KeyTypeName(k.type),
                DefaultText(k).c_str(), choices.empty() ? "-" : choices.c_str(), k.doc);
    for (const Choice& c : KeyChoices(k)) {
      if (c.help.empty()) continue;
      std::printf("%-28s   %-10.*s %.*s\n", "", int(c.name.size()), c.name.data(),
                  int(c.help.size()), c.help.data());
    }
  }
}

}  // namespace

int RunConfig(const Args& args) {
  ExperimentArgs a({.name = "config",
                    .about = "Prints the resolved configuration (defaults < model < hardware < "
                             "system < experiment\n< command line) after validating it, with where "
                             "each value came from. With --systems,\neach system's configuration "
                             "as kvtier sim would run it. Exit 2 on any configuration error.",
                    .synopsis = "[--check] [--no-origins]",
                    .runs = false,
                    .config_optional_with = "keys",
                    .more_usage = "kvtier config --keys [--markdown]"});
  a.AddOptions()("keys", "print every configuration key (name, type, default, choices, meaning)")(
      "markdown", "with --keys: print a Markdown table")("check", "validate only; print \"ok\"")(
      "no-origins", "print values without where they came from");
  if (!a.Parse(args)) return 0;
  if (a.vm().count("keys")) {
    PrintKeys(a.vm().count("markdown") > 0);
    return 0;
  }
  // Without --systems: the experiment as written; with it, what each system's run would use.
  std::vector<std::pair<std::string, Config>> configs;
  if (a.vm().count("systems")) {
    for (const std::string& system : a.Systems()) {
      configs.emplace_back(system, a.SystemConfig(system));
    }
  } else {
    Config config = a.Base();
    BuildOptions(config);  // throws ConfigError on values the typed options reject
    configs.emplace_back("", std::move(config));
  }
  if (a.vm().count("check")) {
    // The measured layer table is part of the hardware profile: a malformed one passed the
    // check and failed `kvtier sim` (same message as there, sim/simulate.cc).
    for (const auto& [system, config] : configs) {
      const ExperimentOptions o = BuildOptions(config);
      try {
        (void)ComputeTimer::FromOptions(o.model, o.hardware);
      } catch (const ConfigError& e) {
        throw ConfigError(config.Where("gpu.layer_table") + ": " + e.what());
      }
    }
    std::printf("ok\n");
    return 0;
  }
  const bool origins = a.vm().count("no-origins") == 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const auto& [system, config] = configs[i];
    if (!system.empty()) std::printf("%s; system %s\n", i == 0 ? "" : "\n", system.c_str());
    if (origins) {
      std::string files;
      for (const std::string& f : config.files()) files += (files.empty() ? "" : ", ") + f;
      std::printf("; read from: %s\n", files.c_str());
    }
    std::fputs(config.Dump(origins).c_str(), stdout);
  }
  return 0;
}

}  // namespace kvtier::cli
