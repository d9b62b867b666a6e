// The experiment commands' one command-line parser (cli/experiment_args.h) and the rules every
// command shares (cli/command_line.h), called in-process: option names are never guessed,
// overrides must be exactly --section.key=value with a known key, every misuse is an
// InputError naming what the command accepts, and the configurations it builds are the ones
// the commands run. tests/cli/cli_args_test.cc checks that every command uses it.

#include "cli/experiment_args.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "core/errors.h"

namespace kvtier::cli {
namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;

// The message of the InputError `f` throws ("" if it throws none).
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

ExperimentCommand Sim() { return {.name = "sim", .about = "about sim"}; }

TEST(ExperimentArgsTest, OptionNamesAreNeverGuessedFromAPrefix) {
  struct Case {
    Args args;
    std::string unknown;
  };
  for (const Case& c :
       std::vector<Case>{{{"--c", "x.ini", "--out", "r.sqlite"}, "--c"},
                         {{"--conf=x.ini", "--out", "r.sqlite"}, "--conf"},
                         {{"--config", "x.ini", "--o", "r.sqlite"}, "--o"},
                         {{"--config", "x.ini", "--out", "r", "--sys", "a"}, "--sys"},
                         {{"--config", "x.ini", "--out", "r", "--job", "2"}, "--job"}}) {
    ExperimentArgs a(Sim());
    const std::string e = ErrorOf([&] { a.Parse(c.args); });
    EXPECT_TRUE(Has(e, "command line: unknown option '" + c.unknown + "'")) << e;
    // The error names what the command does take.
    EXPECT_TRUE(Has(e,
                    "(kvtier sim takes --help (-h), --config, --systems, --out, --jobs (-j), "
                    "and --section.key=value overrides)"))
        << e;
  }
}

TEST(ExperimentArgsTest, UnknownOptionNamesTheCommandsOwnFlagsToo) {
  std::vector<std::string> sets;
  ExperimentArgs a({.name = "sweep", .default_jobs = 2});
  a.AddOptions()("set", po::value(&sets)->composing(), "one grid axis");
  const std::string e = ErrorOf([&] { a.Parse({"--config", "x.ini", "--out", "r", "--se", "k"}); });
  EXPECT_TRUE(Has(e, "unknown option '--se'")) << e;
  EXPECT_TRUE(Has(e,
                  "kvtier sweep takes --help (-h), --config, --systems, --out, --jobs (-j), "
                  "--set"))
      << e;
}

TEST(ExperimentArgsTest, UnknownKeyListsTheKeysOfItsSection) {
  ExperimentArgs a(Sim());
  std::string e = ErrorOf([&] {
    a.Parse({"--config", "x.ini", "--out", "r", "--cache.polcy=lfu"});
  });
  EXPECT_TRUE(Has(e, "command line: unknown key 'cache.polcy'")) << e;
  EXPECT_TRUE(Has(e, "keys in [cache]: ")) << e;
  EXPECT_TRUE(Has(e, "cache.policy")) << e;
  EXPECT_TRUE(Has(e, "cache.gpu_capacity")) << e;
  EXPECT_FALSE(Has(e, "ssd.read_bw")) << "only the section's keys: " << e;

  ExperimentArgs b(Sim());
  e = ErrorOf([&] { b.Parse({"--config", "x.ini", "--out", "r", "--cahce.policy=lfu"}); });
  EXPECT_TRUE(Has(e, "unknown key 'cahce.policy' (sections: ")) << e;
  EXPECT_TRUE(Has(e, "cache, ")) << e;
  EXPECT_TRUE(Has(e, "kvtier config --keys lists every key")) << e;
}

TEST(ExperimentArgsTest, AnOverrideIsExactlyDashDashSectionDotKeyEqualsValue) {
  struct Case {
    std::string word, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"--cache.policy", "'--cache.policy': an override is one word, --cache.policy=VALUE"},
           {"-cache.policy=lfu", "'-cache.policy=lfu': an override is written --section.key=value"},
           {"---cache.policy=lfu", "an override is written --section.key=value"},
           {"stray", "unexpected argument 'stray' (kvtier sim takes --help (-h), --config"},
           {"-x", "unknown option '-x'"},
       }) {
    ExperimentArgs a(Sim());
    const std::string e = ErrorOf([&] { a.Parse({"--config", "x.ini", "--out", "r", c.word}); });
    EXPECT_TRUE(Has(e, "command line: ")) << c.word << ": " << e;
    EXPECT_TRUE(Has(e, c.expected)) << c.word << ": " << e;
  }
  ExperimentArgs ok(Sim());
  ASSERT_TRUE(ok.Parse({"--config", "x.ini", "--cache.policy=lfu", "--out", "r", "-j", "3",
                        "--itf.alpha=0.5", "--systems", "as,spec"}));
  EXPECT_EQ(ok.overrides(), (std::vector<std::string>{"--cache.policy=lfu", "--itf.alpha=0.5"}));
  EXPECT_EQ(ok.config_path(), "x.ini");
  EXPECT_EQ(ok.out(), "r");
  EXPECT_EQ(ok.jobs(), 3);
  // Regression (probing, 2026-12-01, second sitting): an empty value, which sets a key the INI
  // set back to empty, was refused by boost ("the argument for option '--hw.store_dir' should
  // follow immediately after the equal sign").
  ExperimentArgs empty(Sim());
  ASSERT_TRUE(empty.Parse({"--config", "x.ini", "--hw.store_dir=", "--out", "r",
                           "--cpu.driver_op_costs="}));
  EXPECT_EQ(empty.overrides(),
            (std::vector<std::string>{"--hw.store_dir=", "--cpu.driver_op_costs="}));
  EXPECT_EQ(empty.out(), "r");
}

TEST(ExperimentArgsTest, RequiredFlagsAndJobLimitsAreErrorsNamingTheFlag) {
  EXPECT_TRUE(Has(ErrorOf([] {
                    ExperimentArgs(Sim()).Parse({"--out", "r"});
                  }),
                  "--config X.ini is required (kvtier sim --help)"));
  EXPECT_TRUE(Has(ErrorOf([] {
                    ExperimentArgs(Sim()).Parse({"--config", "x.ini"});
                  }),
                  "--out R.sqlite is required"));
  EXPECT_TRUE(Has(ErrorOf([] {
                    ExperimentArgs(Sim()).Parse({"--config", "x", "--out", "r", "-j", "0"});
                  }),
                  "--jobs must be >= 1"));
  EXPECT_TRUE(Has(ErrorOf([] {
                    ExperimentArgs(Sim()).Parse({"--config", "x", "--out", "r", "--jobs", "many"});
                  }),
                  "command line: the argument ('many') for option '--jobs' is invalid"));
  ExperimentCommand hw{.name = "hw", .max_jobs = 1, .max_jobs_why = "measured runs"};
  EXPECT_TRUE(Has(ErrorOf([&] {
                    ExperimentArgs(hw).Parse({"--config", "x", "--out", "r", "-j", "2"});
                  }),
                  "--jobs 2: kvtier hw runs at most 1 at once (measured runs)"));
  // A command that does not run has no --out and no --jobs.
  ExperimentCommand config{.name = "config", .runs = false, .config_optional_with = "keys"};
  ExperimentArgs c(config);
  c.AddOptions()("keys", "the key table");
  EXPECT_TRUE(c.Parse({"--keys"}));
  EXPECT_TRUE(Has(ErrorOf([&] {
                    ExperimentArgs(config).Parse({"--config", "x", "--out", "r"});
                  }),
                  "unknown option '--out'"));
  EXPECT_TRUE(
      Has(ErrorOf([&] { ExperimentArgs(config).Parse({}); }), "--config X.ini is required"));
  // sweep --slurm DIR writes shards of its own: --out is optional with it, required without.
  ExperimentCommand sweep{.name = "sweep", .out_optional_with = "slurm"};
  auto with_slurm = [&](const Args& args) {
    ExperimentArgs s(sweep);
    s.AddOptions()("slurm", po::value<std::string>(), "job directory");
    return s.Parse(args);
  };
  EXPECT_TRUE(with_slurm({"--config", "x", "--slurm", "job"}));
  EXPECT_TRUE(Has(ErrorOf([&] { with_slurm({"--config", "x"}); }),
                  "--out R.sqlite is required (kvtier sweep --help)"));
}

TEST(ExperimentArgsTest, HelpListsTheCommonFlagsTheOwnFlagsAndTheOverrideRule) {
  std::vector<std::string> sets;
  ExperimentArgs a({.name = "sweep", .about = "Sweeps.", .synopsis = "--set k=v1,v2"});
  a.AddOptions()("set", po::value(&sets), "one grid axis");
  const std::string help = a.Help();
  EXPECT_TRUE(Has(help,
                  "usage: kvtier sweep --config X.ini --out R.sqlite --set k=v1,v2 "
                  "[--systems a,b] [-j N] [--section.key=value ...]\n\nSweeps.\n"))
      << help;
  for (const char* flag : {"--config X.ini", "--systems a,b", "--out R.sqlite", "-j [ --jobs ] N",
                           "--set", "--section.key=value"}) {
    EXPECT_TRUE(Has(help, flag)) << flag << " in\n" << help;
  }
  ExperimentArgs h(Sim());
  EXPECT_FALSE(h.Parse({"--help", "--not-checked"}));  // help wins; nothing else is checked
}

// The configurations come from the experiment file, the overrides, the system, then the
// command's own extras, in that order, and are validated before anything runs.
class ExperimentConfigsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvtier_experiment_args_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    setenv("KVTIER_CONFIG_DIR", (fs::path(KVTIER_SOURCE_DIR_FALLBACK) / "configs").c_str(), 1);
    std::ofstream(dir_ / "t.kvt") << "not read here";
    std::ofstream(dir_ / "e.ini") << "[include]\nmodel = opt-13b\nhardware = a100-pcie4-nvme\n"
                                     "[experiment]\nsystems = as,spec\n[workload]\ntrace = t.kvt\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ExperimentConfigsTest, RunsAreEverySystemWithOverridesAndTheResolvedTrace) {
  ExperimentArgs a(Sim());
  ASSERT_TRUE(a.Parse({"--config", (dir_ / "e.ini").string(), "--out", "r", "--cache.policy=lfu"}));
  const auto runs = a.Runs();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].first, "as");
  EXPECT_EQ(runs[1].first, "spec");
  for (const auto& [system, c] : runs) {
    EXPECT_EQ(c.GetString("include.system"), system);
    EXPECT_EQ(c.GetString("cache.policy"), "lfu");
    EXPECT_EQ(c.Get("cache.policy").origin, "command line");
    EXPECT_EQ(fs::path(c.GetString("workload.trace")), dir_ / "t.kvt");
  }
  // --systems wins over experiment.systems; SystemConfig's extras win over the overrides.
  ExperimentArgs b(Sim());
  ASSERT_TRUE(b.Parse({"--config", (dir_ / "e.ini").string(), "--out", "r", "--systems", "recomp",
                       "--cache.policy=lfu"}));
  EXPECT_EQ(b.Systems(), std::vector<std::string>{"recomp"});
  EXPECT_EQ(b.SystemConfig("spec", {"--cache.policy=lru"}).GetString("cache.policy"), "lru");
}

TEST_F(ExperimentConfigsTest, NoSystemAndBadSystemAreConfigErrorsNamingTheKnownSystems) {
  std::ofstream(dir_ / "none.ini") << "[include]\nmodel = opt-13b\nhardware = a100-pcie4-nvme\n";
  ExperimentArgs a(Sim());
  ASSERT_TRUE(a.Parse({"--config", (dir_ / "none.ini").string(), "--out", "r"}));
  std::string e = ErrorOf([&] { a.Systems(); });
  EXPECT_TRUE(Has(e, "no system to run: pass --systems")) << e;
  EXPECT_TRUE(Has(e, "as_h2o_lfu")) << e;
  ExperimentArgs b(Sim());
  ASSERT_TRUE(
      b.Parse({"--config", (dir_ / "e.ini").string(), "--out", "r", "--systems", "spec,bogus"}));
  e = ErrorOf([&] { b.Runs(); });
  EXPECT_TRUE(Has(e, "include.system: no file")) << e;
  EXPECT_TRUE(Has(e, "bogus")) << e;
}

TEST(CommandLineTest, EveryCommandParsesWithoutGuessing) {
  po::options_description desc;
  std::string model_name;
  desc.add_options()("help,h", "help")("model-name", po::value(&model_name), "name");
  po::variables_map vm;
  const std::string e = ErrorOf([&] { StoreArgs("eval", {"--model-n", "x"}, desc, desc, &vm); });
  EXPECT_TRUE(Has(e,
                  "command line: unrecognised option '--model-n' (kvtier eval takes --help "
                  "(-h), --model-name)"))
      << e;
  po::variables_map ok;
  StoreArgs("eval", {"--model-name", "x"}, desc, desc, &ok);
  NotifyArgs("eval", &ok);
  EXPECT_EQ(model_name, "x");
}

// Regression (issue 18, found through the config fuzz target's hang): boost's what() replaces
// each placeholder of its message until none is left, so an argument holding one
// (`kvtier trace gen --requests %value%`) grew the message forever and the command never exited.
TEST(CommandLineTest, AnArgumentOfPercentValuePercentIsAnInvalidArgumentErrorNotAHang) {
  po::options_description desc;
  int requests = 0;
  desc.add_options()("requests", po::value(&requests), "requests");
  for (const std::string arg :
       {"%value%", "%canonical_option%", "%prefix%%option%%original_token%", "5%", "x"}) {
    po::variables_map vm;
    const std::string e =
        ErrorOf([&] { StoreArgs("trace gen", {"--requests", arg}, desc, desc, &vm); });
    EXPECT_TRUE(Has(e, "command line: the argument ('" + arg +
                           "') for option '--requests' is invalid (kvtier trace gen --help)"))
        << e;
  }
  // An unknown option holding one: the name is shown as typed.
  po::variables_map vm;
  const std::string e =
      ErrorOf([&] { StoreArgs("trace gen", {"--x%canonical_option%"}, desc, desc, &vm); });
  EXPECT_TRUE(Has(e, "unrecognised option '--x%canonical_option%' (kvtier trace gen takes "
                     "--requests)"))
      << e;
}

}  // namespace
}  // namespace kvtier::cli
