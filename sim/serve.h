#pragma once
// ServeRequests: the simulator's request loop, shared by `kvtier sim` (sim/simulate.h) and the
// tests. Requests arrive at their trace times and are served by `workers` concurrent prefills
// (gpu.concurrent_prefills), each a SimGrid actor of the executor running Pipeline::Run. A
// worker that is free takes the next request in arrival order (FIFO) and starts it at its
// arrival time, or at once if it has arrived, so a request's queueing time is its start minus
// its arrival (RequestRecord::ttft_arrival_s - ttft_s). Concurrent requests share the SSD, PCIe
// and GPU with each other and with background writes and prefetch (sim/sim_executor.h). After
// the last request the pipeline's background work is finished and the simulation drained.
// With one worker this is the single loop kvtier sim always ran: the same executor calls in
// the same order.
//
// A system that decodes (decode.policy, core/decode_engine.h; one worker) is served by one loop that
// interleaves prefills and decode steps: a request that has arrived and fits in the decode
// batch's GPU memory is prefilled first and joins the batch; otherwise the batch takes a step;
// with nothing decoding, time passes until the next arrival. Pipeline::Finish then steps the
// batch until it is empty.

#include <functional>

#include "core/pipeline.h"
#include "core/request.h"
#include "core/status.h"
#include "driver/experiment.h"
#include "sim/sim_executor.h"

namespace kvtier::sim {

// The request a worker takes: the experiment driver's item (driver/experiment.h).
using ServeItem = ReplayItem;

struct ServeResult {
  long long requests = 0;  // requests served
  double simulated_s = 0;  // simulated time when the last worker finished
  Status finish;           // Pipeline::Finish's status (a background failure)
};

// Serves requests on `executor` (REQUIRES: Run not called yet) through `pipeline` (built with
// max_in_flight >= workers). next(&item) fills the next request in arrival order and returns
// false when there is none; it is called in trace order by the worker taking the request, possibly
// before the request arrives. done(item, status) is called when Pipeline::Run returned for it.
// To stop after a failure, next returns false from then on; the requests in flight finish.
// Exceptions from the callbacks end the simulation's driving actors' work and are rethrown.
ServeResult ServeRequests(SimExecutor& executor, Pipeline& pipeline, int workers,
                          const std::function<bool(ServeItem*)>& next,
                          const std::function<void(const ServeItem&, const Status&)>& done);

}  // namespace kvtier::sim
