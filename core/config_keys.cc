// The one table of configuration keys: name, type, default, choices, meaning with unit.
// Adding a key is one line here; loaders reject any key not listed. A policy key's choices are
// its registration table's names (never a second list here). `kvtier config --keys`
// prints this table, and docs/configuration.md describes the sections.

#include "core/cache_policy.h"
#include "core/config.h"
#include "core/decode_engine.h"
#include "core/schedule.h"
#include "core/selector.h"
#include "core/transfer_strategy.h"

namespace kvtier {
namespace {

using K = KeyType;

constexpr KeySpec kKeys[] = {
    // [include] (experiment files only): names under configs/<kind>/ or paths to .ini files.
    {"include.model", K::kString, nullptr, nullptr, "model descriptor to include"},
    {"include.hardware", K::kString, nullptr, nullptr, "hardware profile to include"},
    {"include.system", K::kString, nullptr, nullptr, "system (policy set) to include"},

    // [experiment]
    {"experiment.name", K::kString, "unnamed", nullptr, "name stored with every run"},
    {"experiment.description", K::kString, "", nullptr, "free text"},
    {"experiment.systems", K::kString, "", nullptr,
     "systems `kvtier sim` compares, comma-separated (default: include.system)"},

    // [model] — configs/models/*.ini
    {"model.name", K::kString, nullptr, nullptr, "model name, e.g. opt-13b"},
    {"model.family", K::kEnum, "llama", "opt|llama", "architecture family (FFN shape, GQA)"},
    {"model.layers", K::kInt, nullptr, nullptr, "transformer layers"},
    {"model.hidden", K::kInt, nullptr, nullptr, "hidden size d"},
    {"model.heads", K::kInt, nullptr, nullptr, "query heads"},
    {"model.kv_heads", K::kInt, nullptr, nullptr, "key/value heads (= heads without GQA)"},
    {"model.head_dim", K::kInt, nullptr, nullptr, "dimension of one head"},
    {"model.ffn", K::kInt, nullptr, nullptr, "FFN inner dimension"},
    {"model.vocab", K::kInt, nullptr, nullptr, "vocabulary size"},
    {"model.dtype_bytes", K::kInt, "2", nullptr, "bytes per KV/weight element (fp16 = 2)"},
    {"model.max_context", K::kInt, nullptr, nullptr, "longest sequence in tokens"},
    {"model.gguf", K::kPath, "", nullptr, "GGUF file of a real model (hw, trace record, eval)"},

    // [hardware] and its components — configs/hardware/*.ini
    {"hardware.name", K::kString, "unnamed", nullptr, "hardware profile name"},
    {"hardware.source", K::kString, "", nullptr, "where the numbers come from (datasheet, calibrate)"},
    {"ssd.read_bw", K::kBandwidth, "5GB/s", nullptr, "sequential read bandwidth, bytes/s"},
    {"ssd.write_bw", K::kBandwidth, "2GB/s", nullptr, "write bandwidth, bytes/s"},
    {"ssd.latency", K::kDuration, "80us", nullptr, "per-I/O latency at queue depth 1"},
    {"ssd.queue_depth", K::kInt, "32", nullptr, "I/Os the pipeline keeps in flight"},
    {"ssd.capacity", K::kBytes, "2TB", nullptr,
     "SSD capacity for prefix KV; not a bound (the SSD keeps every chunk: no SSD eviction is "
     "modelled): a run that stores more warns once and records the metric ssd.stored_bytes"},
    {"ssd.background_share", K::kDouble, "0.25", nullptr,
     "share of SSD bandwidth background writes and repacks may use, in (0, 1] (sim: a cap; hw: "
     "their writes paced to it)"},
    {"ssd.write_lanes", K::kInt, "1", nullptr,
     "SSD writes (stores, repacks) that run at once, the rest waiting in FIFO order, as hw "
     "mode's one write lane runs them (hw accepts only 1); 0 = no limit: all share the device "
     "max-min fairly (sim)"},
    {"cpu.memcpy_bw", K::kBandwidth, "10GB/s", nullptr, "host memcpy bandwidth, bytes/s"},
    {"cpu.gather_bw", K::kBandwidth, "8GB/s", nullptr, "bandwidth of gathering rows out of chunks"},
    {"cpu.shared_copy_bw", K::kBandwidth, "0", nullptr,
     "bytes/s that concurrent copies through host memory share (CPU gathers, H2D/D2H; the host "
     "backend's copies are memcpys); 0 = no shared limit (a GPU server's DRAM is several times "
     "its PCIe link); kvtier calibrate measures two concurrent copy threads on the host backend"},
    {"cpu.op_overhead", K::kDuration, "0us", nullptr,
     "fixed cost of issuing one transfer op (thread hand-off, submission); kvtier calibrate"},
    {"cpu.driver_op_cost", K::kDuration, "0us", nullptr,
     "the driving thread's time per op it submits (planning and submission); the simulator "
     "delays each op by it on the driver's clock; 0 = planning takes no time; kvtier "
     "calibrate --config X --driver measures it"},
    {"cpu.driver_wake", K::kDuration, "0us", nullptr,
     "time from an awaited op's end until the driving thread runs again, per wait that "
     "blocked; 0 = at once; kvtier calibrate --config X --driver measures it"},
    {"cpu.driver_op_costs", K::kString, "", nullptr,
     "cpu.driver_op_cost per system, 'system=duration' entries separated by commas; a listed "
     "system's own replaces the pooled value (the work behind an op differs by system); "
     "kvtier calibrate --driver writes one per system it timed"},
    {"cpu.driver_wakes", K::kString, "", nullptr,
     "cpu.driver_wake per system, as cpu.driver_op_costs"},
    {"pcie.h2d_bw", K::kBandwidth, "25GB/s", nullptr, "pinned host-to-device bandwidth"},
    {"pcie.d2h_bw", K::kBandwidth, "25GB/s", nullptr, "device-to-host bandwidth"},
    {"pcie.latency", K::kDuration, "2.3us", nullptr,
     "cost of one DMA call (a cudaMemcpyAsync); per_row pays it per run of rows "
     "(FlexKV issue 193: ~2.3 us per cudaMemcpyAsync on H20)"},
    // Transfer-strategy costs: cited public measurements (docs/transfer-strategies.md) until
    // kvtier calibrate measures them.
    {"pcie.batch_latency", K::kDuration, "2.3us", nullptr,
     "cost of one batched-copy call (cudaMemcpyBatchAsync); ~one cudaMemcpyAsync issue "
     "(FlexKV issue 193: 2.3 us on H20)"},
    {"pcie.descriptor_cost", K::kDuration, "0.5us", nullptr,
     "cost per descriptor inside a batched call (vLLM PR 48434: cuMemcpyBatchAsync ~0.5 us "
     "of CPU per descriptor, 6.33 ms for 12,288 on H100 PCIe Gen5)"},
    {"cpu.gather_run_cost", K::kDuration, "100ns", nullptr,
     "CPU gather: cost per contiguous run of rows (one memcpy) beyond bytes / cpu.gather_bw "
     "(61-141 ns measured on the build machine, docs/transfer-strategies.md)"},
    {"gpu.gather_bw", K::kBandwidth, "25GB/s", nullptr,
     "rate a device-gather kernel reads mapped pinned host memory (the op runs at the lower "
     "of this and pcie.h2d_bw; a kernel is bounded by the link: A100 25.1 GB/s, nvbandwidth "
     "issue 42)"},
    {"gpu.gather_sm_share", K::kDouble, "0.06", nullptr,
     "share by which compute overlapping a device gather is slowed, in [0, 1) (vLLM blog "
     "2026-01-08: -6% throughput with the kernel path)"},
    {"gpu.name", K::kString, "", nullptr, "GPU model"},
    {"gpu.memory", K::kBytes, "80GiB", nullptr, "GPU memory"},
    {"gpu.flops", K::kRate, "312TFLOP/s", nullptr, "peak dense fp16 FLOP/s"},
    {"gpu.efficiency", K::kDouble, "0.6", nullptr, "fraction of peak FLOP/s GEMMs reach"},
    {"gpu.mem_bw", K::kBandwidth, "2TB/s", nullptr, "HBM bandwidth"},
    {"gpu.kernel_overhead", K::kDuration, "20us", nullptr, "fixed cost per layer step"},
    {"gpu.concurrent_prefills", K::kInt, "1", nullptr, "prefills served at once (sim; at most 32): requests taken in arrival order, their compute sharing the GPU's throughput, their I/O overlapping each other's compute; kvtier hw supports 1"},
    {"gpu.layer_table", K::kPath, "", nullptr, "measured per-layer-step times (CSV) that correct the roofline; relative to the file setting it"},

    // [system] — configs/systems/*.ini: a schedule, a selector, cache policy and knobs. The
    // policy keys' choices come from their registration tables (core/registry.h).
    {"system.name", K::kString, "custom", nullptr, "system name stored with every run"},
    {"schedule.policy", K::kEnum, "layerwise", nullptr,
     "order of a request's loads and computes (core/schedule.h)", &ScheduleChoices},
    {"select.policy", K::kEnum, "all", nullptr,
     "what one layer keeps of the reused prefix (core/selector.h)", &SelectorChoices},
    {"select.retention", K::kDouble, "0.25", nullptr, "fraction of reused tokens kept per layer"},
    {"itf.fallback", K::kEnum, "h2o", nullptr,
     "selector of an ITF layer whose probe heads disagree", &ItfFallbackChoices},
    {"itf.probe_heads", K::kInt, "3", nullptr, "probe KV heads (the first ones of each layer)"},
    {"itf.alpha", K::kDouble, "0.6", nullptr, "threshold exponent: t = j^alpha"},
    {"prefetch.mode", K::kEnum, "none", nullptr,
     "layerwise: whether the next layer's predicted loads overlap this layer",
     &PrefetchModeChoices},
    {"cake.chunk_tokens", K::kInt, "512", nullptr, "Cake's compute/load chunk, tokens"},
    {"reorder.enabled", K::kBool, "false", nullptr, "repack nodes by importance (SPEC IV-D1)"},
    {"reorder.interval", K::kDuration, "600s", nullptr, "time between repacking passes"},
    {"reorder.min_accesses", K::kInt, "2", nullptr,
     "reuses of a segment since its last repack before it may be repacked"},
    {"reorder.history_weight", K::kDouble, "0.8", nullptr, "weight of history in mean importance"},
    {"reorder.min_gain", K::kDouble, "0", nullptr,
     "also require this measured saving share (1 - packed/stored chunks the reuses' layers "
     "touched, as trace stats' history packing) before a repack; 0: the break-even rule alone "
     "decides (core/reorderer.h)"},
    {"reorder.from_memory", K::kBool, "false", nullptr,
     "repack only a segment the GPU and CPU caches hold whole, so that a repack reads nothing "
     "from the SSD (only rewrites the segment); false: also one that must be read, when the "
     "break-even rule says the reads pay (core/pipeline.cc, MaybeReorder)"},
    {"cache.policy", K::kEnum, "lru", nullptr, "GPU/CPU cache ranking (core/cache_policy.h)",
     &CachePolicyChoices},
    {"transfer.strategy", K::kEnum, "staged_gather", nullptr,
     "how selected rows move to the GPU (core/transfer_strategy.h)", &TransferStrategyChoices},
    {"transfer.ssd_read_unit", K::kEnum, "chunk", nullptr,
     "what an SSD read fetches of a partly needed chunk (core/transfer_strategy.h)",
     &SsdReadUnitChoices},
    {"cache.gpu_capacity", K::kBytes, "10GiB", nullptr, "GPU prefix-KV cache"},
    {"cache.cpu_capacity", K::kBytes, "32GiB", nullptr, "CPU prefix-KV cache"},
    {"cache.chunk_tokens", K::kInt, "64", nullptr, "tokens per chunk (unit of I/O and caching)"},
    {"cache.history_weight", K::kDouble, "0.8", nullptr, "weight of history in the important-ratio EMA"},
    {"cache.store_new", K::kBool, "true", nullptr, "write the new prefix KV (NR) to SSD"},
    {"decode.policy", K::kEnum, "none", nullptr,
     "what follows the first token: a continuous decode batch of output_tokens per request "
     "(core/decode_engine.h); none ends requests at their first token", &DecodePolicyChoices},
    {"decode.bits", K::kInt, "2", nullptr, "KIVI code width of the GPU's low-bit KV, 1 or 2"},
    {"decode.group", K::kInt, "64", nullptr, "KIVI group size g (elements per scale and zero-point)"},
    {"decode.residual", K::kInt, "64", nullptr,
     "last tokens kept in 16 bits on the GPU (KIVI 128, SpeCache 64: paper 4.1)"},
    {"decode.topk", K::kInt, "64", nullptr, "16-bit KV pairs fetched per layer and KV head (specache)"},
    {"decode.max_batch", K::kInt, "256", nullptr, "most sequences in the decode batch"},
    {"decode.max_output_tokens", K::kInt, "0", nullptr,
     "cap on a request's output tokens (0: the trace's output_tokens)"},
    {"decode.gpu_reserve", K::kBytes, "0", nullptr,
     "GPU memory not given to the decode batch besides the weights and the GPU prefix cache "
     "(activations, framework workspace)"},

    // [run]
    {"run.warmup_requests", K::kInt, "0", nullptr, "first requests excluded from statistics"},
    {"run.prewarm", K::kBool, "false", nullptr, "fill the caches before measuring (as the paper)"},
    {"run.max_requests", K::kInt, "0", nullptr, "stop after this many requests (0 = all)"},
    {"run.seed", K::kInt, "1", nullptr, "seed for anything random in the run"},

    // [workload]
    {"workload.trace", K::kPath, "", nullptr, "trace file to replay"},
    {"workload.importance", K::kString, "", nullptr,
     "importance model for traces without scores: 'key=value ...' (traces/FORMAT.md)"},
    {"workload.h2o_selection", K::kEnum, "exact", "exact|sampled",
     "H2O's per-head top-k of model-generated importance: exact (every head scored) or sampled "
     "(each token's head count drawn from the importance model's statistics; changes results, "
     "docs/configuration.md)"},
    {"workload.retarget", K::kBool, "false", nullptr,
     "replay a trace recorded for another model (layers mapped proportionally, heads cyclically)"},

    // [hw] — `kvtier hw` (hw/hw_executor.h, docs/hw-mode.md)
    {"hw.backend", K::kEnum, "auto", "auto|cuda|host", "device backend (auto: cuda if a GPU is present)"},
    {"hw.compute", K::kEnum, "modeled", "modeled|real", "host compute: cost-model sleep or real Eigen GEMMs"},
    {"hw.io_backend", K::kEnum, "auto", "auto|io_uring|pread", "SSD read engine (auto: io_uring, else pread)"},
    {"hw.store_dir", K::kPath, "", nullptr, "chunk store directory on a real disk (default: <out>.store)"},
    {"hw.store_capacity", K::kBytes, "8GiB", nullptr, "chunk store data file size"},
    {"hw.allow_buffered", K::kBool, "false", nullptr, "accept a file system without O_DIRECT (recorded)"},
    {"hw.store_sync", K::kBool, "false", nullptr, "fdatasync each chunk put (power-loss safety)"},
    {"hw.keep_store", K::kBool, "false", nullptr, "keep the chunk store directory after the run"},
    {"hw.max_memory", K::kBytes, "1GiB", nullptr, "cap on all host/device arenas (caches beyond it overflow)"},
    {"hw.ring", K::kBytes, "64MiB", nullptr, "size of each staging, gather and device working ring; at least ssd.queue_depth + 1 chunk pieces (the reads in flight)"},
    {"hw.pace_pcie", K::kBool, "true", nullptr, "host backend: pace copies to pcie.h2d_bw/d2h_bw"},
    {"hw.verify", K::kBool, "false", nullptr, "check every byte of every chunk read"},
    {"hw.driver_nice", K::kInt, "0", nullptr,
     "nice value (0-19) of the thread that plans and submits while it serves requests: the "
     "executor's lanes stand in for device engines and keep the process's priority "
     "(docs/hw-mode.md)"},
    {"hw.fault_injection", K::kString, "", nullptr,
     "testing: faults to inject, e.g. read_eio@3,slow_read@*=5ms (docs/reliability.md)"},

    // [log] — what runs write to the results database
    {"log.transfers", K::kBool, "true", nullptr, "write one row per transfer"},
    {"log.chunk_decisions", K::kBool, "false", nullptr,
     "write every cache move and prefetched chunk as a decision row (large)"},
    {"log.progress", K::kDuration, "2s", nullptr, "wall time between progress lines on stderr"},
};

// Keys (and values) that were replaced; setting one is an error that names the replacement.
constexpr RemovedKey kRemoved[] = {
    {"reuse.enabled", nullptr, "schedule.policy = recompute (for reuse.enabled = false)"},
    {"itf.enabled", nullptr, "select.policy = itf (itf.fallback = h2o keeps the H2O fallback)"},
    {"prefetch.cake_chunk_tokens", nullptr, "cake.chunk_tokens"},
    {"prefetch.mode", "cake", "schedule.policy = cake"},
};

}  // namespace

std::span<const KeySpec> AllKeys() { return kKeys; }
std::span<const RemovedKey> RemovedKeys() { return kRemoved; }

}  // namespace kvtier
