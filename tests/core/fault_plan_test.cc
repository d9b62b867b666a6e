// hw.fault_injection's plan (core/fault_plan.h): what it accepts, and that anything else is a
// ConfigError naming the key, the item and the valid kinds (exit 2, from `config --check` too).

#include "core/fault_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "core/errors.h"

namespace kvtier {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(FaultPlan, ParsesKindsEventsAndDelays) {
  const FaultPlan p = ParseFaultPlan(" read_eio@3, slow_read@*=5ms ,device_h2d@1", "k");
  ASSERT_EQ(p.rules.size(), 3u);
  EXPECT_EQ(p.rules[0].kind, FaultKind::kReadEio);
  EXPECT_EQ(p.rules[0].nth, 3u);
  EXPECT_EQ(p.rules[1].kind, FaultKind::kSlowRead);
  EXPECT_EQ(p.rules[1].nth, 0u);
  EXPECT_DOUBLE_EQ(p.rules[1].delay_s, 0.005);
  EXPECT_EQ(p.rules[2].kind, FaultKind::kDeviceH2D);
  EXPECT_TRUE(ParseFaultPlan("", "k").empty());
  for (const FaultKindInfo& k : FaultKinds()) {
    const std::string spec = std::string(k.name) + "@2" + (k.kind == FaultKind::kSlowRead ? "=1ms" : "");
    EXPECT_EQ(ParseFaultPlan(spec, "k").rules.at(0).kind, k.kind) << spec;
  }
}

TEST(FaultPlan, BadPlansAreConfigErrorsNamingTheKeyAndTheItem) {
  const std::pair<const char*, const char*> bad[] = {
      {"read_eoi@1", "unknown fault kind 'read_eoi'"},
      {"read_eio", "no '@'"},
      {"read_eio@0", "counted from 1"},
      {"read_eio@x", "not a number or *"},
      {"slow_read@1", "needs =DURATION"},
      {"slow_read@1=fast", "delay:"},
      {"read_eio@1=5ms", "only slow_read"},
      {"read_eio@1,", "empty item"},
  };
  for (const auto& [spec, why] : bad) {
    try {
      ParseFaultPlan(spec, "x.ini:3: hw.fault_injection");
      ADD_FAILURE() << spec << " was accepted";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(Has(m, "x.ini:3: hw.fault_injection: '")) << m;
      EXPECT_TRUE(Has(m, why)) << m;
      EXPECT_TRUE(Has(m, "kinds: read_eio, short_read, slow_read")) << m;
    }
  }
}

}  // namespace
}  // namespace kvtier
