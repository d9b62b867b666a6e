#pragma once
// FaultPlan: which faults `kvtier hw` injects into its own I/O and device calls, parsed from the
// test key `hw.fault_injection` (docs/reliability.md, "Fault injection"). Plain data: the
// injection itself is hw/fault_injection.h, which wraps the I/O engine, the chunk store's data
// writes and the device backend only when a plan is not empty, so a run without one executes
// exactly the code it would without this file. The parser lives in core so that
// `kvtier config --check` rejects a bad plan as a run would (BuildOptions).
//
// Syntax: a comma-separated list of `KIND@WHEN` or, for slow_read, `KIND@WHEN=DELAY`:
//   WHEN   N (the N-th event of the kind's class, 1-based, counted over the run) or * (every one)
//   DELAY  a duration ("20ms", "1s"), how long each slowed read's completion is held
// e.g. `read_eio@3`, `torn_write@2,slow_read@*=5ms`, `device_h2d@1`. Events are counted per
// class: SSD read requests (read_eio, short_read, slow_read), chunk writes (the write_* and
// torn_write* kinds; prewarm's writes included), and device-backend calls of one lane (H2D
// copies of any method, D2H copies, CPU gathers, compute steps). Two rules on the same event of
// one class: the first listed applies.
//
// Thread safety: a FaultPlan is immutable after parsing.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"

namespace kvtier {

enum class FaultKind : std::uint8_t {
  kReadEio,          // an SSD read completes with EIO, nothing delivered
  kShortRead,        // an SSD read delivers the first half of its bytes, then reports short
  kSlowRead,         // an SSD read completes correctly, its completion held for the delay
  kWriteEnospc,      // a chunk write fails with ENOSPC before any byte lands
  kWriteEio,         // a chunk write fails with EIO before any byte lands
  kTornWrite,        // a chunk write lands its first half, then fails with EIO; the run goes on
  kTornWriteKill,    // a chunk write lands its first half, then the process is killed (SIGKILL)
  kTornWriteSilent,  // a chunk write lands its first half and reports success (a device that
                     // acknowledged a write it did not finish: what a power loss leaves)
  kDeviceH2D,        // a device-backend H2D copy (Copy, CopyBatched, DeviceGather) fails
  kDeviceD2H,        // a device-backend D2H copy fails
  kDeviceGather,     // a device-backend CPU gather fails
  kDeviceCompute,    // a device-backend compute step fails
};

// The classes events are counted in (one counter each).
enum class FaultClass : std::uint8_t { kRead, kWrite, kH2D, kD2H, kGather, kCompute };
inline constexpr int kNumFaultClasses = 6;
std::string_view FaultClassName(FaultClass c);  // "read", "write", "h2d", "d2h", "gather", "compute"
inline constexpr int kNumFaultKinds = 12;

struct FaultKindInfo {
  FaultKind kind;
  const char* name;  // as written in hw.fault_injection
  FaultClass event_class;
  const char* help;
};
// Every kind, in FaultKind order: the one name table.
std::span<const FaultKindInfo> FaultKinds();
const FaultKindInfo& Info(FaultKind kind);

struct FaultRule {
  FaultKind kind = FaultKind::kReadEio;
  std::uint64_t nth = 1;  // 1-based event number in the kind's class; 0 = every event
  Seconds delay_s = 0;    // kSlowRead: how long the completion is held
};

struct FaultPlan {
  std::vector<FaultRule> rules;
  std::string spec;  // as given, for messages
  bool empty() const { return rules.empty(); }
};

// Parses `spec` ("" is the empty plan). Throws ConfigError starting with `where` (e.g.
// "x.ini:12: hw.fault_injection") that names the bad item and lists the valid kinds.
FaultPlan ParseFaultPlan(std::string_view spec, const std::string& where);

}  // namespace kvtier
