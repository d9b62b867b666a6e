-- Views over the results schema for the comparisons users want. Applied by ResultsDb::Open,
-- so every results file has them. Statistics use measured requests only (warmup = 0) of
-- complete runs, unless the view says otherwise. Percentiles are nearest-rank.

-- Requests of complete runs, excluding warm-up, ranked by TTFT within their run.
CREATE VIEW IF NOT EXISTS measured_requests AS
SELECT q.*,
       ROW_NUMBER() OVER (PARTITION BY q.run_id ORDER BY q.ttft_s, q.request_id) AS ttft_rank,
       COUNT(*) OVER (PARTITION BY q.run_id) AS run_requests
FROM requests q JOIN runs r USING (run_id)
WHERE r.complete = 1 AND q.warmup = 0 AND q.status = 'ok';

-- One row per run: what `kvtier sim` prints.
CREATE VIEW IF NOT EXISTS run_summary AS
SELECT r.run_id, r.mode, r.experiment, r.system, r.model, r.hardware, r.trace,
       COUNT(*) AS requests,
       AVG(m.ttft_s) AS mean_ttft_s,
       MIN(CASE WHEN m.ttft_rank >= 0.50 * m.run_requests THEN m.ttft_s END) AS p50_ttft_s,
       MIN(CASE WHEN m.ttft_rank >= 0.99 * m.run_requests THEN m.ttft_s END) AS p99_ttft_s,
       AVG(m.ttft_arrival_s) AS mean_ttft_arrival_s,
       AVG(m.queue_s) AS mean_queue_s,
       AVG(m.io_stall_s) AS mean_io_stall_s,
       AVG(m.ssd_read_bytes) AS mean_ssd_read_bytes,
       SUM(m.ssd_read_bytes) AS ssd_read_bytes,
       SUM(m.pcie_h2d_bytes) AS pcie_h2d_bytes,
       1.0 * SUM(m.gpu_hit_chunks) /
           NULLIF(SUM(m.gpu_hit_chunks + m.cpu_hit_chunks + m.ssd_read_chunks), 0) AS gpu_hit_ratio,
       1.0 * SUM(m.cpu_hit_chunks) /
           NULLIF(SUM(m.gpu_hit_chunks + m.cpu_hit_chunks + m.ssd_read_chunks), 0) AS cpu_hit_ratio,
       1.0 * SUM(m.itf_fallback_layers) / NULLIF(SUM(m.itf_layers), 0) AS itf_fallback_rate,
       AVG(1.0 * m.reused_tokens / NULLIF(m.prefix_tokens, 0)) AS mean_reuse_ratio,
       r.wall_s
FROM runs r JOIN measured_requests m USING (run_id)
GROUP BY r.run_id;

-- TTFT distribution: one row per measured request with its cumulative fraction.
CREATE VIEW IF NOT EXISTS ttft_cdf AS
SELECT m.run_id, r.system, m.ttft_s, 1.0 * m.ttft_rank / m.run_requests AS fraction
FROM measured_requests m JOIN runs r USING (run_id);

-- Per layer: tokens kept of the reused prefix, ITF fallback rate, prefetch accuracy, stall.
CREATE VIEW IF NOT EXISTS layer_retention AS
SELECT l.run_id, r.system, l.layer,
       AVG(1.0 * l.selected_tokens / NULLIF(q.reused_tokens, 0)) AS retention,
       AVG(l.itf_fallback) AS itf_fallback_rate,
       AVG(l.itf_similarity) AS mean_itf_similarity,
       SUM(l.prefetch_used_chunks) * 1.0 / NULLIF(SUM(l.prefetched_chunks), 0) AS prefetch_used_ratio,
       AVG(l.stall_s) AS mean_stall_s
FROM layers l JOIN requests q USING (run_id, request_id) JOIN runs r USING (run_id)
WHERE r.complete = 1 AND q.warmup = 0
GROUP BY l.run_id, l.layer;

-- Bytes and busy time per transfer kind and purpose.
CREATE VIEW IF NOT EXISTS io_breakdown AS
SELECT t.run_id, r.system, t.kind, t.purpose,
       COUNT(*) AS transfers, SUM(t.bytes) AS bytes, SUM(t.ios) AS ios,
       SUM(t.end_s - t.start_s) AS busy_s,
       SUM(t.start_s - t.submit_s) AS queued_s
FROM transfers t JOIN runs r USING (run_id)
WHERE r.complete = 1
GROUP BY t.run_id, t.kind, t.purpose;

-- Where the chunks a run used came from.
CREATE VIEW IF NOT EXISTS hit_ratios AS
SELECT run_id, system, gpu_hit_ratio, cpu_hit_ratio,
       1.0 - COALESCE(gpu_hit_ratio, 0) - COALESCE(cpu_hit_ratio, 0) AS ssd_ratio
FROM run_summary;

-- Each run against the as_h2o_lfu run of the same experiment, model, hardware, mode and trace
-- (the paper's ablation baseline, Fig. 18): TTFT normalised to 1. When the baseline was run
-- more than once, the latest complete run is the reference.
CREATE VIEW IF NOT EXISTS ablation_delta AS
SELECT s.run_id, s.experiment, s.model, s.hardware, s.system,
       s.mean_ttft_s, b.mean_ttft_s AS baseline_mean_ttft_s,
       s.mean_ttft_s / b.mean_ttft_s AS normalized_ttft,
       s.mean_io_stall_s / NULLIF(b.mean_io_stall_s, 0) AS normalized_io_stall
FROM run_summary s JOIN run_summary b
  ON b.run_id = (SELECT MAX(r.run_id) FROM runs r
                 WHERE r.complete = 1 AND r.system = 'as_h2o_lfu' AND r.experiment = s.experiment
                   AND r.model = s.model AND r.hardware = s.hardware AND r.mode = s.mode
                   AND r.trace = s.trace);

-- Simulator against hardware: measured requests of a complete sim run and a complete hw run of
-- the same experiment, system and trace, paired on request_id (what `kvtier validate` reports).
-- rel_error = (sim - hw) / hw of TTFT (service time, queueing excluded).
CREATE VIEW IF NOT EXISTS sim_vs_hw AS
SELECT h.experiment, h.system, h.trace_sha256, s.run_id AS sim_run_id, h.run_id AS hw_run_id,
       qh.request_id, qs.ttft_s AS sim_ttft_s, qh.ttft_s AS hw_ttft_s,
       (qs.ttft_s - qh.ttft_s) / NULLIF(qh.ttft_s, 0) AS rel_error,
       ABS(qs.ttft_s - qh.ttft_s) / NULLIF(qh.ttft_s, 0) AS abs_rel_error,
       qs.io_stall_s AS sim_io_stall_s, qh.io_stall_s AS hw_io_stall_s
FROM runs h
JOIN runs s ON s.mode = 'sim' AND h.mode = 'hw' AND s.experiment = h.experiment
           AND s.system = h.system AND s.trace_sha256 = h.trace_sha256
JOIN requests qh ON qh.run_id = h.run_id
JOIN requests qs ON qs.run_id = s.run_id AND qs.request_id = qh.request_id
WHERE h.complete = 1 AND s.complete = 1 AND qh.warmup = 0 AND qh.status = 'ok'
  AND qs.status = 'ok';

-- Busy time per stage and run: transfer kinds (ssd_read, ssd_write, h2d, d2h, cpu_gather) from
-- the transfers, and 'compute' from the layers' compute intervals; warm-ups included on both
-- sides alike. busy_s is the time the stage had at least one op in progress (the union of the
-- ops' [start, end) intervals): the simulator shares a link fairly between concurrent ops (two
-- at once each take twice as long) where hw lanes run them one after another, so the sum of op
-- durations (op_s) counts shared time twice in sim and not in hw; busy_s means the same in both.
CREATE VIEW IF NOT EXISTS stage_busy AS
WITH iv AS (
  SELECT t.run_id, t.kind AS stage, t.start_s AS s, t.end_s AS e, t.bytes AS bytes
  FROM transfers t JOIN runs r USING (run_id) WHERE r.complete = 1
  UNION ALL
  SELECT l.run_id, 'compute', l.start_s, l.end_s, 0
  FROM layers l JOIN runs r USING (run_id) WHERE r.complete = 1
), ordered AS (
  SELECT *, MAX(e) OVER (PARTITION BY run_id, stage ORDER BY s, e
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
  FROM iv
), islands AS (
  SELECT *, SUM(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
              OVER (PARTITION BY run_id, stage ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island
  FROM ordered
), spans AS (
  SELECT run_id, stage, MAX(e) - MIN(s) AS span, SUM(e - s) AS op_s, SUM(bytes) AS bytes
  FROM islands GROUP BY run_id, stage, island
)
SELECT run_id, stage, SUM(span) AS busy_s, SUM(op_s) AS op_s, SUM(bytes) AS bytes
FROM spans GROUP BY run_id, stage;

-- The stages of paired sim and hw runs: (sim - hw) / hw busy time.
CREATE VIEW IF NOT EXISTS sim_vs_hw_stages AS
SELECT h.experiment, h.system, s.run_id AS sim_run_id, h.run_id AS hw_run_id, bh.stage,
       bs.busy_s AS sim_busy_s, bh.busy_s AS hw_busy_s,
       (bs.busy_s - bh.busy_s) / NULLIF(bh.busy_s, 0) AS rel_error
FROM runs h
JOIN runs s ON s.mode = 'sim' AND h.mode = 'hw' AND s.experiment = h.experiment
           AND s.system = h.system AND s.trace_sha256 = h.trace_sha256
JOIN stage_busy bh ON bh.run_id = h.run_id
JOIN stage_busy bs ON bs.run_id = s.run_id AND bs.stage = bh.stage
WHERE h.complete = 1 AND s.complete = 1;

-- The selection knobs of each sim/hw run, read from its resolved config text ("key = value"
-- lines, every key present): retention, ITF alpha, and the selector class its accuracy is
-- measured under by `kvtier eval` (itf | h2o | full; history for select.policy = history).
-- Runs recorded before the policy keys (itf.enabled, reuse.enabled) are read too.
CREATE VIEW IF NOT EXISTS run_selection AS
SELECT run_id, mode, experiment, system, model,
       CAST(substr(rt, 1, instr(rt, char(10)) - 1) AS REAL) AS retention,
       CAST(substr(al, 1, instr(al, char(10)) - 1) AS REAL) AS alpha,
       CASE WHEN instr(c, char(10) || 'schedule.policy = recompute' || char(10)) > 0
              OR instr(c, char(10) || 'reuse.enabled = false' || char(10)) > 0 THEN 'full'
            WHEN instr(c, char(10) || 'select.policy = itf' || char(10)) > 0
              OR instr(c, char(10) || 'itf.enabled = true' || char(10)) > 0 THEN 'itf'
            WHEN instr(c, char(10) || 'select.policy = h2o' || char(10)) > 0 THEN 'h2o'
            WHEN instr(c, char(10) || 'select.policy = history' || char(10)) > 0 THEN 'history'
            ELSE 'full' END AS selector
FROM (SELECT run_id, mode, experiment, system, model, c,
             substr(c, instr(c, char(10) || 'select.retention = ') + 20) AS rt,
             substr(c, instr(c, char(10) || 'itf.alpha = ') + 13) AS al
      FROM (SELECT run_id, mode, experiment, system, model, char(10) || config AS c
            FROM runs WHERE mode IN ('sim', 'hw')));

-- Accuracy (kvtier eval) beside latency (kvtier sim/hw) per configuration. Join key: the same
-- model name, selector class (run_selection.selector), retention (not for full) and, for ITF,
-- alpha. One row per (accuracy row of a complete eval run, matching complete sim/hw run): a
-- killed eval run (complete = 0) may have written the rows of its first tasks. Multiple-choice
-- rows only (kv_bits NULL): decode rows (KIVI, SpeCache) have no prefill latency to pair with.
CREATE VIEW IF NOT EXISTS accuracy_latency AS
SELECT a.task, a.selector, a.alpha, a.retention, a.items, a.accuracy, a.first_token_agreement,
       a.itf_fallback_rate AS eval_itf_fallback_rate, e.model, a.run_id AS eval_run_id,
       s.run_id AS latency_run_id, s.mode, s.experiment, s.system, s.hardware,
       s.mean_ttft_s, s.p99_ttft_s, s.mean_io_stall_s, s.ssd_read_bytes,
       s.itf_fallback_rate AS sim_itf_fallback_rate
FROM accuracy a
JOIN runs e ON e.run_id = a.run_id AND e.mode = 'eval' AND e.complete = 1 AND a.kv_bits IS NULL
JOIN run_selection k ON k.model = e.model AND k.selector = a.selector
 AND (a.selector = 'full' OR abs(k.retention - a.retention) < 1e-9)
 AND (a.selector <> 'itf' OR abs(k.alpha - a.alpha) < 1e-9)
JOIN run_summary s ON s.run_id = k.run_id;

-- Exposed I/O split by what the GPU waited on (SPEC Fig. 17), per run and (tier, purpose):
-- mean seconds per measured request. A layer's stall (layers.stall_s: time in its window, from
-- the previous layer's end to its own end, not spent on its GPU work) is shared among the
-- transfers of the same request and layer in proportion to the time each was outstanding
-- (submit_s to end_s) within that window, capped so the shares sum to at most the stall. What
-- remains of the request's io_stall_s (stalls no transfer of the layer covers, waits outside the
-- layers, Cake's and stores' transfers, runs with log.transfers = false) is the row with tier
-- 'none' and purpose 'unattributed', so a run's rows sum to run_summary.mean_io_stall_s (up to
-- rounding; the remainder is clamped at 0). An
-- attribution by overlap, not a measurement of the critical transfer. tier = transfers.src.
CREATE VIEW IF NOT EXISTS exposed_io AS
WITH w AS (
  SELECT l.run_id, l.request_id, l.layer, l.end_s, l.stall_s,
         COALESCE(LAG(l.end_s) OVER (PARTITION BY l.run_id, l.request_id ORDER BY l.layer),
                  m.start_s) AS window_start_s
  FROM layers l JOIN measured_requests m USING (run_id, request_id)),
o AS (
  SELECT w.run_id, w.request_id, w.layer, w.stall_s, t.src, t.purpose,
         MAX(0.0, MIN(t.end_s, w.end_s) - MAX(t.submit_s, w.window_start_s)) AS overlap_s
  FROM w JOIN transfers t ON t.run_id = w.run_id AND t.request_id = w.request_id
                         AND t.layer = w.layer
  WHERE w.stall_s > 0 AND t.purpose NOT LIKE 'decode%'),
a AS (
  SELECT run_id, src, purpose,
         overlap_s * MIN(1.0, stall_s / SUM(overlap_s) OVER (
             PARTITION BY run_id, request_id, layer)) AS exposed_s
  FROM o WHERE overlap_s > 0),
parts AS (
  SELECT run_id, src AS tier, purpose, SUM(exposed_s) AS exposed_s FROM a
  GROUP BY run_id, src, purpose),
totals AS (
  SELECT run_id, COUNT(*) AS requests, SUM(io_stall_s) AS io_stall_s FROM measured_requests
  GROUP BY run_id)
SELECT p.run_id, r.system, p.tier, p.purpose, p.exposed_s / t.requests AS mean_exposed_s
FROM parts p JOIN totals t USING (run_id) JOIN runs r USING (run_id)
UNION ALL
SELECT t.run_id, r.system, 'none', 'unattributed',
       MAX(0.0, t.io_stall_s - COALESCE((SELECT SUM(p.exposed_s) FROM parts p
                                         WHERE p.run_id = t.run_id), 0)) / t.requests
FROM totals t JOIN runs r USING (run_id);

-- The resolved configuration of every run, one row per `key = value` line of runs.config.
CREATE VIEW IF NOT EXISTS run_config AS
WITH RECURSIVE lines(run_id, line, rest) AS (
  SELECT run_id, '', config || char(10) FROM runs
  UNION ALL
  SELECT run_id, substr(rest, 1, instr(rest, char(10)) - 1),
         substr(rest, instr(rest, char(10)) + 1)
  FROM lines WHERE rest <> '')
SELECT run_id, trim(substr(line, 1, instr(line, ' = ') - 1)) AS key,
       substr(line, instr(line, ' = ') + 3) AS value
FROM lines WHERE instr(line, ' = ') > 0;

-- Swept keys (SPEC Figs. 22-23, Cake Fig. 5): for complete sim/hw runs of the same experiment,
-- mode and system, the configuration keys whose values differ between the runs (what `kvtier
-- sweep --set` varies, or overrides and traces of separate `kvtier sim` runs). log.* keys and
-- experiment.description are bookkeeping, never swept. Keys that vary together (an
-- include.model and the model.* keys it sets) are one sweep: of keys that split a group's runs
-- the same way only the first is kept, include.* before the others, then by name.
-- value_num is the value as a number in base units (bytes, bytes/s, seconds, FLOP/s; the
-- units of core/units.h), NULL when it is not a number (a trace path, true/false, a name).
CREATE VIEW IF NOT EXISTS swept_keys AS
WITH c AS (
  SELECT r.run_id, r.experiment, r.mode, r.system, k.key, k.value
  FROM runs r JOIN run_config k USING (run_id)
  WHERE r.complete = 1 AND r.mode IN ('sim', 'hw') AND k.key NOT LIKE 'log.%'
    AND k.key <> 'experiment.description'),
varying AS (
  SELECT experiment, mode, system, key FROM c GROUP BY experiment, mode, system, key
  HAVING COUNT(DISTINCT value) > 1),
v AS (  -- first_run: the first run of the group with this run's value of the key
  SELECT c.*, MIN(c.run_id) OVER (PARTITION BY c.experiment, c.mode, c.system, c.key, c.value)
           AS first_run,
         (CASE WHEN c.key LIKE 'include.%' THEN '0' ELSE '1' END) || c.key AS priority
  FROM c JOIN varying USING (experiment, mode, system, key)),
same AS (  -- keys a and b that split the group's runs alike, b before a
  SELECT a.experiment, a.mode, a.system, a.key
  FROM v a JOIN v b ON b.experiment = a.experiment AND b.mode = a.mode
                   AND b.system = a.system AND b.run_id = a.run_id AND b.priority < a.priority
  GROUP BY a.experiment, a.mode, a.system, a.key, b.key
  HAVING SUM(a.first_run <> b.first_run) = 0)
SELECT v.run_id, v.experiment, v.mode, v.system, v.key, v.value,
       CASE WHEN v.value GLOB '[0-9]*' OR v.value GLOB '.[0-9]*' THEN
         CAST(v.value AS REAL) * (CASE ltrim(v.value, '0123456789.eE+-')
           WHEN '' THEN 1 WHEN 'B' THEN 1 WHEN 'K' THEN 1024 WHEN 'M' THEN 1048576
           WHEN 'G' THEN 1073741824 WHEN 'T' THEN 1099511627776.0
           WHEN 'KiB' THEN 1024 WHEN 'MiB' THEN 1048576 WHEN 'GiB' THEN 1073741824
           WHEN 'TiB' THEN 1099511627776.0 WHEN 'kB' THEN 1e3 WHEN 'KB' THEN 1e3
           WHEN 'MB' THEN 1e6 WHEN 'GB' THEN 1e9 WHEN 'TB' THEN 1e12
           WHEN 'B/s' THEN 1 WHEN 'KB/s' THEN 1e3 WHEN 'MB/s' THEN 1e6 WHEN 'GB/s' THEN 1e9
           WHEN 'TB/s' THEN 1e12 WHEN 'KiB/s' THEN 1024 WHEN 'MiB/s' THEN 1048576
           WHEN 'GiB/s' THEN 1073741824 WHEN 'TiB/s' THEN 1099511627776.0
           WHEN 'Bps' THEN 1 WHEN 'KBps' THEN 1e3 WHEN 'MBps' THEN 1e6 WHEN 'GBps' THEN 1e9
           WHEN 'bps' THEN 0.125 WHEN 'Kbps' THEN 125 WHEN 'Mbps' THEN 125000
           WHEN 'Gbps' THEN 125000000 WHEN 'Tbps' THEN 125000000000.0
           WHEN 's' THEN 1 WHEN 'ms' THEN 1e-3 WHEN 'us' THEN 1e-6 WHEN 'ns' THEN 1e-9
           WHEN 'min' THEN 60 WHEN 'h' THEN 3600
           WHEN 'FLOP/s' THEN 1 WHEN 'GFLOP/s' THEN 1e9 WHEN 'TFLOP/s' THEN 1e12
           WHEN 'PFLOP/s' THEN 1e15 WHEN 'GFLOPS' THEN 1e9 WHEN 'TFLOPS' THEN 1e12
           WHEN 'PFLOPS' THEN 1e15 WHEN 'Gf' THEN 1e9 WHEN 'Tf' THEN 1e12 WHEN 'Pf' THEN 1e15
           END)
       END AS value_num
FROM v
WHERE NOT EXISTS (SELECT 1 FROM same s WHERE s.experiment = v.experiment AND s.mode = v.mode
                    AND s.system = v.system AND s.key = v.key);

-- Cake's split of each reused prefix (its cake_meet decisions, `computed C loaded L of M`
-- chunks) over the measured requests of a run: chunks the GPU computed front to back and
-- chunks loaded back to front before the two met.
CREATE VIEW IF NOT EXISTS cake_split AS
SELECT d.run_id, r.system, COUNT(*) AS requests,
       SUM(CAST(substr(d.detail, 10) AS INTEGER)) AS computed_chunks,
       SUM(CAST(substr(d.detail, instr(d.detail, ' loaded ') + 8) AS INTEGER)) AS loaded_chunks,
       SUM(CAST(substr(d.detail, instr(d.detail, ' of ') + 4) AS INTEGER)) AS prefix_chunks,
       1.0 * SUM(CAST(substr(d.detail, 10) AS INTEGER)) /
           NULLIF(SUM(CAST(substr(d.detail, instr(d.detail, ' of ') + 4) AS INTEGER)), 0)
           AS computed_fraction,
       1.0 * SUM(CAST(substr(d.detail, instr(d.detail, ' loaded ') + 8) AS INTEGER)) /
           NULLIF(SUM(CAST(substr(d.detail, instr(d.detail, ' of ') + 4) AS INTEGER)), 0)
           AS loaded_fraction
FROM decisions d JOIN measured_requests m USING (run_id, request_id) JOIN runs r USING (run_id)
WHERE d.kind = 'cake_meet' AND d.detail LIKE 'computed % loaded % of %'
GROUP BY d.run_id;

-- Decode (core/decode.h). Measured decode requests of complete runs (not warm-up), ranked by
-- TPOT within their run, with its cumulative fraction.
CREATE VIEW IF NOT EXISTS tpot_cdf AS
SELECT d.run_id, r.system, d.request_id, d.tpot_s,
       1.0 * ROW_NUMBER() OVER (PARTITION BY d.run_id ORDER BY d.tpot_s, d.request_id) /
           COUNT(*) OVER (PARTITION BY d.run_id) AS fraction
FROM decode_requests d JOIN runs r USING (run_id)
WHERE r.complete = 1 AND d.warmup = 0;

-- Per run that decoded: steps, tokens, the time the batch was stepping (the sum of the steps'
-- durations: prefills between steps are not in it), throughput = tokens / that time, the
-- batch (mean over steps and the largest), the step latency and stall (means), and TPOT
-- (mean, p50, p99 nearest-rank, over tpot_cdf's requests).
CREATE VIEW IF NOT EXISTS decode_throughput AS
WITH s AS (
  SELECT run_id, COUNT(*) AS steps, SUM(tokens) AS tokens, SUM(end_s - start_s) AS decode_s,
         AVG(batch) AS mean_batch, MAX(batch) AS max_batch,
         AVG(end_s - start_s) AS mean_step_s, AVG(stall_s) AS mean_stall_s,
         SUM(h2d_bytes) AS h2d_bytes, MAX(gpu_bytes) AS max_gpu_bytes
  FROM decode_steps GROUP BY run_id),
t AS (
  SELECT run_id, COUNT(*) AS requests, AVG(tpot_s) AS mean_tpot_s,
         MIN(CASE WHEN fraction >= 0.50 THEN tpot_s END) AS p50_tpot_s,
         MIN(CASE WHEN fraction >= 0.99 THEN tpot_s END) AS p99_tpot_s
  FROM tpot_cdf GROUP BY run_id)
SELECT r.run_id, r.system, r.model, r.hardware, t.requests, s.steps, s.tokens, s.decode_s,
       s.tokens / NULLIF(s.decode_s, 0) AS tokens_per_s, s.mean_batch, s.max_batch,
       s.mean_step_s, s.mean_stall_s, s.h2d_bytes, s.max_gpu_bytes,
       t.mean_tpot_s, t.p50_tpot_s, t.p99_tpot_s
FROM runs r JOIN s USING (run_id) LEFT JOIN t USING (run_id)
WHERE r.complete = 1;
