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
}

}  // namespace
}  // namespace kvtier
