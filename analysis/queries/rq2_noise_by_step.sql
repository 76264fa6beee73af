-- RQ2 noise-to-signal per parameter-sync step and suspect node: ||g_s - g_h|| / ||g_h|| over all parameters
--
-- From parameter-sync replays (grad_noise, name '*'): each step started from the golden
-- parameters, so the ratio is one step's gradient noise. One row per (pair, replay, rank, step).
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
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
