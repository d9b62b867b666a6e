#pragma once
// Shared by the sim tests: the golden tests' model and hardware (small enough that every
// simulated time can be derived by hand), a small OPT-shaped model, and running a simulation in a forked child (SimGrid
// allows one engine per process).

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>

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

// A small OPT-shaped model (4 layers, 8 heads of 64) for pipeline-level sim tests.
inline ModelSpec SmallOptModel() {
  ModelSpec m;
  m.name = "opt-small";
  m.family = ModelFamily::kOpt;
  m.layers = 4;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = 64;
  m.ffn = 2048;
  m.vocab = 50272;
  m.max_context = 16384;
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

// Runs `fn` in a forked child and returns the bytes it returned; the child must exit cleanly.
inline std::string InChildText(const std::function<std::string()>& fn) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const std::string out = fn();
    const ssize_t n = write(fds[1], out.data(), out.size());
    _exit(n == ssize_t(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, std::size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return out;
}

}  // namespace kvtier::testing
