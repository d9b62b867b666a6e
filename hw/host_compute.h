#pragma once
// HostCompute: the host backend's real compute for `hw.compute = real`: each ComputeOp runs as
// fp32 Eigen GEMMs and attention at the model's real shapes (one set of random weights shared
// by every layer, random keys/values), single-threaded so the other core stays with the I/O
// threads. Feasible for small models (smollm2-135m: a 2K-token layer is tens of ms); a 13B
// layer takes seconds on 2 cores, which is why `modeled` is the default (docs/hw-mode.md).
// Thread-compatible: one object per compute thread.

#include <memory>

#include "core/executor.h"
#include "core/model_spec.h"

namespace kvtier::hw {

class HostCompute {
 public:
  explicit HostCompute(const ModelSpec& model, unsigned seed = 1);
  ~HostCompute();
  // Runs `op` for real. Returns the FLOPs done (GEMM multiply-adds x 2, attention included).
  double Run(const ComputeOp& op);
  // Measured GEMM throughput (FLOP/s) of an [m x k] x [k x n] product, best of `reps`.
  static double MeasureGemmFlops(int m, int n, int k, int reps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::hw
