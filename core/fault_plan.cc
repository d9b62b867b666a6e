#include "core/fault_plan.h"

#include <stdexcept>

#include "core/errors.h"
#include "core/units.h"

namespace kvtier {
namespace {

constexpr FaultKindInfo kKinds[] = {
    {FaultKind::kReadEio, "read_eio", FaultClass::kRead, "an SSD read fails with EIO"},
    {FaultKind::kShortRead, "short_read", FaultClass::kRead,
     "an SSD read delivers half its bytes and reports a short read"},
    {FaultKind::kSlowRead, "slow_read", FaultClass::kRead,
     "an SSD read's completion is held for the delay (=DURATION), then delivered intact"},
    {FaultKind::kWriteEnospc, "write_enospc", FaultClass::kWrite,
     "a chunk write fails with ENOSPC, nothing written"},
    {FaultKind::kWriteEio, "write_eio", FaultClass::kWrite,
     "a chunk write fails with EIO, nothing written"},
    {FaultKind::kTornWrite, "torn_write", FaultClass::kWrite,
     "a chunk write lands its first half, then fails with EIO"},
    {FaultKind::kTornWriteKill, "torn_write_kill", FaultClass::kWrite,
     "a chunk write lands its first half, then the process is killed (SIGKILL)"},
    {FaultKind::kTornWriteSilent, "torn_write_silent", FaultClass::kWrite,
     "a chunk write lands its first half and reports success"},
    {FaultKind::kDeviceH2D, "device_h2d", FaultClass::kH2D,
     "a device-backend H2D copy fails (CudaError)"},
    {FaultKind::kDeviceD2H, "device_d2h", FaultClass::kD2H,
     "a device-backend D2H copy fails (CudaError)"},
    {FaultKind::kDeviceGather, "device_gather", FaultClass::kGather,
     "a device-backend CPU gather fails (CudaError)"},
    {FaultKind::kDeviceCompute, "device_compute", FaultClass::kCompute,
     "a device-backend compute step fails (CudaError)"},
};
static_assert(std::size(kKinds) == kNumFaultKinds);

std::string ValidKinds() {
  std::string s;
  for (const FaultKindInfo& k : kKinds) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::span<const FaultKindInfo> FaultKinds() { return kKinds; }

std::string_view FaultClassName(FaultClass c) {
  switch (c) {
    case FaultClass::kRead: return "read";
    case FaultClass::kWrite: return "write";
    case FaultClass::kH2D: return "h2d";
    case FaultClass::kD2H: return "d2h";
    case FaultClass::kGather: return "gather";
    case FaultClass::kCompute: return "compute";
  }
  return "?";
}

const FaultKindInfo& Info(FaultKind kind) { return kKinds[static_cast<int>(kind)]; }

FaultPlan ParseFaultPlan(std::string_view spec, const std::string& where) {
  FaultPlan plan;
  plan.spec = std::string(spec);
  if (Trim(spec).empty()) return plan;
  const std::string syntax =
      " (write KIND@N, KIND@*, or slow_read@N=DURATION / slow_read@*=DURATION; kinds: " +
      ValidKinds() + ")";
  std::string_view rest = spec;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = Trim(rest.substr(0, comma));
    auto bad = [&](const std::string& why) {
      return ConfigError(where + ": '" + std::string(item) + "': " + why + syntax);
    };
    const size_t at = item.find('@');
    if (item.empty()) throw bad("empty item");
    if (at == std::string_view::npos) throw bad("no '@' saying which event");
    const std::string_view name = item.substr(0, at);
    const FaultKindInfo* info = nullptr;
    for (const FaultKindInfo& k : kKinds) {
      if (name == k.name) info = &k;
    }
    if (info == nullptr) throw bad("unknown fault kind '" + std::string(name) + "'");
    FaultRule rule;
    rule.kind = info->kind;
    std::string_view when = item.substr(at + 1);
    const size_t eq = when.find('=');
    std::string_view delay;
    if (eq != std::string_view::npos) {
      delay = when.substr(eq + 1);
      when = when.substr(0, eq);
    }
    if (when == "*") {
      rule.nth = 0;
    } else {
      long long n = 0;
      try {
        n = ParseInt(when);
      } catch (const std::invalid_argument&) {
        throw bad("event '" + std::string(when) + "' is not a number or *");
      }
      if (n < 1) throw bad("events are counted from 1");
      rule.nth = static_cast<std::uint64_t>(n);
    }
    if (rule.kind == FaultKind::kSlowRead) {
      if (eq == std::string_view::npos) throw bad("slow_read needs =DURATION");
      try {
        rule.delay_s = ParseDuration(delay);
      } catch (const std::invalid_argument& e) {
        throw bad(std::string("delay: ") + e.what());
      }
      if (!(rule.delay_s > 0) || rule.delay_s > 3600) throw bad("delay must be in (0, 1h]");
    } else if (eq != std::string_view::npos) {
      throw bad("only slow_read takes =DURATION");
    }
    plan.rules.push_back(rule);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return plan;
}

}  // namespace kvtier
