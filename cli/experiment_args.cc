#include "cli/experiment_args.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "analysis/results_db.h"
#include "cli/command_line.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "core/options.h"

namespace kvtier::cli {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string Section(const std::string& key) { return key.substr(0, key.find('.')); }

}  // namespace

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

std::string ResolveTrace(const Config& config, const std::string& experiment_path) {
  std::string trace = config.GetString("workload.trace");
  if (trace.empty()) {
    throw ConfigError(experiment_path +
                      ": workload.trace: no trace given (generate one with "
                      "`kvtier trace gen`, or import one with `kvtier trace import-mooncake`)");
  }
  trace = ExpandHome(trace);
  fs::path p(trace);
  if (p.is_relative() && !fs::exists(p)) {
    fs::path near = fs::path(experiment_path).parent_path() / p;
    if (fs::exists(near)) p = near;
  }
  if (!fs::exists(p)) throw ConfigError(config.Where("workload.trace") + ": no file " + trace);
  // Before any child starts: a trace is read several times (a FIFO would hang the run).
  RequireRegularFile(p.string(), "trace file", InputKind::kTrace);
  return p.string();
}

void CheckKnownKey(const std::string& key, const std::string& where) {
  if (FindKey(key) != nullptr) return;
  const std::string section = Section(key);
  std::vector<std::string> same_section, sections;
  for (const KeySpec& k : AllKeys()) {
    const std::string name = k.name;
    if (Section(name) == section) same_section.push_back(name);
    if (std::find(sections.begin(), sections.end(), Section(name)) == sections.end()) {
      sections.push_back(Section(name));
    }
  }
  const std::string known = !same_section.empty()
                                ? "keys in [" + section + "]: " + Join(same_section)
                                : "sections: " + Join(sections);
  throw ConfigError(where + ": unknown key '" + key + "' (" + known +
                    "; kvtier config --keys lists every key)");
}

void CheckOverride(const std::string& word, const std::string& command, const std::string& flags) {
  const std::string takes =
      "kvtier " + command + " takes " + flags + ", and --section.key=value overrides";
  if (word.empty() || word[0] != '-') {
    throw InputError("command line: unexpected argument '" + word + "' (" + takes + ")");
  }
  const std::size_t eq = word.find('=');
  const std::string flag = word.substr(0, eq);  // "--cache.policy", "--c", "-x"
  const std::size_t dashes = std::min(flag.find_first_not_of('-'), flag.size());
  const std::string name = flag.substr(dashes);
  // Every key has a section, so a name without a dot was meant as one of the command's flags.
  if (name.find('.') == std::string::npos) {
    throw InputError("command line: unknown option '" + flag + "' (" + takes + ")");
  }
  if (dashes != 2) {
    throw InputError("command line: '" + word + "': an override is written --section.key=value");
  }
  CheckKnownKey(name, "command line");
  if (eq == std::string::npos) {
    throw InputError("command line: '" + word + "': an override is one word, --" + name + "=VALUE");
  }
}

ExperimentArgs::ExperimentArgs(const ExperimentCommand& command) : command_(command) {
  const std::string config_help = command_.config_optional_with == nullptr
                                      ? "experiment INI file (required)"
                                      : std::string("experiment INI file (required unless --") +
                                            command_.config_optional_with + ")";
  common_.add_options()("help,h", "show this help")(
      "config", po::value(&config_path_)->value_name("X.ini"), config_help.c_str())(
      "systems", po::value(&systems_)->value_name("a,b"),
      command_.runs ? "systems to run, comma-separated (default: experiment.systems, else "
                      "include.system)"
                    : "each of these systems' configuration, comma-separated");
  if (command_.runs) {
    const std::string out_help =
        command_.out_optional_with == nullptr
            ? "results SQLite file, created or appended (required)"
            : std::string("results SQLite file, created or appended (required unless --") +
                  command_.out_optional_with + ")";
    common_.add_options()("out", po::value(&out_)->value_name("R.sqlite"), out_help.c_str())(
        "jobs,j", po::value(&jobs_)->default_value(command_.default_jobs)->value_name("N"),
        command_.jobs_help);
  }
}

po::options_description_easy_init ExperimentArgs::AddOptions() { return own_.add_options(); }

std::string ExperimentArgs::Help() const {
  const std::string name = command_.name;
  std::string usage = "usage: kvtier " + name + " --config X.ini";
  if (command_.runs) usage += " --out R.sqlite";
  if (*command_.synopsis != '\0') usage += std::string(" ") + command_.synopsis;
  usage += " [--systems a,b]";
  if (command_.runs) usage += " [-j N]";
  usage += " [--section.key=value ...]\n";
  if (*command_.more_usage != '\0') usage += std::string("       ") + command_.more_usage + "\n";
  // One flat list (a nested group would print with blank lines around it), the override rule
  // last so that boost lays it out like the flags.
  po::options_description shown("options");
  for (const auto& o : common_.options()) shown.add(o);
  for (const auto& o : own_.options()) shown.add(o);
  shown.add_options()("section.key=value",
                      "any configuration key (kvtier config --keys lists them); the strongest "
                      "layer, above the experiment file and its includes");
  std::ostringstream options;
  options << shown;
  return usage + "\n" + command_.about + "\n\n" + options.str() +
         "\nOption names are never abbreviated; anything else is an error (exit 2).\n" +
         (command_.runs ? std::string("\n") + kExitStatusHelp : std::string()) + command_.notes;
}

bool ExperimentArgs::Parse(const Args& args) {
  const std::string name = command_.name;
  po::options_description all;
  all.add(common_).add(own_);
  std::vector<std::string> rest;
  // Overrides (--section.key=value) are taken before boost sees the line: boost refuses an
  // empty value after '=' ("should follow immediately after the equal sign"), and
  // `--hw.store_dir=` is how a key set by the INI is set back to empty.
  Args own_args;
  for (const std::string& word : args) {
    const std::size_t eq = word.find('=');
    const bool override_word = word.rfind("--", 0) == 0 && word.size() > 2 && word[2] != '-' &&
                               eq != std::string::npos &&
                               word.substr(2, eq - 2).find('.') != std::string::npos;
    (override_word ? rest : own_args).push_back(word);
  }
  try {
    po::parsed_options parsed = po::command_line_parser(own_args)
                                    .options(all)
                                    .style(CommandLineStyle())
                                    .allow_unregistered()
                                    .run();
    for (std::string& word : po::collect_unrecognized(parsed.options, po::include_positional)) {
      rest.push_back(std::move(word));
    }
    po::store(parsed, vm_);
  } catch (const po::error& e) {
    ThrowCommandLineError(name, e, all);
  }
  if (vm_.count("help")) {
    std::fputs(Help().c_str(), stdout);
    return false;
  }
  const std::string flags = OptionNames(all);
  for (const std::string& word : rest) CheckOverride(word, name, flags);
  overrides_ = std::move(rest);
  NotifyArgs(name, &vm_);

  const bool config_optional =
      command_.config_optional_with != nullptr && vm_.count(command_.config_optional_with) > 0;
  if (!config_optional && config_path_.empty()) {
    throw InputError("command line: --config X.ini is required (kvtier " + name + " --help)");
  }
  const bool out_optional =
      command_.out_optional_with != nullptr && vm_.count(command_.out_optional_with) > 0;
  if (command_.runs && out_.empty() && !out_optional) {
    throw InputError("command line: --out R.sqlite is required (kvtier " + name + " --help)");
  }
  if (command_.runs && jobs_ < 1) throw InputError("command line: --jobs must be >= 1");
  if (command_.runs && command_.max_jobs > 0 && jobs_ > command_.max_jobs) {
    throw InputError("command line: --jobs " + std::to_string(jobs_) + ": kvtier " + name +
                     " runs at most " + std::to_string(command_.max_jobs) + " at once (" +
                     command_.max_jobs_why + ")");
  }
  return true;
}

Config ExperimentArgs::Base() const { return Config::Load(config_path_, overrides_); }

std::vector<std::string> ExperimentArgs::Systems() const {
  const Config base = Base();
  const bool flag = vm_.count("systems") > 0;
  std::vector<std::string> systems =
      SplitList(flag ? systems_ : base.GetString("experiment.systems"));
  // `--systems ""` (or ",") named no system: running the experiment's default set instead
  // would be a guess. A system listed twice ran twice, two runs of one name in one results
  // file (run_summary showed both); sweep refuses its repeated values the same way.
  if (flag && systems.empty()) {
    throw ConfigError("command line: --systems '" + systems_ + "' names no system (systems: " +
                      Join(KnownSystemNames(FindConfigDir(config_path_))) + ")");
  }
  for (std::size_t i = 0; i < systems.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (systems[i] == systems[j]) {
        throw ConfigError((flag ? std::string("command line: --systems")
                                : base.Where("experiment.systems")) +
                          ": system '" + systems[i] + "' listed twice");
      }
    }
  }
  if (systems.empty() && base.Has("include.system")) systems = {base.GetString("include.system")};
  if (systems.empty()) {
    throw ConfigError(config_path_ +
                      ": no system to run: pass --systems or set "
                      "experiment.systems / include.system (systems: " +
                      Join(KnownSystemNames(FindConfigDir(config_path_))) + ")");
  }
  return systems;
}

Config ExperimentArgs::SystemConfig(const std::string& system,
                                    const std::vector<std::string>& extra) const {
  std::vector<std::string> words = overrides_;
  words.push_back("--include.system=" + system);
  words.insert(words.end(), extra.begin(), extra.end());
  Config c = Config::Load(config_path_, words);
  BuildOptions(c);
  return c;
}

std::vector<std::pair<std::string, Config>> ExperimentArgs::Runs() const {
  std::vector<std::pair<std::string, Config>> runs;
  for (const std::string& system : Systems()) {
    Config c = SystemConfig(system);
    c.Set("workload.trace", ResolveTrace(c, config_path_), c.Get("workload.trace").origin);
    runs.emplace_back(system, std::move(c));
  }
  return runs;
}

void ExperimentArgs::CreateOut() const { ResultsDb check(out_); }

}  // namespace kvtier::cli
