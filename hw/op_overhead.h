#pragma once
// The hw executor's fixed cost per operation, measured through the executor itself (what the
// simulator's `cpu.op_overhead` models; `kvtier calibrate` writes it).
//
// Chains like a Pipeline's demand load of one layer -- an SSD read of one chunk, the H2D copy
// of it, a layer step after the copy, the driving thread waiting on the step -- run on a
// HwExecutor (host backend, nothing paced, compute of ~0 s) with a scratch chunk store in
// `dir`. Per chain: (latency - the ops' busy time) / 2, the time spent between the ops (the
// hand-offs: the read's completion starting the copy, the copy waking the compute lane, the
// step waking the driving thread) spread over the chain's two transfer ops, since the simulator
// charges the overhead to transfer ops only. Returns the median over `chains` chains (after 20
// unmeasured ones).

#include <string>

#include "core/status.h"
#include "core/types.h"

namespace kvtier::hw {

Status MeasureOpOverhead(const std::string& dir, int chains, Seconds* out);

}  // namespace kvtier::hw
