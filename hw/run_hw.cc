#include "hw/run_hw.h"

#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/errors.h"
#include "core/pipeline.h"
#include "core/stored_layout.h"
#include "driver/experiment.h"
#include "hw/decode_home.h"
#include "hw/fault_injection.h"
#include "hw/store_dir.h"

namespace kvtier::hw {
namespace {

std::string FsName(long type) {
  switch (static_cast<unsigned long>(type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x65735546: return "fuse";
    default: {
      char b[32];
      std::snprintf(b, sizeof b, "0x%lx", type);
      return b;
    }
  }
}

}  // namespace

HwExecutorOptions BuildHwExecutorOptions(const Config& config, const ExperimentOptions& opts,
                                         const std::string& store_dir) {
  HwExecutorOptions o;
  const std::string backend = config.GetString("hw.backend");
  o.backend = backend == "cuda" ? BackendKind::kCuda
              : backend == "host" ? BackendKind::kHost
                                  : BackendKind::kAuto;
  o.compute = config.GetString("hw.compute") == "real" ? ComputeMode::kReal : ComputeMode::kModeled;
  const std::string io = config.GetString("hw.io_backend");
  o.io_backend = io == "io_uring" ? IoEngineOptions::Backend::kIoUring
                 : io == "pread"  ? IoEngineOptions::Backend::kPread
                                  : IoEngineOptions::Backend::kAuto;
  o.store_dir = config.GetString("hw.store_dir");
  if (o.store_dir.empty()) o.store_dir = store_dir;
  o.store_capacity = config.GetBytes("hw.store_capacity");
  o.allow_buffered = config.GetBool("hw.allow_buffered");
  o.store_sync = config.GetBool("hw.store_sync");
  o.max_memory = config.GetBytes("hw.max_memory");
  o.ring_bytes = config.GetBytes("hw.ring");
  o.pace_pcie = config.GetBool("hw.pace_pcie");
  o.verify = config.GetBool("hw.verify");
  FaultPlan faults =
      ParseFaultPlan(config.GetString("hw.fault_injection"), config.Where("hw.fault_injection"));
  if (!faults.empty()) o.faults = std::make_shared<FaultInjector>(std::move(faults));
  o.queue_depth = std::uint32_t(opts.hardware.ssd_queue_depth);
  o.chunk_tokens = opts.system.chunk_tokens;
  o.probe_heads = opts.system.itf_options.probe_heads;
  o.cpu_capacity = opts.system.cache.cpu_capacity;
  o.gpu_capacity = opts.system.cache.gpu_capacity;
  if (opts.system.decode.on()) {
    // The decode home holds one sequence (decode.max_batch = 1): up to the model's context, at
    // most a quarter of hw.max_memory (a longer sequence wraps: hw.decode_home_wraps).
    const Bytes per_token = DecodeHome::BytesFor(opts.model, 1);
    const std::int64_t fit = std::int64_t(o.max_memory / 4 / per_token);
    const std::int64_t context = opts.model.max_context > 0 ? opts.model.max_context : 32768;
    o.decode_home_tokens = std::max<std::int64_t>(1, std::min(context, fit));
  }
  return o;
}

namespace {

// Sets the calling thread's nice value to at least `nice` (Linux priorities are per thread)
// for its lifetime. The driving thread plans and submits a request's ops in bursts of a few
// milliseconds while the executor's lanes -- threads standing in for DMA engines and the GPU --
// wait to be woken for each op. At equal priority the kernel may queue a woken lane on the
// driver's CPU until the burst ends even with another CPU idle (a 2-vCPU VM, kernel 6.18:
// median wake-up 2.8 ms with the waker busy against 18 us with it asleep), which delays
// device work by the planner's CPU time, something hardware does not do. Best effort: a
// failure leaves the priority as it was; so does a thread already at `nice` or lower priority.
class ScopedThreadNice {
 public:
  explicit ScopedThreadNice(int nice) {
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, 0);
    if (errno != 0 || now >= nice) return;
    if (setpriority(PRIO_PROCESS, 0, nice) == 0) old_ = now;
  }
  ~ScopedThreadNice() {
    if (old_) setpriority(PRIO_PROCESS, 0, *old_);  // raising it back may need privileges
  }
  ScopedThreadNice(const ScopedThreadNice&) = delete;
  ScopedThreadNice& operator=(const ScopedThreadNice&) = delete;

 private:
  std::optional<int> old_;
};

// What the hardware does differently around the experiment driver (driver/experiment.h): the
// hardware executor and its chunk store (created before the run row, removed after the run
// unless kept, also when the run throws), the store filled with every prewarmed chunk, one request at a time with the
// executor sleeping until each arrival, and the environment in the metrics.
class HwBackend : public ExperimentBackend {
 public:
  // Creates the executor and its store; an unusable store (no O_DIRECT) is an error here,
  // before the run row exists. Throws ConfigError, std::runtime_error.
  HwBackend(const Config& config, const ExperimentOptions& opts, const std::string& out_path)
      : opts_(opts),
        xo_(BuildHwExecutorOptions(config, opts, out_path + ".store-" + opts.system.name)),
        // Checked (exit 2 if unusable); removed by its destructor, after the executor's.
        store_dir_(xo_.store_dir,
                   config.GetString("hw.store_dir").empty() && !config.GetBool("hw.keep_store"),
                   config.GetString("hw.store_dir").empty()
                       ? "hw.store_dir (default " + xo_.store_dir + ")"
                       : config.Where("hw.store_dir")) {
    driver_nice_ = int(config.GetInt("hw.driver_nice"));  // 0-19, checked by BuildOptions
    if (Status s = HwExecutor::Create(opts.model, opts.hardware, xo_, &executor_); !s.ok()) {
      if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kInvalidArgument) {
        throw ConfigError("kvtier hw: " + s.message());
      }
      // The store's data file is preallocated at open: a capacity the file system cannot hold
      // (hw.store_capacity = 1e15B) is bad input, found before any run, not an internal error.
      if (s.code() == Status::Code::kOutOfSpace) {
        throw ConfigError(config.Where("hw.store_capacity") + ": " + s.message());
      }
      throw std::runtime_error("kvtier hw: cannot start the hardware executor: " + s.ToString());
    }
    if (xo_.faults) {
      std::fprintf(stderr, "kvtier hw: fault injection on (hw.fault_injection = %s)\n",
                   xo_.faults->plan().spec.c_str());
    }
    // A reopened store (hw.store_dir) never serves bytes that fail their checksum: say which
    // chunks it dropped (prewarm stores them again).
    const std::vector<Status>& dropped = executor_->store_dropped_on_open();
    if (!dropped.empty()) {
      std::fprintf(stderr,
                   "kvtier hw: the chunk store in %s dropped %zu chunk(s) whose bytes did not "
                   "read back intact, e.g. %s\n",
                   xo_.store_dir.c_str(), dropped.size(), dropped.front().ToString().c_str());
    }
  }
  ~HwBackend() override { executor_.reset(); }  // before store_dir_ removes its directory

  const char* mode() const override { return "hw"; }
  const char* end_time_metric() const override { return "measured_s"; }
  Executor& executor() override { return *executor_; }

  void ConfigurePipeline(PipelineOptions* options) override {
    options->chunk_detail = true;  // hw moves real chunks
  }

  Status BeforeServing(const Pipeline& pipeline, bool prewarmed) override {
    Status failure;
    // The SSD holds every chunk: store every prewarmed segment's chunks, and copy the content
    // of those the caches placed in the CPU / GPU tiers into their arena slots.
    const RadixTree& tree = pipeline.tree();
    const StoredLayout layout = StoredLayout::Of(opts_.model, opts_.system);
    for (std::uint32_t id = 1; prewarmed && failure.ok(); ++id) {
      const Segment* seg = tree.FindSegment(id);
      if (seg == nullptr) break;
      for (int l = 0; l < opts_.model.layers && failure.ok(); ++l) {
        for (std::uint32_t c = 0; c < seg->num_chunks && failure.ok(); ++c) {
          for (KvKind kind : layout.kinds()) {
            const Bytes b = layout.ChunkBytes(*seg, c, kind);
            failure = executor_->Prepopulate(ChunkId::Make(id, kind, std::uint32_t(l), c), b, true)
                          .Annotate("prewarm: storing segment " + std::to_string(id));
            if (!failure.ok()) break;
          }
        }
      }
    }
    // Times are since the run started; setup and prewarm excluded. (cuda: a failure to
    // re-anchor the device's events is a run-time failure like a failed prewarm write.)
    if (Status st = executor_->ResetClock(); failure.ok()) {
      failure = st.Annotate("restarting the executor's clock");
    }
    return failure;
  }

  // One request at a time; the executor sleeps until each arrival. A system that decodes
  // serves through ServeWithDecode (core/pipeline.h), the simulator's loop: with
  // decode.max_batch = 1 each request's decode steps run before the next request's prefill.
  ServeOutcome Serve(Pipeline& pipeline, const NextFn& next, const DoneFn& done) override {
    const ScopedThreadNice lower(driver_nice_);
    ServeOutcome out;
    ReplayItem item;
    if (pipeline.decodes()) {
      long long served = 0;
      out.finish = ServeWithDecode(
          pipeline, *executor_,
          [&](bool* warmup) -> const Request* {
            if (!next(&item)) return nullptr;
            *warmup = item.warmup;
            return &item.request;
          },
          [&](const Request&, bool, const Status& st) { done(item, st); }, &served);
      out.requests = served;
      executor_->Drain();
      out.end_s = executor_->Now();
      return out;
    }
    while (next(&item)) {
      if (item.request.arrival_s > executor_->Now()) executor_->IdleUntil(item.request.arrival_s);
      const Status st = pipeline.Run(item.request, item.warmup);
      ++out.requests;
      done(item, st);
    }
    // Background work is finished (and checked) after a failure too, so every transfer is
    // logged as it ended and nothing is left running.
    out.finish = pipeline.Finish();
    executor_->Drain();
    out.end_s = executor_->Now();
    return out;
  }

  // Environment and executor accounting.
  void LogMetrics(RunLog& log) override {
    const HwExecutorStats xs = executor_->stats();
    log.LogMetric("env.backend." + std::string(DeviceBackendName(executor_->backend())), 1);
    log.LogMetric("env.compute." + std::string(ComputeModeName(xo_.compute)), 1);
    log.LogMetric("env.io_backend." + executor_->io_backend_name(), 1);
    log.LogMetric("env.direct_io", executor_->direct_io() ? 1 : 0);
    log.LogMetric("env.allow_buffered", xo_.allow_buffered ? 1 : 0);
    log.LogMetric("env.dio_mem_align", executor_->dio_mem_align());
    log.LogMetric("env.dio_offset_align", executor_->dio_offset_align());
    log.LogMetric("env.queue_depth", xo_.queue_depth);
    log.LogMetric("env.slot_bytes", double(executor_->slot_bytes()));
    log.LogMetric("env.max_memory", double(xo_.max_memory));
    log.LogMetric("env.pace_pcie", xo_.pace_pcie ? 1 : 0);
    log.LogMetric("env.driver_nice", driver_nice_);
    log.LogMetric("env.cpus", double(std::thread::hardware_concurrency()));
    if (utsname u; uname(&u) == 0) log.LogMetric(std::string("env.kernel.") + u.release, 1);
    if (struct statfs fs; statfs(xo_.store_dir.c_str(), &fs) == 0) {
      log.LogMetric("env.fs." + FsName(long(fs.f_type)), 1);
    }
    log.LogMetric("hw.chunks_read", double(xs.chunks_read));
    log.LogMetric("hw.chunks_written", double(xs.chunks_written));
    log.LogMetric("hw.bytes_read", double(xs.bytes_read));
    log.LogMetric("hw.bytes_written", double(xs.bytes_written));
    log.LogMetric("hw.bytes_h2d", double(xs.bytes_h2d));
    log.LogMetric("hw.bytes_d2h", double(xs.bytes_d2h));
    log.LogMetric("hw.bytes_gathered", double(xs.bytes_gathered));
    log.LogMetric("hw.cpu_overflow_chunks", double(xs.cpu_overflow));
    log.LogMetric("hw.gpu_overflow_chunks", double(xs.gpu_overflow));
    log.LogMetric("hw.raw_waits", double(xs.raw_waits));
    log.LogMetric("hw.staging_reused", double(xs.staging_reused));
    log.LogMetric("hw.ssd_reads", double(xs.ssd_reads));
    log.LogMetric("hw.extents_read", double(xs.extents_read));
    log.LogMetric("hw.extents_verified", double(xs.extents_verified));
    log.LogMetric("hw.staged_misses", double(xs.staged_misses));
    log.LogMetric("hw.source_standins", double(xs.source_standins));
    log.LogMetric("hw.compute_busy_s", xs.compute_busy_s);
    log.LogMetric("hw.driver_awake_s", xs.driver_awake_s);
    log.LogMetric("hw.driver_ops", double(xs.driver_ops));
    log.LogMetric("hw.driver_blocked_waits", double(xs.driver_blocked_waits));
    log.LogMetric("hw.driver_wake_s", xs.driver_wake_s);
    if (opts_.system.decode.on()) {
      log.LogMetric("hw.decode_home_tokens", double(xo_.decode_home_tokens));
      log.LogMetric("hw.decode_home_wraps", double(xs.decode_home_wraps));
    }
    log.LogMetric("hw.chunks_verified", double(xs.chunks_verified));
    log.LogMetric("hw.crc_checked", double(xs.crc_checked));
    log.LogMetric("hw.store_dropped_chunks", double(executor_->store_dropped_on_open().size()));
    if (xo_.faults) {
      // Events per class (what a plan's N counts: a plan that never fires measures them) and
      // what was injected, one row per kind the plan names (docs/reliability.md).
      for (int c = 0; c < kNumFaultClasses; ++c) {
        const auto cls = static_cast<FaultClass>(c);
        log.LogMetric("fault.events." + std::string(FaultClassName(cls)),
                      double(xo_.faults->events(cls)));
      }
      for (const FaultKindInfo& k : FaultKinds()) {
        const auto& rules = xo_.faults->plan().rules;
        if (std::none_of(rules.begin(), rules.end(),
                         [&](const FaultRule& r) { return r.kind == k.kind; })) {
          continue;
        }
        log.LogMetric("fault." + std::string(k.name) + ".injected",
                      double(xo_.faults->injected(k.kind)));
      }
    }
  }

 private:
  const ExperimentOptions& opts_;
  const HwExecutorOptions xo_;
  const RunStoreDir store_dir_;
  std::unique_ptr<HwExecutor> executor_;
  int driver_nice_ = 0;
};

}  // namespace

HwRunResult RunHardware(const Config& config, const std::string& trace_path,
                        const std::string& out_path, const HwProgressFn& progress) {
  Experiment experiment(config, trace_path, out_path);
  const ExperimentOptions& opts = experiment.options();
  if (opts.hardware.gpu_concurrent_prefills != 1) {
    throw ConfigError(config.Where("gpu.concurrent_prefills") +
                      ": kvtier hw serves one prefill at a time; only 1 is supported");
  }
  if (opts.hardware.ssd_write_lanes != 1) {
    // The hw executor writes the SSD from one write lane; the simulator models it with 1 (the
    // default). Refused rather than ignored, as `kvtier validate` compares the two.
    throw ConfigError(config.Where("ssd.write_lanes") +
                      ": kvtier hw writes the SSD from one write lane; only 1 is supported (got " +
                      std::to_string(opts.hardware.ssd_write_lanes) + ")");
  }
  if (opts.system.decode.on() && opts.system.decode.max_batch != 1) {
    // hw decodes one request at a time (issue 17: batching beyond that is simulated). Refused
    // rather than clamped: `kvtier validate` runs the same configuration through sim and hw, and
    // a clamp would compare a batch of 1 with the simulator's larger one.
    throw ConfigError(config.Where("decode.max_batch") + ": kvtier hw decodes one request at a " +
                      "time; decode.policy = " + config.GetString("decode.policy") +
                      " needs decode.max_batch = 1 (got " +
                      std::to_string(opts.system.decode.max_batch) +
                      "; larger batches are simulated: kvtier sim)");
  }
  experiment.CheckTrace();  // before the store is created
  for (const std::string& stale : RemoveStaleStores(out_path)) {
    std::fprintf(stderr, "kvtier hw: removed %s, the chunk store of a killed run\n", stale.c_str());
  }
  HwBackend backend(config, opts, out_path);
  const ExperimentResult r = experiment.Run(backend, progress);
  HwRunResult result;
  result.run_id = r.run_id;
  result.requests = r.requests;
  result.measured_s = r.end_s;
  result.wall_s = r.wall_s;
  return result;
}

}  // namespace kvtier::hw
