#pragma once
// Typed options built from a resolved Config, validated before anything runs (CUTLASS's
// can_implement idea). Every field has its unit in the name or type. `BuildOptions` throws
// ConfigError naming the file, line and key of the offending value.

#include <string>

#include "core/config.h"
#include "core/decode_engine.h"
#include "core/itf.h"
#include "core/model_spec.h"
#include "core/schedule.h"
#include "core/tiered_cache.h"
#include "core/transfer_strategy.h"

namespace kvtier {

struct HardwareOptions {
  std::string name;
  double ssd_read_bw = 5e9;        // bytes/s
  double ssd_write_bw = 2e9;
  Seconds ssd_latency = 80e-6;     // per I/O at queue depth 1
  int ssd_queue_depth = 32;
  double ssd_background_share = 0.25;  // share of the SSD background writes/repacks may use
  // SSD writes (stores, repacks' writes) that run at once; the others wait in FIFO order. 1: as
  // hw mode runs them, one at a time on its write lane (the only value hw accepts). 0: no
  // limit, every write shares the device at once (the simulator's path before session 7).
  int ssd_write_lanes = 1;
  // Not a bound: the SSD keeps every chunk (no SSD eviction is modelled, in sim or hw). A run
  // that stores more prefix KV than this says so once and records ssd.stored_bytes
  // (driver/experiment.cc), so a result is not read as one of a smaller drive.
  Bytes ssd_capacity = Bytes(2e12);
  double cpu_memcpy_bw = 10e9;
  double cpu_gather_bw = 8e9;
  // Bytes/s that concurrent copies through host memory share: CPU gathers and H2D/D2H copies
  // (the host backend's are memcpys). 0: no shared limit -- a GPU server's DRAM bandwidth is
  // several times its PCIe link, so its copies do not meet there. kvtier calibrate measures it
  // on the host backend (two concurrent copy threads), where one thread nearly saturates it.
  double cpu_shared_copy_bw = 0;
  Seconds cpu_op_overhead = 0;     // per transfer op, before it starts (not per I/O)
  // The driving thread's own time (the simulator's driver clock; hw spends it for real):
  // per op submitted (its planning and submission: the Pipeline's work between two
  // submissions), and per wait that blocked (the wake-up from an op's end to the driver
  // running again). 0: the driver plans in no time (every shipped profile).
  Seconds cpu_driver_op_cost = 0;
  Seconds cpu_driver_wake = 0;
  double pcie_h2d_bw = 25e9;
  double pcie_d2h_bw = 25e9;
  Seconds pcie_latency = 2.3e-6;   // per DMA call (one cudaMemcpyAsync; FlexKV issue 193)
  // Transfer-strategy costs (core/transfer_strategy.h); defaults are cited public measurements
  // (docs/transfer-strategies.md) until `kvtier calibrate` measures them.
  Seconds pcie_batch_latency = 2.3e-6;    // per batched-copy call (cudaMemcpyBatchAsync)
  Seconds pcie_descriptor_cost = 0.5e-6;  // per descriptor in a batched call (vLLM PR 48434)
  Seconds cpu_gather_run_cost = 100e-9;   // per contiguous run memcpy'd by a CPU gather
  double gpu_gather_bw = 25e9;            // bytes/s a gather kernel reads mapped host memory at
  double gpu_gather_sm_share = 0.06;      // slowdown of compute overlapping a device gather
  double gpu_flops = 312e12;       // peak
  double gpu_efficiency = 0.6;
  double gpu_mem_bw = 2e12;
  Seconds gpu_kernel_overhead = 20e-6;
  int gpu_concurrent_prefills = 1;
  Bytes gpu_memory = Bytes(80) << 30;  // gpu.memory: what a decode batch is budgeted from
  std::string gpu_layer_table;     // path (relative ones resolved against the file that set
                                   // the key), empty = roofline; models/layer_table.h
};

// The policies of one system (configs/systems/*.ini). Policies are named as in their
// registration tables (core/schedule.h, core/selector.h, core/cache_policy.h); the Pipeline
// makes them by name, and an unknown name is a ConfigError.
struct SystemOptions {
  std::string name = "custom";
  std::string schedule = "layerwise";  // schedule.policy; "recompute": no reuse
  std::string select = "all";          // select.policy
  double retention = 0.25;             // fraction of R kept per layer, in (0, 1]
  std::string itf_fallback = "h2o";    // itf.fallback: the selector an ITF layer falls back to
  ItfOptions itf_options;              // probe heads, alpha, retention (copied from above)
  PrefetchMode prefetch = PrefetchMode::kNone;  // prefetch.mode (layerwise)
  int cake_chunk_tokens = 512;         // cake.chunk_tokens
  bool reorder = false;
  Seconds reorder_interval = 600;
  int reorder_min_accesses = 2;
  double reorder_history_weight = 0.8;
  double reorder_min_gain = 0;       // measured saving share a repack must also reach
  bool reorder_from_memory = false;  // repack only segments the caches hold whole
  std::string cache_policy = "lru";
  TransferStrategy transfer_strategy = TransferStrategy::kStagedGather;  // transfer.strategy
  SsdReadUnit ssd_read_unit = SsdReadUnit::kChunk;                 // transfer.ssd_read_unit
  TieredCacheOptions cache;          // capacities, history weight
  int chunk_tokens = 64;
  bool store_new = true;
  DecodeBatchOptions decode;              // decode.*; decode.gpu_memory is gpu.memory
};

struct RunOptions {
  int warmup_requests = 0;
  bool prewarm = false;
  long long max_requests = 0;
  long long seed = 1;
};

struct ExperimentOptions {
  std::string experiment_name;
  ModelSpec model;
  HardwareOptions hardware;
  SystemOptions system;
  RunOptions run;
  std::string trace;       // workload.trace
  std::string importance;  // workload.importance
  bool h2o_sampled = false;  // workload.h2o_selection = sampled
};

// Builds and validates; the one place every key's range is checked, so `kvtier config --check`
// rejects what a run would. Checks include: model dimensions positive and consistent
// (heads * head_dim == hidden for OPT; heads % kv_heads == 0), retention in (0, 1],
// probe heads in [1, kv_heads], caches at least one chunk, chunk_tokens in [1, 65535],
// bandwidths > 0, queue depth >= 1, gpu.concurrent_prefills in [1, 32], run.max_requests and
// run.warmup_requests >= 0, hw.max_memory, hw.ring and hw.store_capacity > 0, hw.fault_injection
// a valid plan (core/fault_plan.h), and a schedule that loads before the query (cake) with a
// selector that does not need it. An error about two related keys names where each was set
// (Config::Where(key, related)).
ExperimentOptions BuildOptions(const Config& config);
ModelSpec BuildModelSpec(const Config& config);
HardwareOptions BuildHardwareOptions(const Config& config);
SystemOptions BuildSystemOptions(const Config& config, const ModelSpec& model);

// The shipped systems, by name, for listings and error messages: the stems of the .ini files
// in `config_dir`/systems/ (FindConfigDir), sorted.
std::vector<std::string> KnownSystemNames(const std::string& config_dir);

}  // namespace kvtier
