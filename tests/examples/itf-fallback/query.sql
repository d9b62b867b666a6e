-- Per group of 8 layers: ITF's fallback rate and the probe heads' mean similarity (spec only;
-- the similarity is the mean pairwise Jaccard of the probe heads' top-k sets).
.headers on
.mode column
SELECT l.layer / 8 * 8 AS first_layer,
       COUNT(*) AS layer_requests,
       printf('%.3f', AVG(l.itf_fallback)) AS fallback_rate,
       printf('%.3f', AVG(l.itf_similarity)) AS similarity,
       printf('%.3f', AVG(l.itf_threshold)) AS threshold
FROM layers l JOIN measured_requests m USING (run_id, request_id) JOIN runs r USING (run_id)
WHERE r.system = 'spec'
GROUP BY first_layer
ORDER BY first_layer;

-- What the fallbacks cost: TTFT and exposed I/O of both systems.
SELECT system,
       requests,
       printf('%.2f', 1000 * mean_ttft_s) AS mean_ttft_ms,
       printf('%.2f', 1000 * mean_io_stall_s) AS io_stall_ms,
       printf('%.3f', itf_fallback_rate) AS itf_fallback_rate
FROM run_summary
ORDER BY system;
