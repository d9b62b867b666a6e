#pragma once
// Schedule: the order of one request's loads and computes -- everything between the radix
// lookup and the output layer. A system names one with `schedule.policy`:
//
//   recompute  no reuse: every layer computes the whole prefix and the query (ReComp).
//   layerwise  layer by layer: the selector loads what layer l keeps, then layer l computes
//              NR + Q attending to it; prefetch.mode = layer overlaps layer l+1's predicted
//              loads with layer l (SPEC §IV-C, AS's preload); none waits for layer l first.
//   cake       Cake's bidirectional loop (Appendix A): the GPU computes R's chunks front to
//              back while I/O loads them back to front until they meet, then NR + Q over all
//              layers; its loads take the selector's query-free choice of rows.
//
// Implementations live one per file in core/schedules/, registered in the one table in
// core/schedule.cc; the config key's choices, `kvtier config --keys` and errors derive from
// it. A schedule acts through the RequestRun (core/request_run.h) -- its LoadPlanner for
// loads, SubmitCompute/Wait/WaitAny -- and through its TokenSelector; never the Executor directly.
//
// A request's phases: Prefill (this interface) ends when every layer's KV of the prefix and
// query exists; Pipeline::Run then computes the output layer and stores NR. Decoding after the
// first token is not a Schedule: a continuous batch spans requests, so it is the Pipeline's
// DecodeEngine (core/decode_engine.h, decode.policy), which a request joins after its prefill.
//
// Thread safety: one Schedule per Pipeline, shared by the requests in flight; Prefill waits,
// and other requests' Prefill may run inside those waits, so a schedule keeps its per-request
// state on the stack or in the RequestRun.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/model_spec.h"
#include "core/registry.h"
#include "core/status.h"

namespace kvtier {

class RequestRun;
class TokenSelector;
struct SystemOptions;

class Schedule {
 public:
  virtual ~Schedule() = default;

  // Submits and waits for one request's prefill: loads and computes of every layer for the
  // reused prefix R (run.n tokens, run.match), the new prefix NR and the query Q. Fills
  // run.layer_compute (the last non-kNoOp entry is what the output layer waits for),
  // run.layer_gpu_ops, run.layers, run.kept_fraction (through RequestRun::Keep, where read) and
  // the request record's counters. Returns the first failure of an op it waited for, else OK
  // (Pipeline::Run retires every op either way).
  // REQUIRES: run.n > 0 and run.planner() mapped, unless reuses() is false.
  virtual Status Prefill(RequestRun& run) = 0;
};

// What makes a Schedule: the model, the system, and its selector (owned by the Pipeline,
// outliving the schedule; unused by recompute).
using ScheduleFactory = std::unique_ptr<Schedule> (*)(const ModelSpec& model,
                                                      const SystemOptions& system,
                                                      TokenSelector* selector);

// One line of the schedule table (core/schedule.cc).
struct ScheduleInfo {
  std::string_view name;  // schedule.policy
  ScheduleFactory make;
  std::string_view help;  // one line, for --keys and docs
  // Looks up and stores prefix KV (false: recompute; no lookup, no store, no reuse).
  bool reuses;
  // Loads before the query has reached a layer: its selector must not need the query
  // (SelectorInfo::needs_query), which BuildSystemOptions checks.
  bool loads_before_query;
};

std::span<const ScheduleInfo> Schedules();
std::vector<Choice> ScheduleChoices();
// The entry named `name`; throws ConfigError naming `key` and the valid names if none.
const ScheduleInfo& FindSchedule(std::string_view name, std::string_view key = "schedule.policy");
// A new schedule named `name` over `selector`.
std::unique_ptr<Schedule> NewSchedule(std::string_view name, const ModelSpec& model,
                                      const SystemOptions& system, TokenSelector* selector,
                                      std::string_view key = "schedule.policy");

// prefetch.mode, the layerwise schedule's knob: whether layer l+1's predicted loads are
// submitted during layer l. Other schedules ignore it.
enum class PrefetchMode { kNone, kLayer };
struct PrefetchModeInfo {
  std::string_view name;
  PrefetchMode mode;
  std::string_view help;
};
std::span<const PrefetchModeInfo> PrefetchModes();
std::vector<Choice> PrefetchModeChoices();
// The mode named `name`; throws ConfigError naming `key` and the valid names if none.
PrefetchMode FindPrefetchMode(std::string_view name, std::string_view key = "prefetch.mode");

}  // namespace kvtier
