#include "hw/run_hw.h"

#include <sys/statfs.h>
#include <sys/utsname.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <sstream>
#include <thread>

#include "analysis/results_db.h"
#include "core/errors.h"
#include "core/pipeline.h"
#include "traces/score_source.h"
#include "traces/trace_io.h"

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

// Bytes of one stored chunk, as the Pipeline counts them (core/pipeline.cc ChunkBytes).
Bytes StoredChunkBytes(const ModelSpec& model, const SystemOptions& sys, const Segment& seg,
                       std::uint32_t chunk, KvKind kind) {
  const Bytes tokens = Bytes(seg.TokensInChunk(chunk, sys.chunk_tokens));
  if (kind == KvKind::kProbeKey) return tokens * Bytes(sys.itf_options.probe_heads) * model.RowBytes();
  return tokens * model.KBytesPerTokenLayer();
}

}  // namespace

HwExecutorOptions BuildHwExecutorOptions(const Config& config, const ExperimentOptions& opts,
                                         const std::string& store_dir) {
  HwExecutorOptions o;
  const std::string backend = config.GetString("hw.backend");
  o.backend = backend == "cuda" ? DeviceBackend::kCuda
              : backend == "host" ? DeviceBackend::kHost
                                  : DeviceBackend::kAuto;
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
  o.queue_depth = std::uint32_t(opts.hardware.ssd_queue_depth);
  o.chunk_tokens = opts.system.chunk_tokens;
  o.probe_heads = opts.system.itf_options.probe_heads;
  o.cpu_capacity = opts.system.cache.cpu_capacity;
  o.gpu_capacity = opts.system.cache.gpu_capacity;
  return o;
}

HwRunResult RunHardware(const Config& config, const std::string& trace_path,
                        const std::string& out_path, const HwProgressFn& progress) {
  const auto wall_start = std::chrono::steady_clock::now();
  const ExperimentOptions opts = BuildOptions(config);
  if (opts.hardware.gpu_concurrent_prefills != 1) {
    throw ConfigError(config.Where("gpu.concurrent_prefills") +
                      ": kvtier hw serves one prefill at a time; only 1 is supported");
  }

  // Open and check the trace before touching the output.
  const ReplaySetup replay = PrepareReplay(trace_path, config, opts);
  const TraceHeader& header = replay.header;
  const std::optional<ProceduralParams>& none_model = replay.none_model;

  // The executor first: an unusable store (no O_DIRECT) fails before the run row exists.
  const std::string default_store = out_path + ".store-" + opts.system.name;
  HwExecutorOptions xo = BuildHwExecutorOptions(config, opts, default_store);
  const bool remove_store = config.GetString("hw.store_dir").empty() && !config.GetBool("hw.keep_store");
  std::error_code ec;
  if (remove_store) std::filesystem::remove_all(xo.store_dir, ec);  // a stale store from a crash
  std::unique_ptr<HwExecutor> executor;
  if (Status s = HwExecutor::Create(opts.model, opts.hardware, xo, &executor); !s.ok()) {
    if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kInvalidArgument) {
      throw ConfigError("kvtier hw: " + s.message());
    }
    throw std::runtime_error("kvtier hw: cannot start the hardware executor: " + s.ToString());
  }

  ResultsDb db(out_path);
  const RunInfo info = MakeRunInfo("hw", config, opts, trace_path);
  const long long run_id = db.BeginRun(info);
  std::unique_ptr<RunLog> db_log = db.NewRunLog(run_id, config.GetBool("log.transfers"));
  RunLog& log = *db_log;


  TraceScoreSource scores(header, opts.model, none_model);
  PipelineOptions popts;
  popts.system = opts.system;
  popts.log_chunk_decisions = config.GetBool("log.chunk_decisions");
  popts.chunk_detail = true;  // hw moves real chunks
  Pipeline pipeline(opts.model, popts, executor.get(), &scores, &log);

  long long total = 0;
  try {
    total = std::stoll(header.Meta("requests", "0"));
  } catch (const std::logic_error&) {
  }
  if (opts.run.max_requests > 0 && (total == 0 || total > opts.run.max_requests)) {
    total = opts.run.max_requests;
  }
  const long long max = opts.run.max_requests;
  // The first run-time failure (prewarm writes, a request, background work): it stops the run.
  Status failure;
  if (opts.run.prewarm) {
    TraceReader warm(trace_path);
    TraceRecord rec;
    for (long long i = 0; warm.Next(&rec) && (max == 0 || i < max); ++i) pipeline.Prewarm(rec.request);
    // The SSD holds every chunk: store every prewarmed segment's chunks, and copy the content
    // of those the caches placed in the CPU / GPU tiers into their arena slots.
    const RadixTree& tree = pipeline.tree();
    for (std::uint32_t id = 1;; ++id) {
      const Segment* seg = tree.FindSegment(id);
      if (seg == nullptr) break;
      for (int l = 0; l < opts.model.layers && failure.ok(); ++l) {
        for (std::uint32_t c = 0; c < seg->num_chunks && failure.ok(); ++c) {
          for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kProbeKey}) {
            if (kind == KvKind::kProbeKey && !opts.system.itf) continue;
            const Bytes b = StoredChunkBytes(opts.model, opts.system, *seg, c, kind);
            failure = executor->Prepopulate(ChunkId::Make(id, kind, std::uint32_t(l), c), b, true)
                          .Annotate("prewarm: storing segment " + std::to_string(id));
            if (!failure.ok()) break;
          }
        }
      }
      if (!failure.ok()) break;
    }
  }
  executor->ResetClock();  // times are since the run started; setup and prewarm excluded

  HwRunResult result;
  result.run_id = run_id;
  TraceReader reader(trace_path);
  TraceRecord rec;
  long long done = 0;
  while (failure.ok() && (max == 0 || done < max) && reader.Next(&rec)) {
    if (rec.request.arrival_s > executor->Now()) executor->IdleUntil(rec.request.arrival_s);
    const RequestId id = rec.request.id;
    Request request = rec.request;
    scores.Add(std::move(rec));
    failure = pipeline.Run(request, done < opts.run.warmup_requests);
    scores.Release(id);
    ++done;
    if (progress) progress(done, total, executor->Now());
  }
  // Background work is finished (and checked) after a failure too, so every transfer is
  // logged as it ended and nothing is left running.
  if (Status st = pipeline.Finish(); failure.ok()) failure = st;
  executor->Drain();
  result.requests = done;
  result.measured_s = executor->Now();
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  // Environment and executor accounting.
  const HwExecutorStats xs = executor->stats();
  log.LogMetric("measured_s", result.measured_s);
  log.LogMetric("wall_s", result.wall_s);
  log.LogMetric("env.backend." + std::string(DeviceBackendName(executor->backend())), 1);
  log.LogMetric("env.compute." + std::string(ComputeModeName(xo.compute)), 1);
  log.LogMetric("env.io_backend." + executor->io_backend_name(), 1);
  log.LogMetric("env.direct_io", executor->direct_io() ? 1 : 0);
  log.LogMetric("env.allow_buffered", xo.allow_buffered ? 1 : 0);
  log.LogMetric("env.dio_mem_align", executor->dio_mem_align());
  log.LogMetric("env.dio_offset_align", executor->dio_offset_align());
  log.LogMetric("env.queue_depth", xo.queue_depth);
  log.LogMetric("env.slot_bytes", double(executor->slot_bytes()));
  log.LogMetric("env.max_memory", double(xo.max_memory));
  log.LogMetric("env.pace_pcie", xo.pace_pcie ? 1 : 0);
  log.LogMetric("env.cpus", double(std::thread::hardware_concurrency()));
  if (utsname u; uname(&u) == 0) log.LogMetric(std::string("env.kernel.") + u.release, 1);
  if (struct statfs fs; statfs(xo.store_dir.c_str(), &fs) == 0) {
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
  log.LogMetric("hw.compute_busy_s", xs.compute_busy_s);
  log.Close();  // writes the last batch; throws (run stays incomplete) if it cannot
  db_log.reset();
  if (failure.ok()) {
    db.EndRun(run_id, result.wall_s);
  } else {
    db.FailRun(run_id, result.wall_s, failure.ToString());
  }
  const std::string store_dir = xo.store_dir;
  executor.reset();
  if (remove_store) std::filesystem::remove_all(store_dir, ec);
  if (!failure.ok()) {
    throw RunFailed("system " + opts.system.name + ", run " + std::to_string(run_id) + ": " +
                    failure.ToString());
  }
  return result;
}

}  // namespace kvtier::hw
