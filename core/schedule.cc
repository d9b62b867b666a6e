#include "core/schedule.h"

#include "core/options.h"
#include "core/selector.h"

namespace kvtier {

// Factories, one per file in core/schedules/.
std::unique_ptr<Schedule> NewRecomputeSchedule(const ModelSpec& model, const SystemOptions& system,
                                               TokenSelector* selector);
std::unique_ptr<Schedule> NewLayerwiseSchedule(const ModelSpec& model, const SystemOptions& system,
                                               TokenSelector* selector);
std::unique_ptr<Schedule> NewCakeSchedule(const ModelSpec& model, const SystemOptions& system,
                                          TokenSelector* selector);

namespace {

// The one table of schedules. A new schedule adds one line here (and its file).
//  name  factory  help  reuses  loads_before_query
constexpr ScheduleInfo kSchedules[] = {
    {"recompute", &NewRecomputeSchedule,
     "no reuse: every layer computes the whole prefix and the query (ReComp)", false, false},
    {"layerwise", &NewLayerwiseSchedule,
     "per layer: the selector's loads, then the layer's compute (prefetch.mode overlaps the "
     "next layer's loads)",
     true, false},
    {"cake", &NewCakeSchedule,
     "Cake: GPU computes prefix chunks front to back while I/O loads them back to front; "
     "rows from the selector's query-free choice",
     true, true},
};

// The one table of prefetch modes.
constexpr PrefetchModeInfo kPrefetchModes[] = {
    {"none", PrefetchMode::kNone, "a layer's loads wait for the previous layer's compute"},
    {"layer", PrefetchMode::kLayer,
     "load what layer l+1 is predicted to need during layer l (SPEC IV-C; AS's preload)"},
};

}  // namespace

std::span<const ScheduleInfo> Schedules() { return kSchedules; }

std::vector<Choice> ScheduleChoices() { return ChoicesOf(Schedules()); }

const ScheduleInfo& FindSchedule(std::string_view name, std::string_view key) {
  return FindEntry(Schedules(), name, key, "schedule");
}

std::unique_ptr<Schedule> NewSchedule(std::string_view name, const ModelSpec& model,
                                      const SystemOptions& system, TokenSelector* selector,
                                      std::string_view key) {
  return FindSchedule(name, key).make(model, system, selector);
}

std::span<const PrefetchModeInfo> PrefetchModes() { return kPrefetchModes; }

std::vector<Choice> PrefetchModeChoices() { return ChoicesOf(PrefetchModes()); }

PrefetchMode FindPrefetchMode(std::string_view name, std::string_view key) {
  return FindEntry(PrefetchModes(), name, key, "prefetch mode").mode;
}

}  // namespace kvtier
