-- At each run's largest batch (the steps there that produced a token per sequence): batch,
-- throughput, mean step and stall, batch / throughput over full_gpu's, and the step over
-- specache's (Table 4: without / with speculative prefetch).
.headers on
.mode column
WITH m AS (SELECT run_id, MAX(batch) AS batch FROM decode_steps GROUP BY run_id),
s AS (SELECT d.run_id, m.batch, SUM(d.tokens) / SUM(d.end_s - d.start_s) AS tps,
             AVG(d.end_s - d.start_s) AS step_s, AVG(d.stall_s) AS stall_s
      FROM decode_steps d JOIN m ON m.run_id = d.run_id AND d.batch = m.batch
      WHERE d.tokens = d.batch GROUP BY d.run_id),
x AS (SELECT r.system, s.* FROM runs r JOIN s USING (run_id))
SELECT a.system, a.batch,
       printf('%.1f', a.tps) AS tokens_per_s,
       printf('%.1f', 1000 * a.step_s) AS step_ms,
       printf('%.1f', 1000 * a.stall_s) AS stall_ms,
       printf('%.2f', 1.0 * a.batch / f.batch) AS batch_x_full,
       printf('%.2f', a.tps / f.tps) AS tput_x_full,
       printf('%.2f', a.step_s / p.step_s) AS step_x_specache
FROM x a, x f, x p WHERE f.system = 'full_gpu' AND p.system = 'specache'
ORDER BY a.system;
