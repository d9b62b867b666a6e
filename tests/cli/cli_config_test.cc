// Runs the built `kvtier` binary (KVTIER_BIN) on good and bad configurations and checks the
// exit code (2 for bad input) and that stderr names the file and the key. The real configs/
// tree (KVTIER_SOURCE_DIR, set by kvtier_add_test) resolves include names.

#include <gtest/gtest.h>

#include "tests/cli/cli_fixture.h"
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

using Result = kvtier::testing::CliResult;
using kvtier::testing::SourceDir;
using CliTest = kvtier::testing::CliFixture;

std::vector<std::string> Names(const std::string& kind) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(SourceDir() / "configs" / kind)) {
    if (e.path().extension() == ".ini") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

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

// Regression (probing, 2026-12-01, second sitting): `config --check` did not read the measured
// layer table, so a malformed one passed the check and failed `kvtier sim`.
TEST_F(CliTest, CheckReadsTheMeasuredLayerTable) {
  const std::string e =
      Write("lt.ini", "[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\n");
  const std::string header =
      "# model = smollm2-135m\nkind,new_tokens,context_tokens,heads,seconds\n";
  const std::string bad = Write("bad.layers.csv", header + "layer_prefill,16,64,0,-1\n");
  Result r = Run("config --config " + e + " --check --gpu.layer_table=" + bad);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("gpu.layer_table: " + bad + ":3: column 5 (seconds)"), std::string::npos)
      << r.err;
  const std::string good = Write("good.layers.csv", header + "layer_prefill,16,64,0,1e-4\n");
  r = Run("config --config " + e + " --check --gpu.layer_table=" + good);
  EXPECT_EQ(r.code, 0) << r.err;
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

// Every shipped profile says where its numbers come from: a hardware profile in `source`, a
// model descriptor in the comment it opens with (its config.json or paper).
TEST_F(CliTest, EveryShippedModelAndHardwareFileCitesItsSource) {
  for (const auto& m : Names("models")) {
    const std::string text = kvtier::testing::Slurp(SourceDir() / "configs" / "models" / (m + ".ini"));
    EXPECT_EQ(text.rfind("; ", 0), 0u) << m << ": no opening comment citing the source";
    // A Hugging Face repository (owner/name) or its config.json.
    const std::string opening = text.substr(0, text.find("[model]"));
    EXPECT_TRUE(opening.find("config.json") != std::string::npos ||
                opening.find('/') != std::string::npos)
        << m << ": the opening comment names no config.json or repository";
  }
  for (const auto& h : Names("hardware")) {
    const std::string e =
        Write("h.ini", "[include]\nmodel = opt-13b\nhardware = " + h + "\nsystem = spec\n");
    Result r = Run("config --no-origins --config " + e);
    ASSERT_EQ(r.code, 0) << h << ": " << r.err;
    const auto at = r.out.find("hardware.source = ");
    ASSERT_NE(at, std::string::npos) << h << ": " << r.out;
    EXPECT_GT(r.out.find('\n', at) - at, std::string("hardware.source = ").size() + 20)
        << h << ": source is (nearly) empty";
  }
}

// The SpeCache setup (issue 17): Mistral-7B-Instruct-v0.2 on one RTX A6000. The values are the
// ones the files cite (config.json; the A6000 datasheet), read back through the loader.
TEST_F(CliTest, MistralOnA6000LoadsWithTheCitedValues) {
  const std::string e =
      Write("specache.ini",
            "[include]\nmodel = mistral-7b-instruct-v0.2\nhardware = a6000-pcie4\nsystem = spec\n");
  Result r = Run("config --no-origins --config " + e);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* line :
       {"model.name = mistral-7b-instruct-v0.2\n", "model.family = llama\n", "model.layers = 32\n",
        "model.hidden = 4096\n", "model.heads = 32\n", "model.kv_heads = 8\n",
        "model.head_dim = 128\n", "model.ffn = 14336\n", "model.vocab = 32000\n",
        "model.dtype_bytes = 2\n", "model.max_context = 32768\n", "hardware.name = a6000-pcie4\n",
        "gpu.memory = 48GiB\n", "gpu.flops = 154.8TFLOP/s\n", "gpu.mem_bw = 768GB/s\n",
        "pcie.h2d_bw = 25GB/s\n", "pcie.d2h_bw = 25GB/s\n", "pcie.latency = 2.3us\n"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing " << line << r.out;
  }
  // The whole source line is kept (the loader ends a value at its first ';').
  EXPECT_NE(r.out.find("kernel_overhead and host"), std::string::npos) << r.out;

  r = Run("model mistral-7b-instruct-v0.2 --hardware a6000-pcie4 --tokens 2048");
  ASSERT_EQ(r.code, 0) << r.err;
  // KV per token: 2 x 32 layers x (8 x 128) x 2 B = 131,072 B.
  EXPECT_NE(r.out.find("131072 B"), std::string::npos) << r.out;
  // Parameters read per forward pass (embeddings excluded): per layer Q+K+V 4096 x (4096 +
  // 2 x 1024) = 25,165,824, O 16,777,216, FFN 3 x 4096 x 14336 = 176,160,768, two RMSNorms 8,192
  // -> 218,112,000 x 32 = 6,979,584,000; LM head 4096 x 32000 + final norm 4096 = 131,076,096;
  // total 7,110,660,096 = 7.11B, 14.2 GB at 2 B.
  EXPECT_NE(r.out.find("7.11B parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("= 14.2 GB of weights"), std::string::npos) << r.out;
  // 154.8 TFLOP/s prints as 155; the datasheet's 768 GB/s.
  EXPECT_NE(r.out.find("GPU 155 TFLOP/s x 0.60"), std::string::npos) << r.out;
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
