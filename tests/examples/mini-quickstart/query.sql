-- Mean and p99 TTFT, the exposed I/O, and where reused chunks came from, per system, fastest
-- first. run_summary covers measured requests (not warm-up) of complete runs.
.headers on
.mode column
SELECT s.system,
       s.requests,
       printf('%.2f', 1000 * s.mean_ttft_s) AS mean_ttft_ms,
       printf('%.2f', 1000 * s.p99_ttft_s) AS p99_ttft_ms,
       printf('%.2f', 1000 * s.mean_io_stall_s) AS mean_io_stall_ms,
       printf('%.3f', s.gpu_hit_ratio) AS gpu_hit,
       printf('%.3f', s.cpu_hit_ratio) AS cpu_hit,
       printf('%.3f', h.ssd_ratio) AS ssd
FROM run_summary s JOIN hit_ratios h USING (run_id)
ORDER BY s.mean_ttft_s, s.system;
