#pragma once
// The reports kvtier prints from a results file, and the rows `kvtier eval` adds to it, as
// functions of the results library: the SQL lives here, beside the schema and the views it
// reads (analysis/schema.sql, analysis/views.sql, documented in analysis/SCHEMA.md), and cli/
// holds none. Each reader opens the file read-only, runs its query and closes it; a file that
// cannot be opened or a query that fails is an InputError naming the file (exit 2 in the CLI),
// like ResultsDb's. The views use complete runs and measured requests only (no warm-ups, no
// failed requests), so a run with none of those has no row.
//
// Thread safety: each call uses its own connection; calls on different files or read-only
// calls on one file may run concurrently.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kvtier {

class ResultsDb;

// One run's row of the run_summary view: what `kvtier sim` and `kvtier hw` print per system.
struct RunSummaryRow {
  long long run_id = 0;
  std::string system;
  long long requests = 0;  // measured requests
  double mean_ttft_s = 0;
  double p50_ttft_s = 0;
  double p99_ttft_s = 0;
  double mean_queue_s = 0;
  double mean_io_stall_s = 0;
  std::optional<double> gpu_hit_ratio;  // of the chunks looked up; none if none was
  std::optional<double> cpu_hit_ratio;
  double mean_ssd_read_bytes = 0;
  std::optional<double> itf_fallback_rate;  // of the layers where ITF ran; none if it never ran
};

// The run_summary rows of `run_ids`, lowest mean TTFT first. Ids without a row (incomplete
// runs, runs with no measured request) are left out.
std::vector<RunSummaryRow> RunSummaries(const std::string& path,
                                        const std::vector<long long>& run_ids);

// One run's row of the decode_throughput view (runs whose system decodes), what `kvtier sim`
// prints below the TTFT table.
struct DecodeSummaryRow {
  long long run_id = 0;
  std::string system;
  long long requests = 0;  // measured decode requests
  long long tokens = 0;    // tokens the decode steps produced
  double tokens_per_s = 0;
  double mean_batch = 0;
  long long max_batch = 0;
  double mean_step_s = 0;
  double mean_stall_s = 0;
  double mean_tpot_s = 0;
  double p99_tpot_s = 0;
};

// The decode_throughput rows of `run_ids`, highest throughput first; runs that did not decode
// have none.
std::vector<DecodeSummaryRow> DecodeSummaries(const std::string& path,
                                              const std::vector<long long>& run_ids);

// The simulator's per-request TTFT error against the hardware for one system, over the
// requests the sim_vs_hw view pairs between the sim runs and the hw runs asked for.
// Percentiles are nearest-rank, like the views'.
struct TtftErrorSummary {
  std::string system;
  std::size_t requests = 0;  // paired measured requests
  double median_abs = 0;     // |sim - hw| / hw TTFT
  double p90_abs = 0;
  double max_abs = 0;
  double median_signed = 0;  // (sim - hw) / hw: > 0 when the simulator is slow
};

// One summary per system with at least one paired request, by system name. An error is 0 for
// a request whose hardware TTFT is 0 (the view's ratio is NULL there).
std::vector<TtftErrorSummary> SimVsHwTtftErrors(const std::string& path,
                                                const std::vector<long long>& sim_run_ids,
                                                const std::vector<long long>& hw_run_ids);
// The same for decode: per measured decode request (decode_requests) of the paired runs,
// |sim - hw| / hw of its tpot_s; one summary per system with at least one paired decode request.
std::vector<TtftErrorSummary> SimVsHwTpotErrors(const std::string& path,
                                                const std::vector<long long>& sim_run_ids,
                                                const std::vector<long long>& hw_run_ids);

// One stage's busy time over a whole run, sim against hw (view sim_vs_hw_stages): SSD reads,
// H2D copies, CPU gathers, ... and 'compute' (the layers' compute intervals).
struct StageErrorRow {
  std::string system;
  std::string stage;
  double sim_busy_s = 0;
  double hw_busy_s = 0;
  double rel_error = 0;  // (sim - hw) / hw; 0 when the hardware's busy time is 0
};

// The stage rows of the paired runs, ordered by system and stage.
std::vector<StageErrorRow> SimVsHwStages(const std::string& path,
                                         const std::vector<long long>& sim_run_ids,
                                         const std::vector<long long>& hw_run_ids);

// The driving thread's time in one complete hw run (its metrics hw.driver_awake_s,
// hw.driver_ops, hw.driver_wake_s, hw.driver_blocked_waits: hw/hw_executor.h), what the
// simulator's cpu.driver_op_cost and cpu.driver_wake model.
struct DriverTimeRow {
  long long run_id = 0;
  std::string system;
  double awake_s = 0;     // from returning out of a wait to entering the next, summed
  double ops = 0;         // ops it submitted
  double wake_s = 0;      // wake-up time after the waits that blocked, summed
  double blocked_waits = 0;
};

// The rows of the complete hw runs among `run_ids` that logged the driver metrics (every
// complete hw run in the file when `run_ids` is empty), by run id.
std::vector<DriverTimeRow> DriverTimes(const std::string& path,
                                       const std::vector<long long>& run_ids);

// One row of the accuracy table (`kvtier eval`; analysis/schema.sql documents the columns).
struct AccuracyRecord {
  std::string task;             // piqa | copa | rte | openbookqa; decode: texts | greedy | niah
  std::string selector;         // full | itf | h2o | spi | random; decode: full | kivi |
                                // specache | specache_nospec
  std::optional<double> alpha;  // ITF only
  double retention = 1;
  int items = 0;
  int correct = 0;
  double accuracy = 0;
  double first_token_agreement = 0;
  double mean_kept_fraction = 0;
  std::optional<double> itf_fallback_rate;  // ITF only
  // Decode rows only (all empty for multiple choice).
  std::optional<int> kv_bits, kv_group, kv_residual, topk;
  std::optional<std::string> kv_quant;
  std::optional<double> perplexity, token_agreement, hit_rate, oracle_hit_rate, kv_size_ratio;
};

// Adds `rows` to run `run_id` of `db` in one transaction (all or none). Throws InputError
// naming the file; a row the schema rejects (an unknown selector) rolls the others back.
void InsertAccuracy(ResultsDb* db, long long run_id, const std::vector<AccuracyRecord>& rows);

// Throws InputError naming the file when its accuracy table was created before the decode
// selectors existed: SQLite cannot alter the old CHECK, so decode rows would be rejected at
// the first insert; `kvtier eval` asks before any work.
void RequireDecodeSelectors(ResultsDb* db);

}  // namespace kvtier
