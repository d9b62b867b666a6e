-- TTFT of both ways, then Cake's split of the reused prefix into computed and loaded chunks
-- (Cake's 512-token chunks, summed over the measured requests: 16 per request; the two fronts
-- met after computed_chunks / requests chunks).
.headers on
.mode column
SELECT system,
       requests,
       printf('%.1f', 1000 * mean_ttft_s) AS mean_ttft_ms,
       printf('%.1f', 1000 * mean_io_stall_s) AS io_stall_ms
FROM run_summary
ORDER BY mean_ttft_s;

SELECT system,
       requests,
       prefix_chunks,
       computed_chunks,
       loaded_chunks,
       printf('%.3f', loaded_fraction) AS loaded_fraction
FROM cake_split;
