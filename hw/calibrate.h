#pragma once
// Calibration (`kvtier calibrate`): measures this machine with the hw path's own engine and
// writes a hardware profile INI the simulator reads (configs/hardware/*.ini keys), so the
// simulator's SSD, memory, PCIe and compute models can be checked against `kvtier hw`
// (notes/hw-path.md 6.5 item 9).
//
//   ssd.read_bw      O_DIRECT random reads of `block` bytes at queue depth `queue_depth`
//                    through the IoEngine (io_uring, else pread), on a scratch file
//   ssd.latency      QD1 mean time per read minus block / read_bw (the sim charges
//                    ceil(ios/QD) * latency + bytes / bw)
//   ssd.write_bw     chunk-sized ChunkStore::Put records (O_DIRECT, sync off, as kvtier hw)
//   cpu.memcpy_bw    cold block copies cycling through two arenas (never one hot buffer)
//   cpu.gather_bw    rows of `row_bytes` gathered out of staged chunks (half the rows)
//   pcie.h2d/d2h_bw  cuda: pinned cudaMemcpyAsync timed with events; host backend: memcpy into
//                    a separate "device" arena (what the host backend's copies cost)
//   pcie.latency     per-copy overhead: small (4 KiB) copy time minus bytes / bw
//   gpu.flops        cuda: cuBLAS fp32 GEMM; host: Eigen fp32 GEMM, with gpu.efficiency = 1
//                    (the measured rate already is the achieved one)
//   gpu.mem_bw       host: memcpy bandwidth; cuda: device-to-device copy
//   gpu.kernel_overhead  host: median hand-off round trip to a worker thread (per op)
//   cpu.op_overhead  the executor's time between the ops of a read -> h2d -> compute chain,
//                    per transfer op, median (hw/op_overhead.h: through a HwExecutor)
// `quick` shrinks every measurement (a few seconds, for tests). Not thread-safe.
//
// MeasureLayerTable (`kvtier calibrate --config X --layer-table`) times the host backend's real
// compute (HostCompute: what `hw.compute = real` runs, Eigen fp32, one thread) per layer step on
// a small grid for the experiment's model, and returns it as a measured layer table
// (models/layer_table.h) that ComputeTimer interpolates between the points:
//   layer_prefill  n in {32, 128, 512} x kept prefix {0, 512, 2048} (m = n + kept)
//   decode_layer   m in {128, 1024, 4096} (one layer of a decode step)
//   probe_scores   `probe_heads` KV heads, n in {32, 512} x m in {512, 4096}
//   full_scores    all KV heads, same grid
//   output_layer   one position
// (quick: two values per axis, smaller). Points beyond model.max_context are skipped. Each
// point is one untimed warm-up run then the median of `reps` timed runs, plus
// `step_overhead_s` (the per-op hand-off gpu.kernel_overhead measures), so a table row is
// what that step costs the host backend's executor. Heavy for large models: a 13B layer
// takes seconds per point on a small machine, and the weights of one layer plus the LM head
// are allocated in fp32.

#include <cstdint>
#include <string>

#include "core/model_spec.h"
#include "core/status.h"
#include "models/layer_table.h"

namespace kvtier::hw {

struct CalibrateOptions {
  std::string name;               // hardware.name (default: "calibrated-<host>")
  std::string dir;                // scratch directory on the disk to measure
  std::uint64_t block = 64 << 10; // SSD block = the pipeline's chunk read size
  int queue_depth = 32;
  std::uint64_t row_bytes = 384;  // gather row size (one token's K of one layer)
  bool quick = false;
  bool allow_buffered = false;    // measure a file system without O_DIRECT (recorded in source)
  std::string layer_table;        // [gpu] layer_table the profile names (a CSV beside it); "" none
};

struct CalibrateResult {
  std::string backend;      // host | cuda
  std::string io_backend;   // io_uring | pread
  bool direct_io = true;
  double ssd_read_bw = 0, ssd_latency_s = 0, ssd_qd1_bw = 0, ssd_write_bw = 0;
  double memcpy_bw = 0, gather_bw = 0;
  double h2d_bw = 0, d2h_bw = 0, pcie_latency_s = 0;
  double gemm_flops = 0, mem_bw = 0, kernel_overhead_s = 0;
  double op_overhead_s = 0;  // cpu.op_overhead
  std::string gpu_name;
  double seconds = 0;       // how long calibration took
};

// Measures. IoError/Unavailable when the scratch file cannot be used (e.g. no O_DIRECT).
Status Calibrate(const CalibrateOptions& options, CalibrateResult* out);

// The profile INI text ([hardware] name/source, [ssd], [cpu], [pcie], [gpu]).
std::string ProfileIni(const CalibrateOptions& options, const CalibrateResult& r);

// See the file comment. `probe_heads` is clamped to [1, kv_heads]. Fills `out` (points and the
// `model`/`source` meta lines).
Status MeasureLayerTable(const ModelSpec& model, int probe_heads, bool quick,
                         double step_overhead_s, LayerTable* out);

}  // namespace kvtier::hw
