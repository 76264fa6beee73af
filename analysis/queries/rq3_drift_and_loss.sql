-- RQ3 per step: golden and suspect loss, their difference, parameter drift and loss spikes
--
-- From loss, param_drift (group '*') and loss_spikes, one row per (pair, rank, step) that
-- either holds. drift is ||theta_s - theta_h|| / ||theta_h|| of the state before the step,
-- so it sits beside the loss that state produced; it is null at steps without a checkpoint
-- in both runs.
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

drift AS (
    SELECT pair_id, rank, step, drift
    FROM param_drift
    WHERE "group" = '*'
),

spikes AS (
    SELECT
        pair_id,
        rank,
        step,
        bool_or(side = 'golden') AS golden_spike,
        bool_or(side = 'suspect') AS suspect_spike
    FROM loss_spikes
    GROUP BY pair_id, rank, step
),

steps AS (
    SELECT pair_id, rank, step FROM loss
    UNION
    SELECT pair_id, rank, step FROM drift
)

SELECT
    n.suspect_node AS node_label,
    s.pair_id,
    s.rank,
    s.step,
    l.golden_loss,
    l.suspect_loss,
    l.diff AS loss_diff,
    l.rel_diff AS loss_rel_diff,
    d.drift,
    coalesce(k.golden_spike, false) AS golden_spike,
    coalesce(k.suspect_spike, false) AS suspect_spike
FROM steps AS s
JOIN nodes AS n USING (pair_id)
LEFT JOIN loss AS l USING (pair_id, rank, step)
LEFT JOIN drift AS d USING (pair_id, rank, step)
LEFT JOIN spikes AS k USING (pair_id, rank, step)
ORDER BY node_label, s.pair_id, s.rank, s.step
