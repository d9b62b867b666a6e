// Measured layer tables (models/layer_table.h): the CSV parser's checks, and ComputeTimer's
// lookup — exact hits return the measured time, ratios interpolate in log(tokens) between
// points and clamp outside them, kinds without rows fall back to the roofline exactly.

#include "models/layer_table.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "models/cost_model.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

ModelSpec Small() {
  ModelSpec m;
  m.name = "small";
  m.family = ModelFamily::kLlama;
  m.layers = 4;
  m.hidden = 256;
  m.heads = 8;
  m.kv_heads = 4;
  m.head_dim = 32;
  m.ffn = 512;
  m.vocab = 1000;
  m.max_context = 1 << 20;
  return m;
}

HardwareOptions Hw() {
  HardwareOptions hw;
  hw.gpu_flops = 1e12;
  hw.gpu_efficiency = 0.5;
  hw.gpu_mem_bw = 1e11;
  hw.gpu_kernel_overhead = 10e-6;
  return hw;
}

LayerTable Parse(const std::string& text, const std::string& name = "t.csv") {
  std::istringstream in(text);
  return ParseLayerTable(in, name);
}

std::string ErrorOf(const std::string& text) {
  try {
    Parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

ComputeOp Op(ComputeKind kind, std::int64_t n, std::int64_t m, int heads = 0) {
  ComputeOp op;
  op.kind = kind;
  op.new_tokens = n;
  op.context_tokens = m;
  op.heads = heads;
  return op;
}

constexpr const char* kHeader = "kind,new_tokens,context_tokens,heads,seconds\n";

// A 2 x 2 prefill grid: n in {16, 64}, m in {64, 256}, with measured times chosen so the four
// ratios differ.
const char* kGrid =
    "kind,new_tokens,context_tokens,heads,seconds\n"
    "layer_prefill,16,64,0,200us\n"
    "layer_prefill,16,256,0,0.0003\n"
    "layer_prefill,64,64,0,0.0005\n"
    "layer_prefill,64,256,0,0.0009\n";

TEST(LayerTableParse, ReadsRowsMetaAndUnits) {
  const LayerTable t = Parse(std::string("# kvtier layer table v1\n# model = small\n\n") + kGrid +
                             "# a comment\noutput_layer,1,1,0,1e-5\n");
  ASSERT_EQ(t.points.size(), 5u);
  EXPECT_EQ(t.meta.at("model"), "small");
  EXPECT_EQ(t.points[0].kind, LayerStepKind::kLayerPrefill);
  EXPECT_EQ(t.points[0].new_tokens, 16);
  EXPECT_EQ(t.points[0].context_tokens, 64);
  EXPECT_DOUBLE_EQ(t.points[0].seconds, 200e-6);
  EXPECT_EQ(t.points[0].line, 5);
  EXPECT_EQ(t.points[4].kind, LayerStepKind::kOutputLayer);
}

TEST(LayerTableParse, FormatRoundTrips) {
  LayerTable t = Parse(kGrid);
  t.meta["model"] = "small";
  const LayerTable back = Parse(FormatLayerTable(t));
  ASSERT_EQ(back.points.size(), t.points.size());
  EXPECT_EQ(back.meta.at("model"), "small");
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    EXPECT_EQ(back.points[i].kind, t.points[i].kind);
    EXPECT_EQ(back.points[i].new_tokens, t.points[i].new_tokens);
    EXPECT_EQ(back.points[i].context_tokens, t.points[i].context_tokens);
    EXPECT_NEAR(back.points[i].seconds, t.points[i].seconds, 1e-15);
  }
}

TEST(LayerTableParse, BadInputNamesFileLineAndColumn) {
  const std::string h = kHeader;
  struct Case {
    std::string text;
    std::vector<std::string> expect;
  };
  const Case cases[] = {
      {"kind,n,m,heads,seconds\nlayer_prefill,1,1,0,1\n", {"t.csv:1:", "expected the header"}},
      {"", {"t.csv:", "no header"}},
      {h + "layer_prefill,16,64,0,1e-4\nlayer_prefill,x16,64,0,1e-4\n",
       {"t.csv:3:", "column 2 (new_tokens)", "x16"}},
      {h + "layer_prefill,16,64,0,fast\n", {"t.csv:2:", "column 5 (seconds)", "fast"}},
      {h + "layer_prefill,16,64,0,-1e-4\n", {"t.csv:2:", "column 5 (seconds)"}},
      {h + "layer_prefill,16,64,0,0\n", {"t.csv:2:", "column 5 (seconds)", "> 0"}},
      {h + "layer_prefill,16,64,0,1e-4\n\nlayer_prefill,16,64,0,2e-4\n",
       {"t.csv:4:", "duplicate", "line 2"}},
      {h + "layer_prefil,16,64,0,1e-4\n", {"t.csv:2:", "column 1 (kind)", "layer_prefil"}},
      {h + "layer_prefill,16,64,0\n", {"t.csv:2:", "expected 5 fields"}},
      {h + "layer_prefill,64,16,0,1e-4\n", {"t.csv:2:", "column 3 (context_tokens)"}},
      {h + "layer_prefill,16,64,2,1e-4\n", {"t.csv:2:", "column 4 (heads)"}},
      {h + "probe_scores,16,64,0,1e-4\n", {"t.csv:2:", "column 4 (heads)"}},
      {h + "output_layer,2,2,0,1e-4\n", {"t.csv:2:", "column 2 (new_tokens)"}},
      {h + "decode_layer,4,64,0,1e-4\n", {"t.csv:2:", "column 2 (new_tokens)"}},
      {h + "decode_layer,1,-5,0,1e-4\n", {"t.csv:2:", "column 3 (context_tokens)"}},
  };
  for (const Case& c : cases) {
    const std::string msg = ErrorOf(c.text);
    for (const std::string& e : c.expect) {
      EXPECT_NE(msg.find(e), std::string::npos) << "input:\n" << c.text << "message: " << msg;
    }
  }
}

TEST(LayerTableParse, MissingFileIsAConfigError) {
  try {
    ReadLayerTable("/nonexistent/kvtier-layers.csv");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/kvtier-layers.csv"), std::string::npos);
  }
}

TEST(ComputeTimer, WithoutTableIsTheRoofline) {
  const ModelSpec m = Small();
  const ComputeTimer timer(m, Hw());
  EXPECT_FALSE(timer.has_table());
  EXPECT_TRUE(timer.MissingKinds().empty());
  EXPECT_EQ(timer.MissingKindsNote(), "");
  for (const ComputeOp& op :
       {Op(ComputeKind::kLayerPrefill, 100, 900), Op(ComputeKind::kChunkPrefill, 64, 64),
        Op(ComputeKind::kProbeScores, 10, 500, 2), Op(ComputeKind::kFullScores, 10, 500),
        Op(ComputeKind::kOutputLayer, 1, 1), Op(ComputeKind::kDecodeStep, 1, 700)}) {
    EXPECT_EQ(timer.OpSeconds(op), ComputeSeconds(m, Hw(), op)) << ComputeKindName(op.kind);
  }
}

TEST(ComputeTimer, ExactHitsReturnTheMeasuredTime) {
  const ModelSpec m = Small();
  const ComputeTimer timer(m, Hw(), Parse(kGrid));
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 16, 64)), 200e-6, 1e-15);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 16, 256)), 300e-6, 1e-15);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 64, 64)), 500e-6, 1e-15);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 64, 256)), 900e-6, 1e-15);
  // A chunk prefill is `layers` layer steps.
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kChunkPrefill, 64, 256)), 4 * 900e-6, 1e-14);
}

TEST(ComputeTimer, InterpolatesTheRatioInLogTokens) {
  const ModelSpec m = Small();
  const HardwareOptions hw = Hw();
  const ComputeTimer timer(m, hw, Parse(kGrid));
  auto ratio = [&](std::int64_t n, std::int64_t c, double s) {
    return s / timer.StepRoofline(LayerStepKind::kLayerPrefill, n, c);
  };
  const double r00 = ratio(16, 64, 200e-6), r01 = ratio(16, 256, 300e-6);
  const double r10 = ratio(64, 64, 500e-6), r11 = ratio(64, 256, 900e-6);
  // n = 32, m = 128 are the geometric midpoints: the mean of the four corner ratios.
  const double mid = (r00 + r01 + r10 + r11) / 4;
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 32, 128), mid, 1e-12);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 32, 128)),
              mid * timer.StepRoofline(LayerStepKind::kLayerPrefill, 32, 128), 1e-15);
  // Along an edge (n = 16): a quarter of the way in log(m) from 64 to 256 is m = 64 * 4^0.25.
  const double quarter = std::log(91.0 / 64) / std::log(4.0);
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 16, 91), r00 + quarter * (r01 - r00),
              1e-12);
  // The time stays between the roofline-scaled neighbours.
  const double t = timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 32, 128));
  EXPECT_GT(t, 200e-6);
  EXPECT_LT(t, 900e-6);
}

TEST(ComputeTimer, ClampsOutsideTheGrid) {
  const ModelSpec m = Small();
  const ComputeTimer timer(m, Hw(), Parse(kGrid));
  auto ratio = [&](std::int64_t n, std::int64_t c, double s) {
    return s / timer.StepRoofline(LayerStepKind::kLayerPrefill, n, c);
  };
  // Beyond the largest n and m: the (64, 256) corner's ratio, times the op's own roofline.
  const double r11 = ratio(64, 256, 900e-6);
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 4096, 100000), r11, 1e-12);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 4096, 100000)),
              r11 * timer.StepRoofline(LayerStepKind::kLayerPrefill, 4096, 100000), 1e-12);
  // Below the smallest: the (16, 64) corner. An empty prefill (n = 0) counts as n = 1.
  const double r00 = ratio(16, 64, 200e-6);
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 1, 2), r00, 1e-12);
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 0, 0), r00, 1e-12);
  // Small n, large m: the n = 16 column's last point.
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 4, 10000), ratio(16, 256, 300e-6), 1e-12);
}

TEST(ComputeTimer, TriangularGridKeepsEachColumnsRange) {
  // A calibrate-style grid: n = 16 measured at m = 16 and 1040; n = 512 only at m = 512.
  const ModelSpec m = Small();
  const ComputeTimer timer(m, Hw(),
                           Parse(std::string(kHeader) + "layer_prefill,16,16,0,1e-4\n"
                                                        "layer_prefill,16,1040,0,3e-4\n"
                                                        "layer_prefill,512,512,0,2e-3\n"));
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 16, 1040)), 3e-4, 1e-15);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 512, 512)), 2e-3, 1e-15);
  // n = 512 at m = 2048: the single-point column clamps to its ratio.
  const double r512 = 2e-3 / timer.StepRoofline(LayerStepKind::kLayerPrefill, 512, 512);
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 512, 2048), r512, 1e-12);
  // Between the columns (n = 90.5, geometric middle of 16 and 512) at m = 1040: the mean of
  // the n = 16 column at 1040 and the n = 512 column (clamped).
  const double r16 = 3e-4 / timer.StepRoofline(LayerStepKind::kLayerPrefill, 16, 1040);
  const double x = std::log(90.0 / 16) / std::log(32.0);
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kLayerPrefill, 90, 1040), r16 + x * (r512 - r16), 1e-12);
}

TEST(ComputeTimer, DecodeOutputAndScoreKinds) {
  const ModelSpec m = Small();
  const HardwareOptions hw = Hw();
  const ComputeTimer timer(m, hw,
                           Parse(std::string(kHeader) + "decode_layer,1,100,0,50us\n"
                                                        "decode_layer,1,10000,0,150us\n"
                                                        "output_layer,1,1,0,30us\n"
                                                        "probe_scores,32,1024,1,40us\n"
                                                        "probe_scores,32,1024,3,90us\n"
                                                        "full_scores,32,1024,0,200us\n"));
  // Decode step = layers x decode_layer(m) + output_layer; at m = 1000 (log-middle of 100 and
  // 10000) the decode ratio is the mean of the two.
  auto rd = [&](std::int64_t c, double s) {
    return s / timer.StepRoofline(LayerStepKind::kDecodeLayer, 1, c);
  };
  const double r = (rd(100, 50e-6) + rd(10000, 150e-6)) / 2;
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kDecodeStep, 1, 1000)),
              4 * r * timer.StepRoofline(LayerStepKind::kDecodeLayer, 1, 1000) + 30e-6, 1e-14);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kOutputLayer, 1, 1)), 30e-6, 1e-15);
  // Probe scores: exact heads, and heads = 2 (equally far from 1 and 3) uses heads = 1's ratio.
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kProbeScores, 32, 1024, 3)), 90e-6, 1e-15);
  const double r1 = 40e-6 / timer.StepRoofline(LayerStepKind::kProbeScores, 32, 1024, 1);
  EXPECT_NEAR(timer.Ratio(LayerStepKind::kProbeScores, 32, 1024, 2), r1, 1e-12);
  // Full scores: heads 0 and heads = kv_heads are the same point.
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kFullScores, 32, 1024, 0)), 200e-6, 1e-15);
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kFullScores, 32, 1024, 4)), 200e-6, 1e-15);
  EXPECT_EQ(timer.MissingKinds(), std::vector<LayerStepKind>{LayerStepKind::kLayerPrefill});
}

TEST(ComputeTimer, KindsWithoutRowsUseTheRooflineExactly) {
  const ModelSpec m = Small();
  const HardwareOptions hw = Hw();
  const ComputeTimer timer(m, hw, Parse(kGrid));
  for (const ComputeOp& op :
       {Op(ComputeKind::kProbeScores, 10, 500, 2), Op(ComputeKind::kFullScores, 10, 500),
        Op(ComputeKind::kOutputLayer, 1, 1), Op(ComputeKind::kDecodeStep, 1, 700)}) {
    EXPECT_EQ(timer.OpSeconds(op), ComputeSeconds(m, hw, op)) << ComputeKindName(op.kind);
  }
  ASSERT_EQ(timer.MissingKinds().size(), 4u);
  const std::string note = timer.MissingKindsNote();
  EXPECT_NE(note.find("t.csv"), std::string::npos) << note;
  EXPECT_NE(note.find("probe_scores, full_scores, output_layer, decode_layer"), std::string::npos)
      << note;
  EXPECT_NE(note.find("roofline"), std::string::npos) << note;
}

TEST(ComputeTimer, RejectsTablesThatDoNotFitTheModel) {
  const ModelSpec m = Small();
  try {
    ComputeTimer(m, Hw(), Parse(std::string(kHeader) + "probe_scores,32,1024,5,40us\n"));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.csv:2: column 4 (heads)"), std::string::npos)
        << e.what();
  }
  try {
    ComputeTimer(m, Hw(), Parse(std::string("# model = opt-13b\n") + kGrid));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("opt-13b"), std::string::npos) << e.what();
  }
}

// gpu.layer_table resolves against the file that sets it (a profile names a CSV beside it);
// on the command line, against the working directory.
TEST(ComputeTimer, TablePathResolvesNextToTheProfile) {
  const char* env = std::getenv("KVTIER_SOURCE_DIR");
  const fs::path src = env ? fs::path(env) : fs::path(KVTIER_SOURCE_DIR_FALLBACK);
  setenv("KVTIER_CONFIG_DIR", (src / "configs").c_str(), 1);
  const fs::path dir = fs::temp_directory_path() / ("kvtier_lt_" + std::to_string(::getpid()));
  fs::create_directories(dir / "hw");
  std::ofstream(dir / "hw" / "box.ini")
      << "[hardware]\nname = box\n[gpu]\nlayer_table = box.layers.csv\n";
  std::ofstream(dir / "hw" / "box.layers.csv") << "# model = smollm2-135m\n"
                                               << kHeader << "layer_prefill,16,64,0,1e-4\n";
  std::ofstream(dir / "e.ini")
      << "[include]\nmodel = smollm2-135m\nhardware = hw/box.ini\n[experiment]\nname = x\n";
  const ExperimentOptions o = BuildOptions(Config::Load((dir / "e.ini").string(), {}));
  EXPECT_EQ(fs::path(o.hardware.gpu_layer_table), dir / "hw" / "box.layers.csv");
  const ComputeTimer timer = ComputeTimer::FromOptions(o.model, o.hardware);
  EXPECT_TRUE(timer.has_table());
  EXPECT_NEAR(timer.OpSeconds(Op(ComputeKind::kLayerPrefill, 16, 64)), 1e-4, 1e-15);
  const ExperimentOptions cli =
      BuildOptions(Config::Load((dir / "e.ini").string(), {"--gpu.layer_table=rel/t.csv"}));
  EXPECT_EQ(cli.hardware.gpu_layer_table, "rel/t.csv");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvtier
