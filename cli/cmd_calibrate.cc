// kvtier calibrate: measure this machine with the hw path's own engine and write a hardware
// profile the simulator reads (hw/calibrate.h).
//
//   kvtier calibrate --out configs/hardware/NAME.ini [--name NAME] [--dir SCRATCH]
//                    [--config X.ini [--layer-table]] [--block BYTES] [--queue-depth N] [--quick]
//
// With --config, the SSD block is the experiment's K/V chunk (model x cache.chunk_tokens), the
// gather row one token's K of one layer, and the queue depth ssd.queue_depth. With
// --layer-table as well, the host backend's real compute is timed per layer step for the
// experiment's model (hw/calibrate.h MeasureLayerTable) into NAME.layers.csv beside the
// profile, and the profile's [gpu] layer_table names it. With --driver as well, the driving
// thread is timed on the Pipeline's own code (MeasureDriver below) for cpu.driver_op_cost and
// cpu.driver_wake.

#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "analysis/queries.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/subprocess.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "hw/calibrate.h"
#include "models/layer_table.h"

namespace kvtier::cli {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

// The driving thread's time (cpu.driver_op_cost, cpu.driver_wake), timed on the Pipeline's own
// code: `kvtier hw` runs each of the experiment's systems over its first W requests, W =
// run.warmup_requests -- the requests `kvtier validate` serves but leaves out of its
// statistics, so a validation never measures what calibrated it -- or 5 without warm-ups; each
// run's executor reports the driving thread's awake time (from
// returning out of a wait to entering the next: planning, submitting, bookkeeping), the ops it
// submitted, its waits that blocked and their wake-ups (hw/hw_executor.h). Pooled over the
// systems: driver_op_cost = sum awake / sum ops, driver_wake = sum wake-up / sum blocked
// waits. Prints each system's own numbers on stderr.
void MeasureDriver(const std::string& config_path, const ExperimentOptions& e,
                   const std::string& dir, hw::CalibrateResult* r) {
  const std::string self = SelfPath("--driver");
  std::error_code ec;
  const long long requests = e.run.warmup_requests > 0 ? e.run.warmup_requests : 5;
  const fs::path db = fs::path(dir) / ("kvtier_driver_" + std::to_string(getpid()) + ".sqlite");
  fs::remove(db, ec);
  const std::vector<std::string> argv = {
      self, "hw", "--config", config_path, "--out", db.string(), "--quiet",
      "--run.max_requests=" + std::to_string(requests), "--run.warmup_requests=0"};
  std::fprintf(stderr, "kvtier calibrate: driving thread: kvtier hw of %s's systems over %lld "
               "requests ...\n", config_path.c_str(), requests);
  const int rc = Spawn(argv, /*silent=*/true);
  struct Sums { double awake = 0, ops = 0, wake = 0, blocked = 0; };
  std::map<std::string, Sums> per_system;
  if (rc == 0) {
    for (const DriverTimeRow& row : DriverTimes(db.string(), {})) {
      Sums& x = per_system[row.system];
      x.awake += row.awake_s, x.ops += row.ops, x.wake += row.wake_s;
      x.blocked += row.blocked_waits;
    }
  }
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db.string() + suffix, ec);
  if (rc != 0 || per_system.empty()) {
    throw InputError("--driver: `kvtier hw --config " + config_path + "` over " +
                     std::to_string(requests) + " requests failed (exit " + std::to_string(rc) +
                     "); run it yourself to see why");
  }
  Sums all;
  for (const auto& [system, x] : per_system) {
    std::fprintf(stderr, "  driver %-16s %6.0f ops %8.3f ms awake: %7.2f us/op; %5.0f blocked "
                 "waits: %7.2f us wake-up\n", system.c_str(), x.ops, x.awake * 1e3,
                 x.ops > 0 ? x.awake / x.ops * 1e6 : 0.0, x.blocked,
                 x.blocked > 0 ? x.wake / x.blocked * 1e6 : 0.0);
    all.awake += x.awake, all.ops += x.ops, all.wake += x.wake, all.blocked += x.blocked;
    if (x.ops > 0) {
      r->driver_by_system.push_back(
          {system, x.awake / x.ops, x.blocked > 0 ? x.wake / x.blocked : -1.0});
    }
  }
  if (all.ops <= 0) throw InputError("--driver: the hw runs submitted no operation");
  r->driver_op_cost_s = all.awake / all.ops;
  r->driver_wake_s = all.blocked > 0 ? all.wake / all.blocked : 0;
  r->driver_method = "kvtier hw of " + fs::path(config_path).filename().string() + "'s " +
                     std::to_string(per_system.size()) + " systems over their first " +
                     std::to_string(requests) + (requests == 1 ? " request" : " requests") +
                     ": driving-thread awake time / ops submitted, wake-up time / "
                     "blocked waits, pooled over the systems (driver_op_cost, driver_wake) and "
                     "each system's own (driver_op_costs, driver_wakes: what its runs use)";
}

}  // namespace

int RunCalibrate(const Args& args) {
  po::options_description desc("kvtier calibrate options");
  std::string out, config_path;
  bool layer_table = false, driver = false;
  hw::CalibrateOptions o;
  desc.add_options()("help,h", "show this help")(
      "out", po::value(&out)->required(), "hardware profile INI to write")(
      "name", po::value(&o.name), "hardware.name (default calibrated-<host>)")(
      "dir", po::value(&o.dir), "scratch directory on the disk to measure (default: the "
                                "directory of --out)")(
      "config", po::value(&config_path), "experiment whose chunk size and queue depth to use")(
      "block", po::value(&o.block), "SSD read block in bytes (default 65536)")(
      "queue-depth", po::value(&o.queue_depth), "SSD queue depth (default 32)")(
      "quick", po::bool_switch(&o.quick), "a few seconds instead of about a minute (tests)")(
      "allow-buffered", po::bool_switch(&o.allow_buffered),
      "measure a file system without O_DIRECT (marked in the profile)")(
      "layer-table", po::bool_switch(&layer_table),
      "also time the host backend's real compute per layer step for the --config model into "
      "NAME.layers.csv, named by the profile's gpu.layer_table")(
      "driver", po::bool_switch(&driver),
      "also time the driving thread on the Pipeline's own code (cpu.driver_op_cost, "
      "cpu.driver_wake): kvtier hw of the --config experiment's systems over its warm-up "
      "requests (5 without warm-ups)");
  po::variables_map vm;
  StoreArgs("calibrate", args, desc, desc, &vm);
  if (vm.count("help")) {
    std::cout << "usage: kvtier calibrate --out configs/hardware/NAME.ini [options]\n" << desc;
    return 0;
  }
  NotifyArgs("calibrate", &vm);
  if (layer_table && config_path.empty()) {
    throw InputError("--layer-table: needs --config (the experiment whose model to measure)");
  }
  if (driver && config_path.empty()) {
    throw InputError("--driver: needs --config (the experiment whose systems to run)");
  }
  std::optional<ExperimentOptions> experiment;
  if (!config_path.empty()) {
    const Config c = Config::Load(config_path, {});
    const ExperimentOptions e = BuildOptions(c);
    experiment = e;
    if (!vm.count("block")) o.block = e.model.ChunkBytes(e.system.chunk_tokens);
    if (!vm.count("queue-depth")) o.queue_depth = e.hardware.ssd_queue_depth;
    o.row_bytes = e.model.KBytesPerTokenLayer();
  }
  if (o.queue_depth < 1 || o.queue_depth > 1024) throw InputError("--queue-depth: must be in [1, 1024]");
  if (o.block < 512 || o.block > (64ull << 20)) throw InputError("--block: must be in [512 B, 64 MiB]");
  // The profile is written after a minute of measuring: a path it cannot be written to
  // ('--out ""', a directory, a read-only place) failed only then, with ": cannot write".
  CheckOutputFile(out, "--out");
  // `--out x.ini --config x.ini` wrote the profile over the experiment.
  CheckOutputIsNotInput(out, "--out", config_path, "the --config experiment");
  fs::path out_path(out);
  if (!o.dir.empty()) {
    // A FIFO or file here was an internal error after the first measurement; a missing path
    // was created (and left behind), so a typo measured whatever disk held its parent.
    std::error_code ec;
    if (!fs::exists(o.dir, ec)) {
      throw InputError("--dir " + o.dir + ": no such directory (give a directory on the disk "
                       "to measure)");
    }
    if (!fs::is_directory(o.dir, ec)) throw InputError("--dir " + o.dir + ": not a directory");
  }
  if (o.dir.empty()) {
    // `--out /dev/null` (to see the numbers only) measured /dev, a RAM file system, as the SSD.
    std::error_code ec;
    if (fs::exists(out_path, ec) && !fs::is_regular_file(out_path, ec)) {
      throw InputError(out + ": --out is not a regular file, so its directory is not the disk "
                       "to measure: give --dir DIR, a directory on that disk");
    }
    o.dir = (out_path.has_parent_path() ? out_path.parent_path() : fs::path(".")).string();
  }
  if (o.name.empty()) o.name = out_path.stem().string();
  std::fprintf(stderr, "kvtier calibrate: measuring (block %llu B, QD %d%s) in %s ...\n",
               (unsigned long long)o.block, o.queue_depth, o.quick ? ", quick" : "", o.dir.c_str());
  o.progress = [](const std::string& line) {
    std::fprintf(stderr, "kvtier calibrate: %s ...\n", line.c_str());
  };
  hw::CalibrateResult r;
  if (Status s = hw::Calibrate(o, &r); !s.ok()) {
    if (s.code() == Status::Code::kUnavailable) throw InputError(s.ToString());
    std::fprintf(stderr, "kvtier calibrate: %s\n", s.ToString().c_str());
    return 1;
  }
  std::fputs(hw::MeasurementTable(r).c_str(), stderr);
  fs::path table_path;
  if (layer_table) {
    if (r.backend != "host") {
      throw InputError(
          "--layer-table: times the host backend's Eigen compute, but this machine "
          "calibrates the " +
          r.backend + " backend; drop --layer-table");
    }
    table_path = out_path.parent_path() / (out_path.stem().string() + ".layers.csv");
    std::fprintf(stderr,
                 "kvtier calibrate: timing %s layer steps (host backend, real compute) ...\n",
                 experiment->model.name.c_str());
    LayerTable table;
    if (Status s =
            hw::MeasureLayerTable(experiment->model, experiment->system.itf_options.probe_heads,
                                  o.quick, r.kernel_overhead_s, &table);
        !s.ok()) {
      std::fprintf(stderr, "kvtier calibrate: %s\n", s.ToString().c_str());
      return 1;
    }
    // Measured vs the roofline of the profile just measured (what a run would use without it).
    HardwareOptions hw = experiment->hardware;
    hw.gpu_flops = r.gemm_flops > 0 ? r.gemm_flops : hw.gpu_flops;
    hw.gpu_efficiency = r.gemm_flops > 0 ? 1.0 : hw.gpu_efficiency;
    hw.gpu_mem_bw = r.mem_bw;
    hw.gpu_kernel_overhead = r.kernel_overhead_s;
    const ComputeTimer roofline(experiment->model, hw);
    for (const LayerTablePoint& p : table.points) {
      const double model_s = roofline.StepRoofline(p.kind, p.new_tokens, p.context_tokens, p.heads);
      std::fprintf(stderr,
                   "  %-13s n %5lld m %5lld heads %d: %9.3f ms (roofline %9.3f ms, x%.2f)\n",
                   std::string(LayerStepKindName(p.kind)).c_str(), (long long)p.new_tokens,
                   (long long)p.context_tokens, p.heads, p.seconds * 1e3, model_s * 1e3,
                   p.seconds / model_s);
    }
    if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path());
    std::ofstream tf(table_path);
    tf << FormatLayerTable(table);
    tf.close();
    if (!tf) throw InputError(table_path.string() + ": cannot write");
    o.layer_table = table_path.filename().string();
  }
  if (driver) MeasureDriver(config_path, *experiment, o.dir, &r);
  const std::string ini = hw::ProfileIni(o, r);
  if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path());
  std::ofstream f(out);
  f << ini;
  f.close();
  if (!f) throw InputError(out + ": cannot write");
  std::fputs(ini.c_str(), stdout);
  std::fprintf(stderr, "kvtier calibrate: wrote %s (%.1f s)\n", out.c_str(), r.seconds);
  if (!table_path.empty()) {
    std::fprintf(stderr, "kvtier calibrate: wrote %s (gpu.layer_table)\n", table_path.c_str());
  }
  return 0;
}

}  // namespace kvtier::cli
