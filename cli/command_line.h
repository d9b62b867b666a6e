#pragma once
// The command-line rules every `kvtier` command shares, on top of Boost.Program_options.
//
// - Options are long (`--name VALUE` or `--name=VALUE`) or the short forms a command lists
//   (`-j 2`, `-o FILE`). A name is never guessed from a prefix: `--c x.ini` is not `--config`
//   (boost's allow_guessing is off), so adding an option can never change what an old command
//   line means.
// - Anything not understood is an InputError (exit 2) that starts with "command line:"; an
//   unknown option's error lists the options the command has.
//
// Experiment commands (config, sim, sweep, hw, validate) parse through ExperimentArgs
// (cli/experiment_args.h), which adds the `--section.key=value` overrides; the other commands
// call StoreArgs and NotifyArgs directly. Not thread-safe (boost's parser is not).

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>

#include "cli/commands.h"

namespace kvtier::cli {

// The boost style of every kvtier command: boost's default without allow_guessing.
int CommandLineStyle();

// "--config, --systems, --jobs (-j), --help": the options of `options`, in the order added.
std::string OptionNames(const boost::program_options::options_description& options);

// Parses `args` with `options` (and `positional`, if given) in CommandLineStyle and stores the
// result into *vm. `visible` is what the command's --help shows (usually `options` without
// hidden positional targets); an unknown option's error lists it. Throws InputError naming
// `command` ("trace gen").
void StoreArgs(const std::string& command, const Args& args,
               const boost::program_options::options_description& options,
               const boost::program_options::options_description& visible,
               boost::program_options::variables_map* vm,
               const boost::program_options::positional_options_description* positional = nullptr);

// po::notify(*vm) (required options, notifiers) with its errors as InputErrors naming `command`.
void NotifyArgs(const std::string& command, boost::program_options::variables_map* vm);

// The message of boost's error `e`: what() itself, unless a substituted value holds a
// placeholder ("%value%", "%canonical_option%", ...). Boost replaces each placeholder until none
// is left, so `kvtier trace gen --requests %value%` grew its message forever; such a message is
// built from the same template with each placeholder replaced once.
std::string ErrorText(const boost::program_options::error& e);

// An option holding a whole number >= 0 (a seed). Boost's own reading of std::uint64_t takes
// "-1" as 2^64 - 1: `--seed -1` ran with seed 18446744073709551615 without a word. This one
// takes digits only, and its notifier throws InputError("NAME: 'TEXT' is not a whole number in
// [0, 2^64 - 1]"); `name` is how the message names the option ("--seed", "workload.seed").
boost::program_options::value_semantic* UnsignedValue(const std::string& name, std::uint64_t* var);

// Checks, before a long measurement or fit, that the file `path` given to `flag` can be
// written when the work is done: not empty, not a directory, and its nearest existing
// directory (or the file itself) writable -- tried, not asked of access(2), which says yes to
// root everywhere: the file is opened for writing (not truncated), or a file is created and at
// once removed in that directory. Leaves nothing behind. Throws InputError naming both.
void CheckOutputFile(const std::string& path, const char* flag);
// Throws InputError when the file `out` given to `flag` is the input `in` (`what`: "the input
// trace"), named the same way, another way (./t.kvt, a link) or through a hard link: the
// output would replace the input (`trace fit t.kvt --out t.kvt` wrote its INI over the trace).
// Nothing is checked when either path is empty.
void CheckOutputIsNotInput(const std::string& out, const char* flag, const std::string& in,
                           const char* what);

// Rethrows boost's `e` as InputError("command line: <what> (...)"): for an unknown option the
// parenthesis lists `visible`'s options, otherwise it points at `kvtier <command> --help`.
[[noreturn]] void ThrowCommandLineError(const std::string& command,
                                        const boost::program_options::error& e,
                                        const boost::program_options::options_description& visible);

}  // namespace kvtier::cli
