// Every `kvtier` command parses its command line by the same rules, checked through the built
// binary: the experiment commands (config, sim, sweep, hw, validate) take the same common
// flags and check overrides the same way (cli/experiment_args.h); no command guesses an
// option's name from a prefix (cli/command_line.h); misuse exits 2 naming what is accepted.
// The parser's own cases are in-process in experiment_args_test.cc.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/cli/cli_fixture.h"

namespace {

using Result = kvtier::testing::CliResult;

class CliArgsTest : public kvtier::testing::CliFixture {
 protected:
  // An experiment whose trace exists (nothing here reads it).
  std::string Experiment() {
    Write("t.kvt", "not a trace: the runs below stop before reading it\n");
    return Write("e.ini",
                 "[include]\nmodel = opt-13b\nhardware = a100-pcie4-nvme\n[experiment]\n"
                 "systems = as,spec\n[workload]\ntrace = t.kvt\n");
  }
};

const std::vector<std::string> kExperimentCommands = {"config", "sim", "sweep", "hw", "validate"};
const std::vector<std::string> kRunCommands = {"sim", "sweep", "hw", "validate"};

// What `kvtier sweep` needs besides the common flags.
std::string Own(const std::string& command) {
  return command == "sweep" ? " --set cache.gpu_capacity=1GiB,2GiB" : "";
}

TEST_F(CliArgsTest, NoExperimentCommandGuessesAnOptionFromAPrefix) {
  const std::string e = Experiment();
  for (const std::string& c : kExperimentCommands) {
    // `kvtier sim --c x.ini` used to run as --config (boost's guessing); `hw` rejected it.
    Result r = Run(c + " --c " + e + " --out " + (dir_ / "r.sqlite").string());
    EXPECT_EQ(r.code, 2) << c << ": " << r.err;
    EXPECT_NE(r.err.find("kvtier " + c + ": error: command line: unknown option '--c' (kvtier " +
                         c + " takes --help (-h), --config, --systems"),
              std::string::npos)
        << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST_F(CliArgsTest, EveryExperimentCommandTakesTheCommonFlags) {
  const std::string e = Experiment();
  for (const std::string& c : kExperimentCommands) {
    Result r = Run(c + " --help");
    ASSERT_EQ(r.code, 0) << c << ": " << r.err;
    EXPECT_EQ(r.out.rfind("usage: kvtier " + c + " --config X.ini", 0), 0u) << r.out;
    for (const char* flag : {"--config X.ini", "--systems a,b", "--section.key=value"}) {
      EXPECT_NE(r.out.find(flag), std::string::npos) << c << " --help lacks " << flag;
    }
    EXPECT_EQ(Run(c + " -h").out, r.out);
  }
  for (const std::string& c : kRunCommands) {
    Result r = Run(c + " --help");
    EXPECT_NE(r.out.find("--out R.sqlite"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("-j [ --jobs ] N"), std::string::npos) << r.out;
    // Every flag and override parses and every system's configuration validates; the run
    // then stops at the unwritable results file, before anything is simulated or measured.
    r = Run(c + " --config " + e + " --systems spec,as --cache.policy=lfu -j 1" + Own(c) +
            " --out /nonexistent-dir/r.sqlite");
    EXPECT_EQ(r.code, 2) << c << ": " << r.err;
    EXPECT_NE(r.err.find("/nonexistent-dir/r.sqlite"), std::string::npos) << c << ": " << r.err;
    EXPECT_EQ(r.err.find("command line"), std::string::npos) << c << ": " << r.err;
  }
  Result r = Run("config --config " + e + " --systems spec,as --cache.policy=lfu --check");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "ok\n");
}

TEST_F(CliArgsTest, EveryExperimentCommandChecksOverridesTheSameWay) {
  const std::string e = Experiment();
  const std::string out = " --out " + (dir_ / "r.sqlite").string();
  for (const std::string& c : kExperimentCommands) {
    const std::string common = c + " --config " + e + (c == "config" ? "" : out) + Own(c);
    Result r = Run(common + " --cache.polcy=lfu");
    EXPECT_EQ(r.code, 2) << c;
    EXPECT_NE(r.err.find("command line: unknown key 'cache.polcy' (keys in [cache]: "),
              std::string::npos)
        << c << ": " << r.err;
    EXPECT_NE(r.err.find("cache.policy"), std::string::npos) << c << ": " << r.err;

    r = Run(common + " --cache.policy lfu");
    EXPECT_EQ(r.code, 2) << c;
    EXPECT_NE(r.err.find("'--cache.policy': an override is one word, --cache.policy=VALUE"),
              std::string::npos)
        << c << ": " << r.err;

    r = Run(common + " -cache.policy=lfu");
    EXPECT_EQ(r.code, 2) << c;
    EXPECT_NE(r.err.find("an override is written --section.key=value"), std::string::npos)
        << c << ": " << r.err;

    r = Run(common + " stray");
    EXPECT_EQ(r.code, 2) << c;
    EXPECT_NE(r.err.find("unexpected argument 'stray' (kvtier " + c + " takes"), std::string::npos)
        << c << ": " << r.err;

    r = Run(common + " --cache.policy=fifo");  // a known key, a value it rejects
    EXPECT_EQ(r.code, 2) << c;
    EXPECT_NE(r.err.find("lru,lfu,score"), std::string::npos) << c << ": " << r.err;
  }
  // sweep's --set axes name keys by the same rule.
  Result r = Run("sweep --config " + e + out + " --set cache.polcy=lru,lfu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("command line: --set: unknown key 'cache.polcy' (keys in [cache]: "),
            std::string::npos)
      << r.err;
}

TEST_F(CliArgsTest, HwCommandsMeasureOneSystemAtATime) {
  const std::string e = Experiment();
  for (const std::string c : {"hw", "validate"}) {
    Result r = Run(c + " --config " + e + " --out " + (dir_ / "r.sqlite").string() + " -j 2");
    EXPECT_EQ(r.code, 2) << c;
    EXPECT_NE(r.err.find("--jobs 2: kvtier " + c +
                         " runs at most 1 at once (measured runs never "
                         "share the disk or the cores)"),
              std::string::npos)
        << r.err;
  }
}

TEST_F(CliArgsTest, ConfigWithSystemsPrintsWhatEachSystemRuns) {
  const std::string e = Experiment();
  Result r = Run("config --config " + e + " --systems spec,recomp --no-origins");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::size_t spec = r.out.find("; system spec\n"),
                    recomp = r.out.find("\n; system recomp\n");
  ASSERT_NE(spec, std::string::npos) << r.out;
  ASSERT_NE(recomp, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("include.system = spec\n", spec), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("include.system = recomp\n", recomp), std::string::npos) << r.out;
}

TEST_F(CliArgsTest, NoOtherCommandGuessesAnOptionEither) {
  for (const std::string args :
       {"eval --ou x.sqlite", "trace gen --req 3 -o t.kvt", "trace record --ou t.kvt",
        "trace stats --js t.kvt", "model opt-13b --hard a100-pcie4-nvme", "calibrate --o x.ini",
        "lm generate --prom hi", "report r.sqlite --ou d", "merge a.sqlite --ou b.sqlite"}) {
    Result r = Run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("command line: unrecognised option '--"), std::string::npos)
        << args << ": " << r.err;
    EXPECT_NE(r.err.find(" takes "), std::string::npos) << args << ": " << r.err;
  }
}

// Regression (issue 18): an argument holding one of boost's message placeholders hung the
// command (its error message grew forever); now exit 2 with the argument shown as typed.
TEST_F(CliArgsTest, AnArgumentOfPercentValuePercentExitsTwoInsteadOfHanging) {
  for (const std::string args : {"trace gen --requests %value% -o t.kvt",
                                 "sim --config %value% --jobs %value% --out r.sqlite"}) {
    Result r = Run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("the argument ('%value%') for option '--"), std::string::npos)
        << args << ": " << r.err;
  }
}

// Regression (probing, 2026-12-01): commands that write one file after minutes of work
// (`calibrate --out`, `trace fit --out`) failed only then when the path was a directory or
// empty. CheckOutputFile says so before any work: here `trace fit` onto a directory, which
// fails before the trace is even opened.
TEST_F(CliArgsTest, AFitOrProfileOntoADirectoryExitsTwoBeforeAnyWork) {
  Result r = Run("trace fit no-such.kvt --out " + dir_.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(dir_.string() + ": --out is a directory; name the file to write"),
            std::string::npos)
      << r.err;
  r = Run("calibrate --quick --out " + dir_.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--out is a directory"), std::string::npos) << r.err;
}

// Regression (probing, 2026-12-02): an output named as an input replaced it: `trace fit t.kvt
// --out t.kvt` wrote its INI over the trace, `trace gen --config g.ini --out g.ini` its trace over
// the INI, `trace record --out` over the model. Each exits 2 before any work, the input intact,
// however the two are named (the same, ./x, a hard link).
TEST_F(CliArgsTest, AnOutputNamingTheCommandsInputExitsTwoAndLeavesTheInput) {
  const std::string trace = Write("t.kvt", "a trace the command must not overwrite\n");
  const std::string ini = Write("g.ini", "[workload]\n");
  const std::string model = Write("m.gguf", "a model the command must not overwrite\n");
  const std::filesystem::path link = dir_ / "link.gguf";
  std::filesystem::create_hard_link(model, link);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trace fit " + trace + " --out " + trace, "is the input trace"},
      {"trace fit " + trace + " --out " + (dir_ / "." / "t.kvt").string(), "is the input trace"},
      {"trace gen --config " + ini + " --out " + ini, "is the --config file"},
      {"trace gen --like " + trace + " --out " + trace, "is the --like trace"},
      {"trace record --model " + model + " --out " + model, "is the --model file"},
      {"trace record --model " + model + " --out " + link.string(), "is the --model file"},
  };
  for (const auto& [args, message] : cases) {
    Result r = Run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message + std::string(" ")), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find("writing it would replace the input"), std::string::npos) << r.err;
  }
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(trace), "a trace the command must not overwrite\n");
  EXPECT_EQ(read(ini), "[workload]\n");
  EXPECT_EQ(read(model), "a model the command must not overwrite\n");
}

// Regression (probing, 2026-12-01, second sitting): the list flags of `trace stats`, `trace fit`
// and `model` printed (or measured) a repeated value twice, where every other list flag calls
// a repeat an error; `trace info --records -1` printed nothing and exited 0; a negative seed, a
// KV-head count that does not divide the heads and a negative standard deviation were taken (or
// named the wrong key). Each now exits 2 naming the flag, before any trace is read or written.
TEST_F(CliArgsTest, AListFlagRepeatingAValueANegativeSeedOrCountExitsTwo) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trace stats no-such.kvt --retentions 0.1,0.25,0.10", "--retentions: 0.1 listed twice"},
      {"trace stats no-such.kvt --chunk-sizes 64,32,64", "--chunk-sizes: 64 listed twice"},
      {"trace stats no-such.kvt --decode-lags 1,2,2", "--decode-lags: 2 listed twice"},
      {"trace fit no-such.kvt --decode --decode-ks 8,8", "--decode-ks: 8 listed twice"},
      {"model opt-13b --tokens 128,1024,128", "--tokens: '128': listed twice"},
      // (2026-12-02) It printed a KV size of 1.5e16 KiB and a recompute time of 1.4e22 ms.
      {"model opt-13b --tokens 128,99999999999999",
       "--tokens: '99999999999999': at most 1073741824"},
      {"trace info no-such.kvt --records -1", "--records: must be >= 0"},
      // Boost read "-1" into a seed as 2^64 - 1 and the trace said seed = 18446744073709551615.
      {"trace gen --requests 2 -o t.kvt --seed -1", "--seed: '-1' is not a whole number"},
      {"trace gen --requests 2 -o t.kvt --importance_seed -3", "--importance_seed: '-3'"},
      {"trace record --seed -1 --out t.kvt", "--seed: '-1' is not a whole number"},
      {"eval --seed -1 --tasks copa", "--seed: '-1' is not a whole number"},
      // Both were found only after the whole recording (the first as a malformed output record).
      {"trace record --out t.kvt --output-tokens -1", "--output-tokens: must be >= 0"},
      {"trace record --out t.kvt --model-name ''", "--model-name: empty"},
      // 3 query heads over 2 KV heads: a trace for a model no configuration accepts.
      {"trace gen --requests 2 -o t.kvt --model-heads 3 --model-kv-heads 2",
       "--model-kv-heads: 2 does not divide --model-heads 3"},
      // The standard deviation's error named its mean.
      {"trace gen --requests 2 -o t.kvt --example_tokens_sd -1", "example_tokens_sd: must be >= 0"},
  };
  for (const auto& [args, message] : cases) {
    Result r = Run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
  }
}

// Regression (probing, 2026-12-01, second sitting): runs are stored and compared under their
// system's name, and `--systems as --system.name=spec` stored as's policies as spec's; `sweep
// --set system.name=...` did the same per point, and `--set experiment.systems=spec,as` ran
// the --systems list at every point, labelled with a system it did not run.
TEST_F(CliArgsTest, NamingAVariantAfterAnotherShippedSystemOrSweepingTheSystemKeysExitsTwo) {
  const std::string e = Experiment();
  Result r = Run("config --config " + e + " --systems as --system.name=spec --check");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("'spec' is another shipped system"), std::string::npos) << r.err;
  r = Run("config --config " + e + " --systems as --system.name=as-bigger-gpu --check");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* key : {"system.name", "experiment.systems", "include.system"}) {
    r = Run("sweep --config " + e + " --systems as --out s.sqlite --set " + key + "=spec,as");
    EXPECT_EQ(r.code, 2) << key << ": " << r.err;
    EXPECT_NE(r.err.find(std::string("--set ") + key + ": a point's system comes from --systems"),
              std::string::npos)
        << r.err;
  }
}

}  // namespace
