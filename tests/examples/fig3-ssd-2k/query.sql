-- TTFT and the share of it spent waiting for the SSD, per system.
.headers on
.mode column
SELECT system,
       requests,
       printf('%.2f', 1000 * mean_ttft_s) AS mean_ttft_ms,
       printf('%.2f', 1000 * mean_io_stall_s) AS io_stall_ms,
       printf('%.3f', mean_io_stall_s / mean_ttft_s) AS load_share,
       printf('%.1f', mean_ssd_read_bytes / 1048576.0) AS ssd_read_mib
FROM run_summary
ORDER BY system;
