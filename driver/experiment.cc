#include "driver/experiment.h"

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "analysis/results_db.h"
#include "core/check.h"
#include "core/errors.h"
#include "core/stored_layout.h"
#include "traces/trace_io.h"

namespace kvtier {

Experiment::Experiment(const Config& config, std::string trace_path, std::string out_path)
    : config_(config),
      trace_path_(std::move(trace_path)),
      out_path_(std::move(out_path)),
      started_(std::chrono::steady_clock::now()) {
  opts_ = BuildOptions(config_);
}

void Experiment::CheckTrace() { replay_.emplace(PrepareReplay(trace_path_, config_, opts_)); }

ExperimentResult Experiment::Run(ExperimentBackend& backend, const ReplayProgressFn& progress) {
  KVTIER_CHECK(replay_.has_value(), "Experiment::Run before CheckTrace");
  ResultsDb db(out_path_);
  const RunInfo info = MakeRunInfo(backend.mode(), config_, opts_, trace_path_);
  const long long run_id = db.BeginRun(info);
  const auto wall_s = [this] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  };
  try {
    return Serve(db, run_id, info, backend, progress);
  } catch (const ResultsWriteError& e) {
    // The results file failed under the run (the disk filled, an I/O error): a run-time
    // failure like any other, marked failed where the file still takes the mark.
    throw RunFailed("system " + opts_.system.name + ", run " + std::to_string(run_id) + ": " +
                    db.FailRunAfterWriteError(run_id, wall_s(), e));
  } catch (const RunFailed&) {
    throw;  // Serve marked it failed
  } catch (const std::exception& e) {
    // Bad input found only while serving (a trace record corrupted past the header checks,
    // CheckTrace) or a broken invariant: the run ends here and would end the same way again.
    // Marked failed with the error (best effort; the rows logged so far are kept), so that a
    // resumed sweep reports the point instead of taking it for a killed one and rerunning it;
    // the exception still decides the exit code (2 for bad input).
    try {
      db.FailRun(run_id, wall_s(), e.what());
    } catch (const std::exception&) {
    }
    throw;
  }
}

ExperimentResult Experiment::Serve(ResultsDb& db, long long run_id, const RunInfo& info,
                                   ExperimentBackend& backend, const ReplayProgressFn& progress) {
  std::unique_ptr<RunLog> db_log = db.NewRunLog(run_id, config_.GetBool("log.transfers"));
  RunLog& log = *db_log;

  TraceScoreSource scores(replay_->header, opts_.model, replay_->none_model);
  scores.SampleH2o(opts_.h2o_sampled);
  backend.BeginRun(info, &scores);
  PipelineOptions popts;
  popts.system = opts_.system;
  popts.log_chunk_decisions = config_.GetBool("log.chunk_decisions");
  backend.ConfigurePipeline(&popts);
  Pipeline pipeline(opts_.model, popts, &backend.executor(), &scores, &log);

  long long total = 0;  // for progress only; 0 when the trace does not say
  try {
    total = std::stoll(replay_->header.Meta("requests", "0"));
  } catch (const std::logic_error&) {
  }
  const long long max = opts_.run.max_requests;
  if (max > 0 && (total == 0 || total > max)) total = max;

  // The first run-time failure (prewarm, a request, background work) stops the run.
  Status failure;
  if (opts_.run.prewarm) {  // before any request: no executor time passes
    TraceReader warm(trace_path_);
    TraceRecord rec;
    for (long long i = 0; warm.Next(&rec) && (max == 0 || i < max); ++i) {
      pipeline.Prewarm(rec.request);
    }
  }
  failure = backend.BeforeServing(pipeline, opts_.run.prewarm);

  // Requests are taken in trace (arrival) order; their importance is registered when taken,
  // so in trace order, and forgotten when served.
  TraceReader reader(trace_path_);
  long long taken = 0, done = 0;
  const ServeOutcome served = backend.Serve(
      pipeline,
      [&](ReplayItem* item) {
        TraceRecord rec;
        if (!failure.ok() || (max != 0 && taken >= max) || !reader.Next(&rec)) return false;
        item->request = rec.request;
        item->warmup = taken < opts_.run.warmup_requests;
        ++taken;
        scores.Add(std::move(rec));
        return true;
      },
      [&](const ReplayItem& item, const Status& st) {
        scores.Release(item.request.id);
        if (!st.ok() && failure.ok()) failure = st;
        ++done;
        if (progress) progress(done, total, backend.executor().Now());
      });
  if (failure.ok()) failure = served.finish;
  backend.EndServing();

  ExperimentResult result;
  result.run_id = run_id;
  result.requests = served.requests;
  result.end_s = served.end_s;
  result.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  // The prefix KV the SSD holds now (every stored segment, every kind of every layer): the
  // SSD keeps every chunk, so past ssd.capacity the run is one of a larger drive; say so.
  const StoredLayout layout = StoredLayout::Of(opts_.model, opts_.system);
  double token_bytes = 0;
  for (KvKind kind : layout.kinds()) token_bytes += double(layout.TokenBytes(kind));
  const double stored =
      double(pipeline.tree().stored_tokens()) * token_bytes * opts_.model.layers;
  log.LogMetric("ssd.stored_bytes", stored);
  if (stored > double(opts_.hardware.ssd_capacity)) {
    const auto size = [](double b) {
      char buf[32];
      const bool tb = b >= 1e12;
      std::snprintf(buf, sizeof buf, tb ? "%.3g TB" : "%.3g GB", tb ? b / 1e12 : b / 1e9);
      return std::string(buf);
    };
    std::fprintf(stderr,
                 "kvtier: warning: system %s stored %s of prefix KV on the SSD, more than "
                 "ssd.capacity = %s (%s); the SSD keeps every chunk (no SSD eviction is "
                 "modelled), so this is a run on a larger drive\n",
                 opts_.system.name.c_str(), size(stored).c_str(),
                 size(double(opts_.hardware.ssd_capacity)).c_str(),
                 config_.Where("ssd.capacity").c_str());
  }
  log.LogMetric(backend.end_time_metric(), result.end_s);
  log.LogMetric("wall_s", result.wall_s);
  backend.LogMetrics(log);
  log.Close();  // writes the last batch; throws (the run stays incomplete) if it cannot
  db_log.reset();
  if (!failure.ok()) {
    db.FailRun(run_id, result.wall_s, failure.ToString());
    throw RunFailed("system " + opts_.system.name + ", run " + std::to_string(run_id) + ": " +
                    failure.ToString());
  }
  db.EndRun(run_id, result.wall_s);
  return result;
}

}  // namespace kvtier
