#include "core/options.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/fault_plan.h"
#include "core/selector.h"
#include "core/units.h"

namespace kvtier {
namespace {

int PositiveInt(const Config& c, const char* key) {
  long long v = c.GetInt(key);
  if (v <= 0 || v > (1LL << 30)) {
    throw ConfigError(c.Where(key) + ": must be a positive integer, got " + std::to_string(v));
  }
  return static_cast<int>(v);
}

// A bandwidth or compute rate: at least 1 (byte or FLOP) per second. Below that an op's time
// overflows to infinity (gpu.flops = 1e-300 made every compute step last forever and the
// simulator never finished), and no device is that slow.
double PerSecond(const Config& c, const char* key, double v) {
  if (!(v >= 1)) {
    std::ostringstream got;
    got << v;
    throw ConfigError(c.Where(key) + ": must be at least 1 per second" +
                      (v > 0 ? " (a slower device overflows the simulated time), got " +
                                   got.str() + " per second"
                             : ", got " + got.str()));
  }
  return v;
}

// A device's or driver's time per operation (a latency, an overhead, a cost): at most an hour.
// ssd.latency = 1e300 s passed `config --check` and the simulator printed TTFTs that were
// simply wrong (its clock stops resolving microseconds past ~1e10 s: sim/sim_executor.h
// kMaxSimulatedSeconds); no device takes an hour per operation.
constexpr Seconds kMaxOpSeconds = 3600;

Seconds OpSeconds(const Config& c, const char* key) {
  const Seconds v = c.GetDuration(key);
  if (!(v >= 0 && v <= kMaxOpSeconds)) {
    std::ostringstream got;
    got << v;
    throw ConfigError(c.Where(key) + ": must be in [0 s, 1 h] (a time per operation), got " +
                      got.str() + " s");
  }
  return v;
}

long long NonNegativeInt(const Config& c, const char* key) {
  const long long v = c.GetInt(key);
  if (v < 0) throw ConfigError(c.Where(key) + ": must be >= 0, got " + std::to_string(v));
  return v;
}

Bytes PositiveBytes(const Config& c, const char* key) {
  const Bytes v = c.GetBytes(key);
  if (v == 0) throw ConfigError(c.Where(key) + ": must be > 0");
  return v;
}

// A path key's value with "~/" expanded and a relative path made relative to the directory of
// the file that set it (origin "file:line"); set on the command line, relative to the working
// directory. So a hardware profile can name a file that sits next to it.
std::string ResolvePathKey(const Config& c, const char* key) {
  const std::string value = ExpandHome(c.GetString(key));
  if (value.empty()) return value;
  if (std::filesystem::path(value).is_absolute()) return value;
  const std::string& origin = c.Get(key).origin;
  const auto colon = origin.rfind(':');
  if (colon == std::string::npos || colon + 1 == origin.size() ||
      !std::all_of(origin.begin() + colon + 1, origin.end(),
                   [](unsigned char ch) { return std::isdigit(ch); })) {
    return value;  // command line or default
  }
  return (std::filesystem::path(origin.substr(0, colon)).parent_path() / value).string();
}

}  // namespace

ModelSpec BuildModelSpec(const Config& c) {
  ModelSpec m;
  m.name = c.GetString("model.name");
  m.family = c.GetString("model.family") == "opt" ? ModelFamily::kOpt : ModelFamily::kLlama;
  m.layers = PositiveInt(c, "model.layers");
  m.hidden = PositiveInt(c, "model.hidden");
  m.heads = PositiveInt(c, "model.heads");
  m.kv_heads = PositiveInt(c, "model.kv_heads");
  m.head_dim = PositiveInt(c, "model.head_dim");
  m.ffn = PositiveInt(c, "model.ffn");
  m.vocab = PositiveInt(c, "model.vocab");
  m.dtype_bytes = PositiveInt(c, "model.dtype_bytes");
  m.max_context = PositiveInt(c, "model.max_context");
  if (m.layers > static_cast<int>(kMaxLayers)) {
    throw ConfigError(c.Where("model.layers") + ": at most " + std::to_string(kMaxLayers));
  }
  if (m.heads % m.kv_heads != 0) {
    throw ConfigError(c.Where("model.kv_heads", "model.heads") + ": heads (" +
                      std::to_string(m.heads) +
                      ") must be a multiple of kv_heads (" + std::to_string(m.kv_heads) + ")");
  }
  if (m.family == ModelFamily::kOpt && m.kv_heads != m.heads) {
    throw ConfigError(c.Where("model.kv_heads", "model.family") +
                      ": OPT models have no GQA (kv_heads = heads)");
  }
  return m;
}

HardwareOptions BuildHardwareOptions(const Config& c) {
  HardwareOptions h;
  h.name = c.GetString("hardware.name");
  h.ssd_read_bw = PerSecond(c, "ssd.read_bw", c.GetBandwidth("ssd.read_bw"));
  h.ssd_write_bw = PerSecond(c, "ssd.write_bw", c.GetBandwidth("ssd.write_bw"));
  h.ssd_latency = OpSeconds(c, "ssd.latency");
  h.ssd_queue_depth = PositiveInt(c, "ssd.queue_depth");
  h.ssd_background_share = c.GetDouble("ssd.background_share");
  if (!(h.ssd_background_share > 0 && h.ssd_background_share <= 1)) {
    throw ConfigError(c.Where("ssd.background_share") + ": must be in (0, 1]");
  }
  h.ssd_capacity = c.GetBytes("ssd.capacity");
  h.ssd_write_lanes = int(c.GetInt("ssd.write_lanes"));
  if (h.ssd_write_lanes < 0) {
    throw ConfigError(c.Where("ssd.write_lanes") + ": must be >= 0 (0: no limit), got " +
                      c.GetString("ssd.write_lanes"));
  }
  h.cpu_memcpy_bw = PerSecond(c, "cpu.memcpy_bw", c.GetBandwidth("cpu.memcpy_bw"));
  h.cpu_gather_bw = PerSecond(c, "cpu.gather_bw", c.GetBandwidth("cpu.gather_bw"));
  h.cpu_op_overhead = OpSeconds(c, "cpu.op_overhead");
  h.cpu_driver_op_cost = OpSeconds(c, "cpu.driver_op_cost");
  h.cpu_driver_wake = OpSeconds(c, "cpu.driver_wake");
  h.cpu_shared_copy_bw = c.GetBandwidth("cpu.shared_copy_bw");  // finite, >= 0 (the parser)
  if (h.cpu_shared_copy_bw != 0) PerSecond(c, "cpu.shared_copy_bw", h.cpu_shared_copy_bw);
  h.pcie_h2d_bw = PerSecond(c, "pcie.h2d_bw", c.GetBandwidth("pcie.h2d_bw"));
  h.pcie_d2h_bw = PerSecond(c, "pcie.d2h_bw", c.GetBandwidth("pcie.d2h_bw"));
  h.pcie_latency = OpSeconds(c, "pcie.latency");
  h.pcie_batch_latency = OpSeconds(c, "pcie.batch_latency");
  h.pcie_descriptor_cost = OpSeconds(c, "pcie.descriptor_cost");
  h.cpu_gather_run_cost = OpSeconds(c, "cpu.gather_run_cost");
  h.gpu_gather_bw = PerSecond(c, "gpu.gather_bw", c.GetBandwidth("gpu.gather_bw"));
  h.gpu_gather_sm_share = c.GetDouble("gpu.gather_sm_share");
  if (!(h.gpu_gather_sm_share >= 0 && h.gpu_gather_sm_share < 1)) {
    throw ConfigError(c.Where("gpu.gather_sm_share") + ": must be in [0, 1), got " +
                      c.GetString("gpu.gather_sm_share"));
  }
  h.gpu_flops = PerSecond(c, "gpu.flops", c.GetRate("gpu.flops"));
  h.gpu_efficiency = c.GetDouble("gpu.efficiency");
  if (!(h.gpu_efficiency > 0 && h.gpu_efficiency <= 1)) {
    throw ConfigError(c.Where("gpu.efficiency") + ": must be in (0, 1]");
  }
  // The achieved rate is what the cost model divides by (gpu.efficiency = 1e-300 printed TTFTs
  // of 1e30 ms): at least 1 FLOP/s, as gpu.flops itself.
  if (!(h.gpu_flops * h.gpu_efficiency >= 1)) {
    throw ConfigError(c.Where("gpu.efficiency", "gpu.flops") +
                      ": gpu.flops x gpu.efficiency must be at least 1 FLOP/s");
  }
  h.gpu_mem_bw = PerSecond(c, "gpu.mem_bw", c.GetBandwidth("gpu.mem_bw"));
  h.gpu_kernel_overhead = OpSeconds(c, "gpu.kernel_overhead");
  h.gpu_concurrent_prefills = PositiveInt(c, "gpu.concurrent_prefills");
  // Each concurrent prefill is an in-flight request holding a pin slot of the caches.
  if (h.gpu_concurrent_prefills > TieredCache::kMaxHolders) {
    throw ConfigError(c.Where("gpu.concurrent_prefills") + ": at most " +
                      std::to_string(TieredCache::kMaxHolders) + " concurrent prefills, got " +
                      std::to_string(h.gpu_concurrent_prefills));
  }
  h.gpu_memory = PositiveBytes(c, "gpu.memory");
  h.gpu_layer_table = ResolvePathKey(c, "gpu.layer_table");
  return h;
}

SystemOptions BuildSystemOptions(const Config& c, const ModelSpec& model) {
  SystemOptions s;
  s.name = c.GetString("system.name");
  // A run is stored and compared under its system's name: `--systems as --system.name=spec`
  // stored as's policies as spec's. A variant may take any name but another shipped system's.
  if (const std::string included = c.Has("include.system") ? c.GetString("include.system") : "";
      !included.empty() && s.name != included && !c.files().empty()) {
    const std::vector<std::string> shipped =
        IncludableNames(FindConfigDir(c.files().front()), "systems");
    if (std::find(shipped.begin(), shipped.end(), s.name) != shipped.end()) {
      throw ConfigError(c.Where("system.name", "include.system") + ": '" + s.name +
                        "' is another shipped system, so its runs would be stored as that "
                        "system's; name this variant of " + included + " otherwise");
    }
  }
  // The policy names are valid choices of their keys (the key table derives them from the
  // registration tables); what is checked here is how they combine.
  s.schedule = c.GetString("schedule.policy");
  s.select = c.GetString("select.policy");
  s.itf_fallback = c.GetString("itf.fallback");
  const ScheduleInfo& schedule = FindSchedule(s.schedule, c.Where("schedule.policy"));
  const SelectorInfo& selector = FindSelector(s.select, c.Where("select.policy"));
  if (schedule.reuses && schedule.loads_before_query && selector.needs_query) {
    std::string query_free;
    for (const SelectorInfo& info : Selectors()) {
      if (info.needs_query) continue;
      query_free += (query_free.empty() ? "" : ", ") + std::string(info.name);
    }
    throw ConfigError(c.Where("select.policy") + ": '" + s.select +
                      "' reads the query's attention at each layer, but schedule.policy = " +
                      s.schedule + " (" + c.Get("schedule.policy").origin +
                      ") loads before the query reaches a layer; use a selector that reads no "
                      "query: " + query_free);
  }
  s.retention = c.GetDouble("select.retention");
  if (!(s.retention > 0 && s.retention <= 1)) {
    throw ConfigError(c.Where("select.retention") + ": retention ratio must be in (0, 1], got " +
                      c.GetString("select.retention"));
  }
  s.itf_options.probe_heads = static_cast<int>(c.GetInt("itf.probe_heads"));
  s.itf_options.alpha = c.GetDouble("itf.alpha");
  s.itf_options.retention = s.retention;
  if (s.itf_options.probe_heads < 1 || s.itf_options.probe_heads > model.kv_heads) {
    throw ConfigError(c.Where("itf.probe_heads", "model.kv_heads") +
                      ": must be in [1, kv_heads = " +
                      std::to_string(model.kv_heads) + "]");
  }
  if (s.itf_options.alpha < 0) throw ConfigError(c.Where("itf.alpha") + ": must be >= 0");
  s.prefetch = FindPrefetchMode(c.GetString("prefetch.mode"), c.Where("prefetch.mode"));
  s.cake_chunk_tokens = PositiveInt(c, "cake.chunk_tokens");
  s.reorder = c.GetBool("reorder.enabled");
  s.reorder_interval = c.GetDuration("reorder.interval");
  // Both were taken as written: a negative count of reuses, and a moving-average weight of 2
  // (each update then doubles the history and subtracts the new value), passed the check.
  s.reorder_min_accesses = static_cast<int>(NonNegativeInt(c, "reorder.min_accesses"));
  s.reorder_history_weight = c.GetDouble("reorder.history_weight");
  if (!(s.reorder_history_weight >= 0 && s.reorder_history_weight < 1)) {
    throw ConfigError(c.Where("reorder.history_weight") + ": must be in [0, 1)");
  }
  s.reorder_min_gain = c.GetDouble("reorder.min_gain");
  s.reorder_from_memory = c.GetBool("reorder.from_memory");
  if (!(s.reorder_min_gain >= 0 && s.reorder_min_gain <= 1)) {
    throw ConfigError(c.Where("reorder.min_gain") + ": must be in [0, 1]");
  }
  s.cache_policy = c.GetString("cache.policy");
  s.transfer_strategy =
      FindTransferStrategy(c.GetString("transfer.strategy"), c.Where("transfer.strategy"));
  s.ssd_read_unit =
      FindSsdReadUnit(c.GetString("transfer.ssd_read_unit"), c.Where("transfer.ssd_read_unit"));
  s.cache.gpu_capacity = c.GetBytes("cache.gpu_capacity");
  s.cache.cpu_capacity = c.GetBytes("cache.cpu_capacity");
  s.cache.history_weight = c.GetDouble("cache.history_weight");
  if (!(s.cache.history_weight >= 0 && s.cache.history_weight < 1)) {
    throw ConfigError(c.Where("cache.history_weight") + ": must be in [0, 1)");
  }
  s.chunk_tokens = PositiveInt(c, "cache.chunk_tokens");
  if (s.chunk_tokens > 65535) {
    throw ConfigError(c.Where("cache.chunk_tokens") + ": at most 65535 tokens per chunk");
  }
  s.store_new = c.GetBool("cache.store_new");
  DecodeBatchOptions& d = s.decode;
  d.policy = FindDecodePolicy(c.GetString("decode.policy"), c.Where("decode.policy"));
  d.bits = static_cast<int>(c.GetInt("decode.bits"));
  if (d.bits != 1 && d.bits != 2) {
    throw ConfigError(c.Where("decode.bits") + ": must be 1 or 2, got " + c.GetString("decode.bits"));
  }
  d.group = PositiveInt(c, "decode.group");
  d.residual = static_cast<int>(NonNegativeInt(c, "decode.residual"));
  d.topk = static_cast<int>(NonNegativeInt(c, "decode.topk"));
  // What hw's KIVI codes require (models/kivi.cc KiviConfig::Validate): the simulator took
  // decode.residual = 30 or 0 with group 64, a configuration the hardware path refuses; and
  // SpeCache with decode.topk = 0 fetched nothing (specache_nospec is the no-prefetch variant).
  const bool low_bit = d.policy == DecodePolicy::kKivi || d.policy == DecodePolicy::kSpeCache ||
                       d.policy == DecodePolicy::kSpeCacheNoSpec;
  if (low_bit && (d.residual < d.group || d.residual % d.group != 0)) {
    throw ConfigError(c.Where("decode.residual", "decode.group") + ": decode.residual (" +
                      std::to_string(d.residual) +
                      ") must be a positive multiple of decode.group (" +
                      std::to_string(d.group) + "): KIVI quantizes keys in whole groups");
  }
  if ((d.policy == DecodePolicy::kSpeCache || d.policy == DecodePolicy::kSpeCacheNoSpec) &&
      d.topk < 1) {
    throw ConfigError(c.Where("decode.topk") + ": must be >= 1 for decode.policy = " +
                      c.GetString("decode.policy") + " (the 16-bit pairs it fetches)");
  }
  d.max_batch = PositiveInt(c, "decode.max_batch");
  d.max_output_tokens = NonNegativeInt(c, "decode.max_output_tokens");
  d.gpu_reserve = c.GetBytes("decode.gpu_reserve");
  d.gpu_memory = c.GetBytes("gpu.memory");
  const Bytes chunk = model.ChunkBytes(s.chunk_tokens);
  for (const char* key : {"cache.gpu_capacity", "cache.cpu_capacity"}) {
    Bytes cap = c.GetBytes(key);
    if (schedule.reuses && cap != 0 && cap < chunk) {
      throw ConfigError(c.Where(key, "cache.chunk_tokens") + ": " + c.GetString(key) +
                        " is smaller than one chunk (" + std::to_string(chunk) + " B = " +
                        std::to_string(s.chunk_tokens) + " tokens of " + model.name +
                        "); use 0 to disable the tier");
    }
  }
  return s;
}

namespace {

// The entry of `system` in the per-system list `key` ("as=15.4us, spec=12.5us"), if any.
// Every entry is checked, whichever system runs, so `config --check` finds a bad one.
std::optional<Seconds> PerSystemDuration(const Config& c, const char* key,
                                         const std::string& system) {
  std::optional<Seconds> found;
  std::vector<std::string> seen;
  std::stringstream list(c.GetString(key));
  std::string entry;
  while (std::getline(list, entry, ',')) {
    const auto b = entry.find_first_not_of(" \t"), e = entry.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    entry = entry.substr(b, e - b + 1);
    const auto eq = entry.find('=');
    std::string name = eq == std::string::npos ? "" : entry.substr(0, eq);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
    if (name.empty()) {
      throw ConfigError(c.Where(key) + ": entry '" + entry + "' is not system=duration");
    }
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
      throw ConfigError(c.Where(key) + ": system '" + name + "' listed twice");
    }
    seen.push_back(name);
    Seconds v = 0;
    try {
      v = ParseDuration(entry.substr(eq + 1));
    } catch (const std::invalid_argument& err) {
      throw ConfigError(c.Where(key) + ": " + name + ": " + err.what());
    }
    if (!(v <= kMaxOpSeconds)) {
      throw ConfigError(c.Where(key) + ": " + name +
                        ": must be at most 1 h (a time per operation)");
    }
    if (name == system) found = v;
  }
  return found;
}

}  // namespace

ExperimentOptions BuildOptions(const Config& c) {
  ExperimentOptions o;
  o.experiment_name = c.GetString("experiment.name");
  o.model = BuildModelSpec(c);
  o.hardware = BuildHardwareOptions(c);
  o.system = BuildSystemOptions(c, o.model);
  // A system's own driving-thread times replace the pooled ones (kvtier calibrate --driver
  // times each system: cake's ops carry ~8x the planning of spec's on the 2-vCPU VM).
  if (auto v = PerSystemDuration(c, "cpu.driver_op_costs", o.system.name)) {
    o.hardware.cpu_driver_op_cost = *v;
  }
  if (auto v = PerSystemDuration(c, "cpu.driver_wakes", o.system.name)) {
    o.hardware.cpu_driver_wake = *v;
  }
  const long long warmup = NonNegativeInt(c, "run.warmup_requests");
  if (warmup > (1LL << 30)) throw ConfigError(c.Where("run.warmup_requests") + ": at most 2^30");
  o.run.warmup_requests = static_cast<int>(warmup);
  o.run.prewarm = c.GetBool("run.prewarm");
  o.run.max_requests = NonNegativeInt(c, "run.max_requests");
  o.run.seed = c.GetInt("run.seed");
  if (o.system.decode.on() && o.hardware.gpu_concurrent_prefills != 1) {
    throw ConfigError(c.Where("decode.policy", "gpu.concurrent_prefills") +
                      ": a decoding system serves one prefill at a time (the decode batch is "
                      "stepped between prefills); set gpu.concurrent_prefills = 1");
  }
  o.trace = c.GetString("workload.trace");
  o.importance = c.GetString("workload.importance");
  o.h2o_sampled = c.GetString("workload.h2o_selection") == "sampled";
  // `kvtier hw`'s sizes, checked here so `kvtier config --check` rejects them too (hw/run_hw.cc
  // reads them; what fits with a given model is checked when its executor starts).
  PositiveBytes(c, "hw.max_memory");
  PositiveBytes(c, "hw.ring");
  PositiveBytes(c, "hw.store_capacity");
  if (NonNegativeInt(c, "hw.driver_nice") > 19) {
    throw ConfigError(c.Where("hw.driver_nice") + ": hw.driver_nice = " +
                      c.GetString("hw.driver_nice") + " is outside 0-19 (a nice value)");
  }
  ParseFaultPlan(c.GetString("hw.fault_injection"), c.Where("hw.fault_injection"));
  return o;
}

std::vector<std::string> KnownSystemNames(const std::string& config_dir) {
  return IncludableNames(config_dir, "systems");
}

}  // namespace kvtier
