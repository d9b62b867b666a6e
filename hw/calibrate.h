#pragma once
// Calibration (`kvtier calibrate`): measures this machine with the hw path's own engine and
// writes a hardware profile INI the simulator reads (configs/hardware/*.ini keys), so the
// simulator's SSD, memory, PCIe and compute models can be checked against `kvtier hw`
// (notes/hw-path.md 6.5 item 9). Each key's `source` is written into the profile.
//
//   ssd.read_bw      O_DIRECT random reads of `block` bytes at queue depth `queue_depth`
//                    through the IoEngine (io_uring, else pread), on a scratch file
//   ssd.latency      QD1 mean time per read minus block / read_bw (the sim charges
//                    ceil(ios/QD) * latency + bytes / bw); then checked, not fitted, against
//                    whole-chunk reads and 4 KiB-aligned extent reads (1-8 per chunk) through
//                    the same engine: measured vs that formula's prediction (ssd_units)
//   ssd.write_bw     chunk-sized ChunkStore::Put records (O_DIRECT, sync off, as kvtier hw)
//   cpu.memcpy_bw    cold block copies cycling through two arenas (never one hot buffer)
//   cpu.shared_copy_bw
//                    host backend: two threads doing those copies at once, each over its own
//                    half of the arenas; bytes both copied / wall time (what concurrent
//                    gathers and the backend's memcpy "DMA" share). With a CUDA device: not
//                    written (0: DMA is not a CPU copy; DRAM is taken not to bind)
//   cpu.gather_bw, cpu.gather_run_cost
//                    gathers of k in {1..64} rows of 64-row chunks (rows spread: k runs; or
//                    adjacent: 1 run), row sizes 256 B - 20 KiB, one memcpy per run as the hw
//                    gather does; fit seconds = runs * run_cost + bytes / bw (FitGather)
//   pcie.h2d/d2h_bw, pcie.latency
//                    the copy curve: copies of 256 B .. 64 MiB (--quick: .. 4 MiB), many per
//                    size, cycling through the buffers; fit seconds = calls * latency +
//                    bytes / bw (FitCopyCurve). host backend: memcpy from a host arena into
//                    the "device" arena, as host_backend.cc's Copy does per piece; cuda:
//                    cudaMemcpyAsync from a cudaHostRegister'ed arena (hw/calibrate_cuda.cc)
//   pcie.batch_latency, pcie.descriptor_cost
//                    batched calls of 1..1024 descriptors of 256 B and 4 KiB; fit seconds =
//                    batch_latency + descriptors * descriptor_cost + bytes / bw (FitBatch,
//                    bw fitted too and printed beside pcie.h2d_bw). host: the
//                    emulation is a memcpy loop over the descriptors (so these are memcpy
//                    call costs, not a driver's); cuda: cudaMemcpyBatchAsync
//   gpu.gather_bw, gpu.gather_sm_share
//                    host: the emulated device gather is the same memcpy per run into the
//                    "device" arena, so gather_bw = the CPU gather fit's bandwidth, and the
//                    share is 0 (modeled compute is a sleep that nothing slows; the slowdown
//                    of a real Eigen GEMM next to a gather thread is printed, not written);
//                    cuda: a gather kernel over mapped pinned memory, and the slowdown of a
//                    cuBLAS GEMM running beside it
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
#include <functional>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/status.h"
#include "hw/calibrate_fit.h"
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
  // Called with one line per measurement step as it starts (`kvtier calibrate` prints it on
  // stderr); may be empty.
  std::function<void(const std::string&)> progress;
};

// One SSD read check: `ios` reads of `bytes` in total at queue depth `queue_depth`, measured
// (median of the repetitions) against the simulator's formula with the calibrated read_bw and
// latency (PredictSsdReadSeconds).
struct SsdUnitSample {
  std::string what;          // e.g. "whole 65536 B chunks", "4 x 4 KiB extents / chunk"
  int queue_depth = 1;
  double ios = 0, bytes = 0;
  double seconds = 0, predicted_s = 0;
};

struct CalibrateResult {
  std::string backend;      // host | cuda
  std::string io_backend;   // io_uring | pread
  bool direct_io = true;
  double ssd_read_bw = 0, ssd_latency_s = 0, ssd_qd1_bw = 0, ssd_write_bw = 0;
  double memcpy_bw = 0, gather_bw = 0;
  double shared_copy_bw = 0;  // cpu.shared_copy_bw (0: not written)
  double h2d_bw = 0, d2h_bw = 0, pcie_latency_s = 0;
  double gemm_flops = 0, mem_bw = 0, kernel_overhead_s = 0;
  double op_overhead_s = 0;  // cpu.op_overhead
  // cpu.driver_op_cost / cpu.driver_wake (both 0: not measured, not written) and how
  // (kvtier calibrate --driver: hw runs of the experiment's systems; cli/cmd_calibrate.cc).
  double driver_op_cost_s = 0, driver_wake_s = 0;
  std::string driver_method;
  // Each timed system's own (cpu.driver_op_costs, cpu.driver_wakes), in name order; a system
  // with no blocked wait has no wake entry.
  struct DriverTime {
    std::string system;
    double op_cost_s = 0;
    double wake_s = -1;  // < 0: no blocked wait was timed
  };
  std::vector<DriverTime> driver_by_system;
  std::string gpu_name;
  double seconds = 0;       // how long calibration took
  std::string load_before, load_after;  // /proc/loadavg's 1/5/15-minute averages ("" if absent)

  // The copy curve and its fit (pcie.latency, pcie.h2d_bw), the gathers (cpu.gather_*), the
  // batched calls (pcie.batch_latency, pcie.descriptor_cost), the SSD read-unit checks.
  std::vector<CopySample> copy_curve;
  CopyFit copy_fit;
  std::vector<GatherSample> gathers;
  GatherFit gather_fit;
  std::vector<BatchSample> batches;
  BatchFit batch_fit;
  std::vector<SsdUnitSample> ssd_units;
  double gather_run_cost_s = 0, batch_latency_s = 0, descriptor_cost_s = 0;
  double gpu_gather_bw = 0, gpu_gather_sm_share = 0;
  double host_gemm_slowdown = -1;  // host: real GEMM beside a gather thread, t/t_alone - 1
  // How each group of keys was measured, for the profile's `source` line and comments.
  std::string copy_method, batch_method, gather_method, device_gather_method;
};

// Measures. IoError/Unavailable when the scratch file cannot be used (e.g. no O_DIRECT).
Status Calibrate(const CalibrateOptions& options, CalibrateResult* out);

// The profile INI text ([hardware] name/source, [ssd], [cpu], [pcie], [gpu]).
std::string ProfileIni(const CalibrateOptions& options, const CalibrateResult& r);

// The human-readable tables of what was measured (copy curve, gathers, batches, SSD read
// units, each with the fit's prediction and residual), for stderr.
std::string MeasurementTable(const CalibrateResult& r);

// See the file comment. `probe_heads` is clamped to [1, kv_heads]. Fills `out` (points and the
// `model`/`source` meta lines).
Status MeasureLayerTable(const ModelSpec& model, int probe_heads, bool quick,
                         double step_overhead_s, LayerTable* out);

}  // namespace kvtier::hw
