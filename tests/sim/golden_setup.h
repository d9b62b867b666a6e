#pragma once
// The golden tests' model and hardware (sim_golden_test, sim_concurrency_test): small enough
// that every simulated time can be derived by hand.

#include "core/model_spec.h"
#include "core/options.h"

namespace kvtier::testing {

// One layer, K of one token in one layer = 4 * 16 * 2 B = 128 B.
inline ModelSpec GoldenModel() {
  ModelSpec m;
  m.name = "golden";
  m.family = ModelFamily::kLlama;
  m.layers = 1;
  m.hidden = 64;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 16;
  m.ffn = 128;
  m.vocab = 1000;
  m.max_context = 4096;
  return m;
}

// A 5 GB/s NVMe SSD (80 us per I/O, queue depth 32) and PCIe at 25 GB/s with 10 us per copy.
inline HardwareOptions GoldenHw() {
  HardwareOptions hw;
  hw.ssd_read_bw = 5e9;
  hw.ssd_latency = 80e-6;
  hw.ssd_queue_depth = 32;
  hw.pcie_h2d_bw = 25e9;
  hw.pcie_latency = 10e-6;
  return hw;
}

}  // namespace kvtier::testing
