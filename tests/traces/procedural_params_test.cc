#include <gtest/gtest.h>

#include "core/errors.h"
#include "traces/importance_model.h"

namespace kvtier {
namespace {

TEST(ProceduralParamsParse, RoundTripsToString) {
  ProceduralParams p;
  p.seed = 42;
  p.head_corr = {0.9, 0.5};
  p.layer_corr = 0.7;
  p.query_dependence = 0.3;
  p.sink_tokens = 2;
  p.sink_boost = 4.5;
  p.tail = 1.25;
  ProceduralParams q = ProceduralParams::Parse(p.ToString(), "test");
  EXPECT_EQ(q.seed, 42u);
  EXPECT_EQ(q.head_corr, p.head_corr);
  EXPECT_DOUBLE_EQ(q.layer_corr, 0.7);
  EXPECT_DOUBLE_EQ(q.query_dependence, 0.3);
  EXPECT_EQ(q.sink_tokens, 2);
  EXPECT_DOUBLE_EQ(q.sink_boost, 4.5);
  EXPECT_DOUBLE_EQ(q.tail, 1.25);
}

TEST(ProceduralParamsParse, MissingKeysKeepDefaults) {
  ProceduralParams q = ProceduralParams::Parse("layer_corr=0.5", "x");
  EXPECT_DOUBLE_EQ(q.layer_corr, 0.5);
  EXPECT_EQ(q.head_corr, ProceduralParams().head_corr);
}

TEST(ProceduralParamsParse, BadInputNamesWhereAndWhat) {
  auto message = [](const std::string& text) {
    try {
      ProceduralParams::Parse(text, "e.ini:7: workload.importance");
    } catch (const InputError& e) {  // ConfigError, or InputError from Validate
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("colour=3").find("e.ini:7: workload.importance: unknown importance "
                                     "parameter 'colour'"), std::string::npos);
  EXPECT_NE(message("tail=abc").find("cannot parse 'tail=abc'"), std::string::npos);
  EXPECT_NE(message("seed").find("expected key=value"), std::string::npos);
  EXPECT_NE(message("layer_corr=2").find("e.ini:7"), std::string::npos) << "Validate's range";
  // Regression (probing, 2026-12-01, second sitting): std::stoull/stod/stoi stopped at the first
  // character they could not read, and stoull took a sign: seed=1e30 ran with seed 1, seed=-1
  // with 2^64 - 1, tail=1.5x with 1.5, sink_tokens=3.7 with 3; a repeated key's last value won.
  for (const char* text : {"seed=1e30", "seed=-1", "tail=1.5x", "sink_tokens=3.7",
                           "head_corr=0.9,0.8x", "seed=18446744073709551616"}) {
    EXPECT_NE(message(text).find(std::string("cannot parse '") + text + "'"), std::string::npos)
        << text << ": " << message(text);
  }
  EXPECT_NE(message("seed=1 seed=2").find("workload.importance: 'seed' given twice"),
            std::string::npos)
      << message("seed=1 seed=2");
  EXPECT_EQ(ProceduralParams::Parse("seed=18446744073709551615 tail=2e0", "x").seed,
            18446744073709551615ull);
}

}  // namespace
}  // namespace kvtier
