-- RQ3 every loss spike of either run, with both runs' loss at that step
--
-- From loss_spikes (rule in analysis/SCHEMA.md: not finite, or above 1.5x the median of
-- the previous 10 steps) and loss. One row per (pair, rank, step, side); node_label is the
-- node whose run spiked.
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

spikes AS (
    SELECT pair_id, rank, step, side, loss, baseline, ratio
    FROM loss_spikes
)

SELECT
    CASE s.side WHEN 'golden' THEN n.golden_node ELSE n.suspect_node END AS node_label,
    s.pair_id,
    s.rank,
    s.step,
    s.side,
    s.loss,
    s.baseline,
    s.ratio,
    l.golden_loss,
    l.suspect_loss
FROM spikes AS s
JOIN nodes AS n USING (pair_id)
LEFT JOIN loss AS l USING (pair_id, rank, step)
ORDER BY node_label, s.pair_id, s.rank, s.step, s.side
