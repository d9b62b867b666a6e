#include "analysis/queries.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "analysis/results_db.h"
#include "core/errors.h"

namespace kvtier {
namespace {

// A read-only connection and one statement, closed on every path.
class Reader {
 public:
  Reader(const std::string& path, const std::string& sql) : path_(path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
      const std::string err = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw InputError(path + ": cannot open for reading: " + err);
    }
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st_, nullptr) != SQLITE_OK) {
      const std::string err = sqlite3_errmsg(db_);
      sqlite3_close(db_);
      throw InputError(path + ": " + err);
    }
  }
  ~Reader() {
    sqlite3_finalize(st_);
    sqlite3_close(db_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Steps to the next row; false at the end. Throws InputError if the query fails.
  bool Next() {
    const int rc = sqlite3_step(st_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw InputError(path_ + ": " + sqlite3_errmsg(db_));
  }
  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(st_, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  long long Int(int col) const { return sqlite3_column_int64(st_, col); }
  double Double(int col) const { return sqlite3_column_double(st_, col); }  // NULL -> 0
  std::optional<double> Optional(int col) const {
    if (sqlite3_column_type(st_, col) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_double(st_, col);
  }

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* st_ = nullptr;
};

// "1,2,3" for an IN list; "-1" (no run has it) for none.
std::string IdList(const std::vector<long long>& ids) {
  std::string s;
  for (long long id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s.empty() ? "-1" : s;
}

std::string PairedRuns(const std::vector<long long>& sim_run_ids,
                       const std::vector<long long>& hw_run_ids) {
  return " WHERE sim_run_id IN (" + IdList(sim_run_ids) + ") AND hw_run_id IN (" +
         IdList(hw_run_ids) + ")";
}

// Nearest rank: the smallest value with at least p of the values at or below it.
double NearestRank(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t rank = std::size_t(std::ceil(p * double(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

std::vector<RunSummaryRow> RunSummaries(const std::string& path,
                                        const std::vector<long long>& run_ids) {
  std::vector<RunSummaryRow> rows;
  if (run_ids.empty()) return rows;
  Reader r(path,
           "SELECT run_id, system, requests, mean_ttft_s, p50_ttft_s, p99_ttft_s, mean_queue_s, "
           "mean_io_stall_s, gpu_hit_ratio, cpu_hit_ratio, mean_ssd_read_bytes, "
           "itf_fallback_rate FROM run_summary WHERE run_id IN (" +
               IdList(run_ids) + ") ORDER BY mean_ttft_s");
  while (r.Next()) {
    RunSummaryRow row;
    row.run_id = r.Int(0);
    row.system = r.Text(1);
    row.requests = r.Int(2);
    row.mean_ttft_s = r.Double(3);
    row.p50_ttft_s = r.Double(4);
    row.p99_ttft_s = r.Double(5);
    row.mean_queue_s = r.Double(6);
    row.mean_io_stall_s = r.Double(7);
    row.gpu_hit_ratio = r.Optional(8);
    row.cpu_hit_ratio = r.Optional(9);
    row.mean_ssd_read_bytes = r.Double(10);
    row.itf_fallback_rate = r.Optional(11);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<DecodeSummaryRow> DecodeSummaries(const std::string& path,
                                              const std::vector<long long>& run_ids) {
  std::vector<DecodeSummaryRow> rows;
  if (run_ids.empty()) return rows;
  Reader r(path,
           "SELECT run_id, system, COALESCE(requests, 0), tokens, COALESCE(tokens_per_s, 0), "
           "mean_batch, max_batch, mean_step_s, mean_stall_s, COALESCE(mean_tpot_s, 0), "
           "COALESCE(p99_tpot_s, 0) FROM decode_throughput WHERE run_id IN (" +
               IdList(run_ids) + ") ORDER BY tokens_per_s DESC");
  while (r.Next()) {
    DecodeSummaryRow row;
    row.run_id = r.Int(0);
    row.system = r.Text(1);
    row.requests = r.Int(2);
    row.tokens = r.Int(3);
    row.tokens_per_s = r.Double(4);
    row.mean_batch = r.Double(5);
    row.max_batch = r.Int(6);
    row.mean_step_s = r.Double(7);
    row.mean_stall_s = r.Double(8);
    row.mean_tpot_s = r.Double(9);
    row.p99_tpot_s = r.Double(10);
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {

// Decode: the simulator's TPOT against the hardware's per measured decode request of a complete
// sim run and a complete hw run of the same experiment, system and trace, paired as sim_vs_hw
// pairs requests (a query, not a view: a view would change the results schema's version, and
// with it refuse every existing results file, for what one command reads).
constexpr const char* kSimVsHwTpot = R"sql((
SELECT h.system, s.run_id AS sim_run_id, h.run_id AS hw_run_id, dh.request_id,
       (ds.tpot_s - dh.tpot_s) / NULLIF(dh.tpot_s, 0) AS rel_error,
       ABS(ds.tpot_s - dh.tpot_s) / NULLIF(dh.tpot_s, 0) AS abs_rel_error
FROM runs h
JOIN runs s ON s.mode = 'sim' AND h.mode = 'hw' AND s.experiment = h.experiment
           AND s.system = h.system AND s.trace_sha256 = h.trace_sha256
JOIN decode_requests dh ON dh.run_id = h.run_id
JOIN decode_requests ds ON ds.run_id = s.run_id AND ds.request_id = dh.request_id
WHERE h.complete = 1 AND s.complete = 1 AND dh.warmup = 0))sql";

// Per system, the errors of `source` (the view sim_vs_hw, kSimVsHwTpot) between the runs asked
// for.
std::vector<TtftErrorSummary> SimVsHwErrors(const std::string& path, const std::string& source,
                                            const std::vector<long long>& sim_run_ids,
                                            const std::vector<long long>& hw_run_ids) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> errors;
  Reader r(path, "SELECT system, abs_rel_error, rel_error FROM " + source +
                     PairedRuns(sim_run_ids, hw_run_ids));
  while (r.Next()) {
    auto& [abs_errors, signed_errors] = errors[r.Text(0)];
    abs_errors.push_back(r.Double(1));
    signed_errors.push_back(r.Double(2));
  }
  std::vector<TtftErrorSummary> out;
  for (const auto& [system, e] : errors) {
    TtftErrorSummary s;
    s.system = system;
    s.requests = e.first.size();
    s.median_abs = NearestRank(e.first, 0.5);
    s.p90_abs = NearestRank(e.first, 0.9);
    s.max_abs = NearestRank(e.first, 1.0);
    s.median_signed = NearestRank(e.second, 0.5);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::vector<TtftErrorSummary> SimVsHwTtftErrors(const std::string& path,
                                                const std::vector<long long>& sim_run_ids,
                                                const std::vector<long long>& hw_run_ids) {
  return SimVsHwErrors(path, "sim_vs_hw", sim_run_ids, hw_run_ids);
}

std::vector<TtftErrorSummary> SimVsHwTpotErrors(const std::string& path,
                                                const std::vector<long long>& sim_run_ids,
                                                const std::vector<long long>& hw_run_ids) {
  return SimVsHwErrors(path, kSimVsHwTpot, sim_run_ids, hw_run_ids);
}

std::vector<StageErrorRow> SimVsHwStages(const std::string& path,
                                         const std::vector<long long>& sim_run_ids,
                                         const std::vector<long long>& hw_run_ids) {
  std::vector<StageErrorRow> rows;
  Reader r(path, "SELECT system, stage, sim_busy_s, hw_busy_s, rel_error FROM sim_vs_hw_stages" +
                     PairedRuns(sim_run_ids, hw_run_ids) + " ORDER BY system, stage");
  while (r.Next()) {
    rows.push_back({r.Text(0), r.Text(1), r.Double(2), r.Double(3), r.Double(4)});
  }
  return rows;
}

std::vector<DriverTimeRow> DriverTimes(const std::string& path,
                                       const std::vector<long long>& run_ids) {
  std::vector<DriverTimeRow> rows;
  Reader r(path,
           "SELECT r.run_id, r.system, "
           "SUM(CASE m.name WHEN 'hw.driver_awake_s' THEN m.value END), "
           "SUM(CASE m.name WHEN 'hw.driver_ops' THEN m.value END), "
           "SUM(CASE m.name WHEN 'hw.driver_wake_s' THEN m.value END), "
           "SUM(CASE m.name WHEN 'hw.driver_blocked_waits' THEN m.value END) "
           "FROM runs r JOIN metrics m USING (run_id) WHERE r.mode = 'hw' AND r.complete = 1 "
           "AND m.name IN ('hw.driver_awake_s', 'hw.driver_ops', 'hw.driver_wake_s', "
           "'hw.driver_blocked_waits')" +
               (run_ids.empty() ? std::string() : " AND r.run_id IN (" + IdList(run_ids) + ")") +
               " GROUP BY r.run_id ORDER BY r.run_id");
  while (r.Next()) {
    rows.push_back({r.Int(0), r.Text(1), r.Double(2), r.Double(3), r.Double(4), r.Double(5)});
  }
  return rows;
}

void InsertAccuracy(ResultsDb* db, long long run_id, const std::vector<AccuracyRecord>& rows) {
  sqlite3* h = db->handle();
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "INSERT INTO accuracy (run_id, task, selector, alpha, retention, items, correct, accuracy,"
      " first_token_agreement, mean_kept_fraction, itf_fallback_rate, kv_bits, kv_group,"
      " kv_residual, kv_quant, topk, perplexity, token_agreement, hit_rate, oracle_hit_rate,"
      " kv_size_ratio) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  if (sqlite3_prepare_v2(h, sql, -1, &st, nullptr) != SQLITE_OK) {
    throw InputError(db->path() + ": " + sqlite3_errmsg(h));
  }
  auto bind_optional = [st](int col, const std::optional<double>& v) {
    if (v) {
      sqlite3_bind_double(st, col, *v);
    } else {
      sqlite3_bind_null(st, col);
    }
  };
  db->Exec("BEGIN");
  for (const AccuracyRecord& r : rows) {
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, run_id);
    sqlite3_bind_text(st, 2, r.task.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, r.selector.c_str(), -1, SQLITE_TRANSIENT);
    bind_optional(4, r.alpha);
    sqlite3_bind_double(st, 5, r.retention);
    sqlite3_bind_int(st, 6, r.items);
    sqlite3_bind_int(st, 7, r.correct);
    sqlite3_bind_double(st, 8, r.accuracy);
    sqlite3_bind_double(st, 9, r.first_token_agreement);
    sqlite3_bind_double(st, 10, r.mean_kept_fraction);
    bind_optional(11, r.itf_fallback_rate);
    int col = 12;
    for (const std::optional<int>* v : {&r.kv_bits, &r.kv_group, &r.kv_residual}) {
      if (*v) {
        sqlite3_bind_int(st, col++, **v);
      } else {
        sqlite3_bind_null(st, col++);
      }
    }
    if (r.kv_quant) {
      sqlite3_bind_text(st, col++, r.kv_quant->c_str(), -1, SQLITE_TRANSIENT);
    } else {
      sqlite3_bind_null(st, col++);
    }
    if (r.topk) {
      sqlite3_bind_int(st, col++, *r.topk);
    } else {
      sqlite3_bind_null(st, col++);
    }
    for (const std::optional<double>* v :
         {&r.perplexity, &r.token_agreement, &r.hit_rate, &r.oracle_hit_rate, &r.kv_size_ratio}) {
      bind_optional(col++, *v);
    }
    if (sqlite3_step(st) != SQLITE_DONE) {
      const std::string err = sqlite3_errmsg(h);
      sqlite3_finalize(st);
      db->Exec("ROLLBACK");
      throw InputError(db->path() + ": " + err);
    }
  }
  sqlite3_finalize(st);
  db->Exec("COMMIT");
}

void RequireDecodeSelectors(ResultsDb* db) {
  sqlite3_stmt* st = nullptr;
  std::string sql;
  if (sqlite3_prepare_v2(db->handle(), "SELECT sql FROM sqlite_master WHERE name = 'accuracy'", -1,
                         &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    sql = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  if (sql.find("specache") == std::string::npos) {
    throw InputError(db->path() + ": its accuracy table was created before the decode selectors "
                     "(kivi, specache) and rejects them; write decode results to a new file");
  }
}

}  // namespace kvtier
