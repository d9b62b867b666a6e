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
// profile, and the profile's [gpu] layer_table names it.

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "hw/calibrate.h"
#include "models/layer_table.h"

namespace kvtier::cli {

namespace po = boost::program_options;
namespace fs = std::filesystem;

int RunCalibrate(const Args& args) {
  po::options_description desc("kvtier calibrate options");
  std::string out, config_path;
  bool layer_table = false;
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
      "NAME.layers.csv, named by the profile's gpu.layer_table");
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
  fs::path out_path(out);
  if (o.dir.empty()) {
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
