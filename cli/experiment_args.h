#pragma once
// ExperimentArgs: the one command-line parser of the commands that run an experiment file --
// `kvtier config`, `sim`, `sweep`, `hw` and `validate` -- so that they take the same flags
// under the same rules and print their help the same way:
//
//   kvtier CMD --config X.ini [--systems a,b] [--out R.sqlite] [-j N] [CMD's own flags]
//              [--section.key=value ...]
//
//   --config X.ini        the experiment file (required)
//   --systems a,b         systems to run, comma-separated (default: experiment.systems, else
//                         include.system)
//   --out, --jobs/-j      results file and runs at once (commands that run: sim, sweep, hw,
//                         validate; not config)
//   --section.key=value   any key of the key table (core/config_keys.cc), the strongest layer
//                         of the configuration (docs/configuration.md); progress lines on
//                         stderr, for one, come every log.progress
//
// A command adds its own flags with AddOptions(). Parse() enforces, before any file is read:
// the rules of cli/command_line.h (no option name is guessed from a prefix); an override is
// exactly `--section.key=value` with a key of the key table (an unknown key's error lists the
// keys of its section, or the sections); a stray word or an unknown flag is an error listing
// the command's flags. Base(), SystemConfig() and Runs() then load and validate the
// configurations (BuildOptions), all of them before a command runs anything. Every error is an
// InputError (ConfigError for configuration values) naming what is wrong: exit 2.
//
// Typical use (cli/cmd_sweep.cc):
//   ExperimentArgs a({.name = "sweep", .about = "...", .default_jobs = 2});
//   a.AddOptions()("set", po::value(&sets)->composing(), "key=v1,v2,...: one grid axis");
//   if (!a.Parse(args)) return 0;  // --help was printed
//   for (const std::string& system : a.Systems()) ... a.SystemConfig(system, point) ...
//
// Not thread-safe; one per command invocation.

#include <boost/program_options.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/config.h"

namespace kvtier::cli {

// What differs between the experiment commands' command lines.
struct ExperimentCommand {
  const char* name = "";   // "sim": errors say "kvtier sim ..."
  const char* about = "";  // a paragraph under the usage line of --help
  // The command's own flags in the usage line, e.g. "--set key=v1,v2 [--set ...]".
  const char* synopsis = "";
  // Printed at the end of --help, after the exit status of commands that run.
  const char* notes = "";
  bool runs = true;  // takes --out and --jobs/-j (false: kvtier config)
  int default_jobs = 1;
  const char* jobs_help = "runs at once, each in its own process";
  int max_jobs = 0;               // 0: no limit
  const char* max_jobs_why = "";  // why, when there is a limit (said in the error)
  // A flag of the command that makes --config optional (config's "keys"), or nullptr.
  const char* config_optional_with = nullptr;
  // A flag of the command that makes --out optional (sweep's "slurm": the tasks write their own
  // results files), or nullptr.
  const char* out_optional_with = nullptr;
  // More usage lines for --help (config's "kvtier config --keys [--markdown]"), or "".
  const char* more_usage = "";
};

class ExperimentArgs {
 public:
  explicit ExperimentArgs(const ExperimentCommand& command);

  // Adds the command's own flags; call before Parse. They are listed in --help after the
  // common ones, and in the error for an unknown flag.
  boost::program_options::options_description_easy_init AddOptions();

  // Parses `args` (the words after the command's name). Returns false when --help or -h was
  // given (the help is printed on stdout, nothing else is checked). Throws InputError or
  // ConfigError for any misuse; reads no file.
  bool Parse(const Args& args);

  // The parsed values (the command's own flags are read here, or through the variables they
  // were bound to).
  const boost::program_options::variables_map& vm() const { return vm_; }
  // --config; "" when absent (only possible with config_optional_with given).
  const std::string& config_path() const { return config_path_; }
  const std::string& out() const { return out_; }
  int jobs() const { return jobs_; }
  // The overrides as written ("--cache.policy=lfu"), in command-line order.
  const std::vector<std::string>& overrides() const { return overrides_; }

  // The experiment file with its includes and the overrides (no system forced). Throws
  // ConfigError.
  Config Base() const;
  // The systems to run: --systems, else experiment.systems, else include.system. Throws
  // ConfigError naming the known systems when there is none.
  std::vector<std::string> Systems() const;
  // The configuration of `system`: the experiment file, the overrides, --include.system=system,
  // then `extra` (later words win), validated by BuildOptions. Throws ConfigError.
  Config SystemConfig(const std::string& system, const std::vector<std::string>& extra = {}) const;
  // SystemConfig of every system of Systems(), each with workload.trace set to the resolved
  // trace path (ResolveTrace), in order. Throws ConfigError before returning any.
  std::vector<std::pair<std::string, Config>> Runs() const;
  // Opens --out once (creating the file and its schema), so an unwritable path fails before any
  // run does. Throws InputError naming the path.
  void CreateOut() const;

  // What --help prints: usage lines, `about`, the flags, the override rule.
  std::string Help() const;

 private:
  ExperimentCommand command_;
  boost::program_options::options_description common_;
  boost::program_options::options_description own_;
  boost::program_options::variables_map vm_;
  std::string config_path_, systems_, out_;
  int jobs_ = 1;
  std::vector<std::string> overrides_;
};

// Checks one word of an experiment command line that is none of the command's flags: an
// override `--section.key=value` whose key is in the key table passes; anything else throws
// InputError (ConfigError for an unknown key) saying what was expected. `command` ("sim") and
// `flags` (OptionNames of its flags) go into the message.
void CheckOverride(const std::string& word, const std::string& command, const std::string& flags);

// Throws ConfigError("<where>: unknown key 'k' (keys in [section]: ...; kvtier config --keys
// lists every key)") unless `key` is in the key table. The sections are listed instead when
// `key`'s section has no key.
void CheckKnownKey(const std::string& key, const std::string& where);

// "a, b ,c" -> {"a", "b", "c"}: a comma-separated list, items trimmed, empty items dropped.
std::vector<std::string> SplitList(const std::string& text);

// The trace an experiment names (workload.trace), resolved against the experiment file's
// directory; throws ConfigError if unset or absent.
std::string ResolveTrace(const Config& config, const std::string& experiment_path);

}  // namespace kvtier::cli
