#pragma once
// The fits `kvtier calibrate` (hw/calibrate.h) turns its timings into profile keys with. Pure
// functions of their samples (no clock, no I/O), so they are unit-tested on synthetic data with
// known parameters (tests/hw/calibrate_fit_test.cc).
//
// Every fit is a weighted linear least squares over the model's cost terms with weights
// 1 / t^2, i.e. it minimises the sum of squared *relative* residuals (pred - t) / t: the
// samples span several decades of time (a 256 B copy against a 64 MiB one), and an absolute
// fit would let the largest samples decide every parameter, so the per-call cost would be lost
// in the large copies' noise. Residuals are reported relative, per sample, in the samples'
// order. Thread-safe (no state).

#include <cstdint>
#include <vector>

namespace kvtier::hw {

// One timed configuration of a copy loop: `calls` calls of `bytes` bytes each took `seconds`
// in total. The model: seconds = calls * latency + calls * bytes / bw.
struct CopySample {
  double bytes = 0;    // per call
  double calls = 1;
  double seconds = 0;  // all calls
};

struct CopyFit {
  double latency_s = 0;  // per call (pcie.latency: one DMA call)
  double bw = 0;         // bytes/s (pcie.h2d_bw)
  std::vector<double> residuals;  // (pred - measured) / measured per sample
  bool ok = false;                // false: fewer than 2 usable samples or a singular system
};

// Fits latency and bandwidth of `samples` (the copy bandwidth curve vs size).
CopyFit FitCopyCurve(const std::vector<CopySample>& samples);

// One timed CPU gather: `runs` contiguous runs of rows (each one memcpy) moving `bytes` in
// total took `seconds`. The model (the simulator's kCpuGather cost):
//   seconds = runs * run_cost + bytes / bw.
struct GatherSample {
  double runs = 0;
  double bytes = 0;
  double seconds = 0;
  double rows_per_chunk = 0;  // descriptive (the table calibrate prints); not in the model
  double row_bytes = 0;       // descriptive
};

struct GatherFit {
  double run_cost_s = 0;  // cpu.gather_run_cost
  double bw = 0;          // cpu.gather_bw
  std::vector<double> residuals;
  bool ok = false;
};

GatherFit FitGather(const std::vector<GatherSample>& samples);

// One timed batched-copy call: `descriptors` copies of `bytes` in total, one call, `seconds`
// (the median of several calls). The model (the simulator's kBatched cost):
//   seconds = batch_latency + descriptors * descriptor_cost + bytes / bw.
// All three are fitted (the bandwidth from the batches' own bytes, so a copy curve taken a
// moment earlier under other load does not leak into the per-descriptor cost); calibrate
// prints the fitted bandwidth beside pcie.h2d_bw.
struct BatchSample {
  double descriptors = 0;
  double bytes = 0;
  double seconds = 0;
};

struct BatchFit {
  double batch_latency_s = 0;    // pcie.batch_latency
  double descriptor_cost_s = 0;  // pcie.descriptor_cost
  double bw = 0;                 // the bytes term's bandwidth, bytes/s
  std::vector<double> residuals;
  bool ok = false;
};

// REQUIRES for a fit: samples of at least two descriptor sizes (else bytes and descriptors
// are collinear).
BatchFit FitBatch(const std::vector<BatchSample>& samples);

// Weighted least squares: minimises sum_i w_i (x_i . p - y_i)^2 for p (size = columns of x).
// Returns false when the normal equations are singular. Exposed for the tests.
bool WeightedLeastSquares(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                          const std::vector<double>& w, std::vector<double>* p);

// The simulator's SSD read cost for one op (sim/sim_executor.cc kSsdRead):
//   bytes / read_bw + ceil(ios / queue_depth) * latency.
double PredictSsdReadSeconds(double ios, double bytes, double read_bw, double latency_s,
                             int queue_depth);

}  // namespace kvtier::hw
