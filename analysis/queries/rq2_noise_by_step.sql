-- RQ2 noise-to-signal per parameter-sync step and suspect node: ||g_s - g_h|| / ||g_h|| over all parameters
--
-- From parameter-sync replays (grad_noise, name '*'): each step started from the golden
-- parameters, so the ratio is one step's gradient noise. One row per (pair, replay, rank, step).
WITH

nodes AS (
    -- node labels of the pair's two runs (their lowest rank, as pairs records them)
    SELECT
        p.pair_id,
        (SELECT min(node_label) FROM runs WHERE run_id = p.golden_run_id) AS golden_node,
        (SELECT min(node_label) FROM runs WHERE run_id = p.suspect_run_id) AS suspect_node
    FROM pairs AS p
),

overall AS (
    SELECT pair_id, replay_run_id, rank, step, diff_l2, golden_l2, ratio
    FROM grad_noise
    WHERE name = '*'
)

SELECT n.suspect_node AS node_label, o.*
FROM overall AS o
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, o.pair_id, o.rank, o.step, o.replay_run_id
