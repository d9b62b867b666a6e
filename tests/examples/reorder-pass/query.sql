-- The reorderer's passes and repacked segments, the K and V chunks a layer's loads touched
-- (metrics), what the repacks moved and why, and what the requests read from the SSD and
-- waited for, per system.
.headers on
.mode column
SELECT r.system,
       MAX(CASE WHEN m.name = 'reorder_passes' THEN CAST(m.value AS INTEGER) END) AS passes,
       MAX(CASE WHEN m.name = 'repacked_segments' THEN CAST(m.value AS INTEGER) END) AS repacked,
       printf('%.2f', MAX(CASE WHEN m.name = 'kv_chunks_per_layer' THEN m.value END))
         AS kv_chunks_per_layer
FROM metrics m JOIN runs r USING (run_id)
GROUP BY r.run_id
ORDER BY r.system;

SELECT system, kind, transfers, printf('%.1f', bytes / 1048576.0) AS mib
FROM io_breakdown
WHERE purpose = 'reorder'
ORDER BY system, kind;

-- The requests' own SSD reads (probe, demand and prefetch; not the repacks) per measured request.
SELECT s.system,
       s.requests,
       printf('%.2f', 1000 * s.mean_ttft_s) AS mean_ttft_ms,
       printf('%.2f', 1000 * s.mean_io_stall_s) AS io_stall_ms,
       printf('%.1f', (SELECT SUM(t.bytes) FROM transfers t
                       JOIN measured_requests m USING (run_id, request_id)
                       WHERE t.run_id = s.run_id AND t.kind = 'ssd_read'
                         AND t.purpose IN ('probe', 'demand', 'prefetch'))
                      / s.requests / 1048576.0) AS request_ssd_read_mib
FROM run_summary s
ORDER BY s.system;

-- Each repack and why: the reuses measured since the segment was stored, the chunks their
-- layers touched stored and packed by the history before each, the rent those reuses paid
-- (core/reorderer.h) and the repack's SSD bytes, which the rent reached.
.width 10 110
SELECT d.request_id, d.detail FROM decisions d JOIN runs r USING (run_id)
WHERE r.system = 'ablation_ro' AND d.kind = 'reorder'
ORDER BY d.request_id, d.detail;
