#include "sim/serve.h"

#include <algorithm>

#include "core/check.h"

namespace kvtier::sim {

ServeResult ServeRequests(SimExecutor& executor, Pipeline& pipeline, int workers,
                          const std::function<bool(ServeItem*)>& next,
                          const std::function<void(const ServeItem&, const Status&)>& done) {
  KVTIER_CHECK(workers >= 1, "ServeRequests needs at least one worker");
  ServeResult result;
  if (pipeline.decodes()) {
    KVTIER_CHECK(workers == 1, "ServeRequests: a decoding system serves one prefill at a time");
    executor.Run([&] {
      ServeItem item;
      long long served = 0;
      result.finish = ServeWithDecode(
          pipeline, executor,
          [&](bool* warmup) -> const Request* {
            if (!next(&item)) return nullptr;
            *warmup = item.warmup;
            return &item.request;
          },
          [&](const Request&, bool, const Status& st) { done(item, st); }, &served);
      result.requests = served;
      executor.Drain();
      result.simulated_s = executor.Now();
    });
    return result;
  }
  int active = workers;
  // Actors are cooperative: between two executor waits a worker runs alone, so taking the next
  // request and the counters need no locking.
  executor.Run(workers, [&](int) {
    ServeItem item;
    while (next(&item)) {
      if (item.request.arrival_s > executor.Now()) executor.IdleUntil(item.request.arrival_s);
      const Status st = pipeline.Run(item.request, item.warmup);
      ++result.requests;
      done(item, st);
    }
    // The last worker out waits for the background work; every worker then waits until nothing
    // it started is still running.
    if (--active == 0) result.finish = pipeline.Finish();
    executor.Drain();
    result.simulated_s = std::max(result.simulated_s, executor.Now());
  });
  return result;
}

}  // namespace kvtier::sim
