// Runs the built `kvtier` binary (KVTIER_BIN) on good and bad configurations and checks the
// exit code (2 for bad input) and that stderr names the file and the key. The real configs/
// tree (KVTIER_SOURCE_DIR, set by kvtier_add_test) resolves include names.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path SourceDir() {
  const char* s = std::getenv("KVTIER_SOURCE_DIR");
  return s ? fs::path(s) : fs::path(KVTIER_SOURCE_DIR_FALLBACK);
}

std::vector<std::string> Names(const std::string& kind) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(SourceDir() / "configs" / kind)) {
    if (e.path().extension() == ".ini") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvtier_cli_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    setenv("KVTIER_CONFIG_DIR", (SourceDir() / "configs").c_str(), 1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // Runs `kvtier <args>`; args are passed through the shell as written.
  Result Run(const std::string& args) {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd = std::string("'") + KVTIER_BIN + "' " + args + " >'" + out.string() +
                            "' 2>'" + err.string() + "'";
    const int status = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  fs::path dir_;
};

constexpr char kIncludes[] =
    "[include]\nmodel = opt-13b\nhardware = a100-pcie4-nvme\nsystem = spec\n";

TEST_F(CliTest, ConfigPrintsResolvedValuesWithOrigins) {
  const std::string e = Write("e.ini", std::string(kIncludes) + "[cache]\ngpu_capacity = 4GiB\n");
  Result r = Run("config --config " + e + " --cache.policy=lfu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("cache.gpu_capacity = 4GiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(e + ":6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cache.policy = lfu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("command line"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("opt-13b.ini:"), std::string::npos) << r.out;

  r = Run("config --config " + e + " --no-origins");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("; "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.name = opt-13b\n"), std::string::npos) << r.out;

  r = Run("config --config " + e + " --check");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "ok\n");
}

TEST_F(CliTest, KeysListsTheKeyTable) {
  Result r = Run("config --keys");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("cache.gpu_capacity"), std::string::npos);
  EXPECT_NE(r.out.find("lru|lfu|score"), std::string::npos);
  r = Run("config --keys --markdown");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(R"(| `cache.policy` | enum | lru | lru\|lfu\|score |)"), std::string::npos);
}

TEST_F(CliTest, UnknownKeyInFileExitsTwoNamingFileAndKey) {
  const std::string e = Write("bad_key.ini", std::string(kIncludes) + "[cache]\ngpu_capacityy = 1\n");
  Result r = Run("config --config " + e);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(e + ":6"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cache.gpu_capacityy"), std::string::npos) << r.err;
}

TEST_F(CliTest, UnparsableValueExitsTwoNamingFileAndKey) {
  const std::string e = Write("bad_value.ini", std::string(kIncludes) + "[ssd]\nread_bw = fast\n");
  Result r = Run("config --config " + e + " --check");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(e + ":6"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ssd.read_bw"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bandwidth"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(CliTest, InvalidOptionValueExitsTwoNamingFileAndKey) {
  const std::string e = Write("bad_ratio.ini", std::string(kIncludes) + "[select]\nretention = 1.5\n");
  Result r = Run("config --config " + e + " --check");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(e + ":6: select.retention"), std::string::npos) << r.err;
}

TEST_F(CliTest, BadOverrideExitsTwo) {
  const std::string e = Write("e.ini", kIncludes);
  Result r = Run("config --config " + e + " --cache.polcy=lfu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("command line"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cache.polcy"), std::string::npos) << r.err;
  r = Run("config --config " + e + " --cache.policy=fifo");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("lru,lfu,score"), std::string::npos) << r.err;
  r = Run("config --config " + e + " stray");
  EXPECT_EQ(r.code, 2);
  r = Run("config");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--config"), std::string::npos) << r.err;
}

TEST_F(CliTest, UnknownIncludeExitsTwoListingKnownNames) {
  const std::string e =
      Write("bad_inc.ini", "[include]\nmodel = opt-13b\nhardware = a100-pcie4-nvme\nsystem = nope\n");
  Result r = Run("config --config " + e);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(e + ":4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("include.system"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("spec"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("recomp"), std::string::npos) << r.err;
}

TEST_F(CliTest, MissingConfigFileExitsTwo) {
  Result r = Run("config --config " + (dir_ / "nope.ini").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("nope.ini"), std::string::npos) << r.err;
}

TEST_F(CliTest, EveryExperimentFileIsValid) {
  const fs::path dir = SourceDir() / "configs" / "experiments";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "no configs/experiments/";
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".ini") continue;
    Result r = Run("config --check --config " + entry.path().string());
    EXPECT_EQ(r.code, 0) << entry.path() << ": " << r.err;
  }
}

TEST_F(CliTest, EveryModelHardwareSystemCombinationIsValid) {
  const auto models = Names("models"), hardware = Names("hardware"), systems = Names("systems");
  ASSERT_FALSE(models.empty());
  ASSERT_FALSE(hardware.empty());
  ASSERT_FALSE(systems.empty());
  for (const auto& m : models) {
    for (const auto& h : hardware) {
      for (const auto& s : systems) {
        const std::string e = Write("combo.ini", "[include]\nmodel = " + m + "\nhardware = " + h +
                                                     "\nsystem = " + s + "\n");
        Result r = Run("config --check --config " + e);
        EXPECT_EQ(r.code, 0) << m << " x " << h << " x " << s << ": " << r.err;
      }
    }
  }
}

TEST_F(CliTest, ModelPrintsKvSizesAndTheTradeOffTable) {
  Result r = Run("model opt-13b --hardware a100-pcie4-nvme --tokens 128,1024");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("819200 B"), std::string::npos) << r.out;  // KV per token
  EXPECT_NE(r.out.find("655360 B"), std::string::npos) << r.out;  // 64-token K chunk
  EXPECT_NE(r.out.find("recompute"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("   1024 "), std::string::npos) << r.out;
}

TEST_F(CliTest, EveryModelAndHardwarePrints) {
  for (const auto& m : Names("models")) {
    for (const auto& h : Names("hardware")) {
      Result r = Run("model " + m + " --hardware " + h);
      EXPECT_EQ(r.code, 0) << m << " x " << h << ": " << r.err;
    }
  }
}

TEST_F(CliTest, UnknownModelExitsTwoListingKnownModels) {
  Result r = Run("model gpt-5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("gpt-5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("opt-13b"), std::string::npos) << r.err;
  r = Run("model opt-13b --hardware tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("a100-pcie4-nvme"), std::string::npos) << r.err;
  r = Run("model opt-13b --tokens 12,abc");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
}

TEST_F(CliTest, ModelFileWithBadValueExitsTwoNamingFileAndKey) {
  const std::string m = Write("broken.ini", "[model]\nname = broken\nfamily = opt\nlayers = -4\n");
  Result r = Run("model " + m);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("broken.ini"), std::string::npos) << r.err;
}

}  // namespace
