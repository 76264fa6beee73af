-- RQ2 per unhealthy node of a fleet: the worst and the typical per-step gradient noise-to-signal
--
-- From parameter-sync replays (grad_noise, name '*'), one row per pair whose suspect was
-- emulated with a fault profile other than healthy-node.
--   profile                     the suspect's fault profile (runs.extra)
--   steps, noisy_steps          parameter-sync steps, and those whose gradient differed at all
--   median_ratio, worst_ratio   over the steps; worst_step is the (earliest) worst one
--   faults                      corruptions the emulator injected into the recorded run
WITH

nodes AS (
    SELECT
        n.pair_id,
        n.suspect_node,
        json_extract_string(r.extra, '$.fault_profile.name') AS profile
    FROM pair_nodes AS n
    JOIN pairs AS p USING (pair_id)
    JOIN runs AS r ON r.run_id = p.suspect_run_id AND r.rank = 0
    WHERE n.role = 'train'
),

unhealthy AS (
    SELECT * FROM nodes WHERE profile IS NOT NULL AND profile <> 'healthy-node'
),

overall AS (
    SELECT pair_id, step, ratio FROM grad_noise WHERE name = '*'
),

per_pair AS (
    SELECT
        pair_id,
        count(*) AS steps,
        count(*) FILTER (WHERE ratio > 0) AS noisy_steps,
        median(ratio) AS median_ratio,
        max(ratio) AS worst_ratio,
        arg_min(step, [-ratio, step]) AS worst_step
    FROM overall
    GROUP BY pair_id
),

injected AS (
    SELECT pair_id, count(*) AS faults FROM faults WHERE side = 'suspect' GROUP BY pair_id
)

SELECT
    u.suspect_node AS node_label,
    u.pair_id,
    u.profile,
    p.steps,
    p.noisy_steps,
    p.median_ratio,
    p.worst_ratio,
    p.worst_step,
    coalesce(i.faults, 0) AS faults
FROM unhealthy AS u
JOIN per_pair AS p USING (pair_id)
LEFT JOIN injected AS i USING (pair_id)
ORDER BY node_label, u.pair_id
