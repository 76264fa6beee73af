-- RQ2 noise-to-signal per suspect node: typical and worst step, and the parameter that was noisiest then
--
-- From parameter-sync replays (grad_noise). One row per pair.
--   steps, noisy_steps          parameter-sync steps, and those whose gradient differed at all
--   mean_ratio, median_ratio    over the steps (name '*')
--   worst_ratio, worst_step     the largest ratio and its (earliest) step
--   worst_parameter, worst_parameter_ratio   at the worst step, the parameter with the largest ratio
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

overall AS (
    SELECT pair_id, rank, step, ratio
    FROM grad_noise
    WHERE name = '*'
),

per_pair AS (
    SELECT
        pair_id,
        count(*) AS steps,
        count(*) FILTER (WHERE ratio > 0) AS noisy_steps,
        avg(ratio) AS mean_ratio,
        median(ratio) AS median_ratio,
        max(ratio) AS worst_ratio
    FROM overall
    GROUP BY pair_id
),

worst_step AS (
    SELECT o.pair_id, min(o.step) AS worst_step
    FROM overall AS o
    JOIN per_pair AS p ON p.pair_id = o.pair_id AND o.ratio = p.worst_ratio
    GROUP BY o.pair_id
),

worst_parameter AS (
    SELECT g.pair_id, g.name AS worst_parameter, g.ratio AS worst_parameter_ratio
    FROM grad_noise AS g
    JOIN worst_step AS w ON w.pair_id = g.pair_id AND w.worst_step = g.step
    WHERE g.name <> '*'
    QUALIFY row_number() OVER (PARTITION BY g.pair_id ORDER BY g.ratio DESC, g.name) = 1
)

SELECT
    n.suspect_node AS node_label,
    p.pair_id,
    p.steps,
    p.noisy_steps,
    p.mean_ratio,
    p.median_ratio,
    p.worst_ratio,
    w.worst_step,
    wp.worst_parameter,
    wp.worst_parameter_ratio
FROM per_pair AS p
JOIN nodes AS n USING (pair_id)
LEFT JOIN worst_step AS w USING (pair_id)
LEFT JOIN worst_parameter AS wp USING (pair_id)
ORDER BY node_label, p.pair_id
