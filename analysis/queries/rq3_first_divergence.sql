-- RQ3 first divergence per pair and rank: where the suspect's trace first left the golden one
--
-- From pair_ranks and first_divergence; a rank that never diverged has nulls from step on.
--   compared_through   last step both runs hold (later steps are not compared)
--   step, microbatch, name, phase, status   the earliest differing record, in execution order
--   l2_rel_diff        |suspect_l2 - golden_l2| / golden_l2 of that record
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

ranks AS (
    SELECT pair_id, rank, compared_through
    FROM pair_ranks
)

SELECT
    n.suspect_node AS node_label,
    n.golden_node,
    r.pair_id,
    r.rank,
    r.compared_through,
    f.step,
    f.microbatch,
    f.name,
    f.phase,
    f.status,
    f.golden_l2,
    f.suspect_l2,
    abs(f.suspect_l2::DOUBLE - f.golden_l2) / nullif(f.golden_l2, 0) AS l2_rel_diff
FROM ranks AS r
JOIN nodes AS n USING (pair_id)
LEFT JOIN first_divergence AS f USING (pair_id, rank)
ORDER BY node_label, r.pair_id, r.rank
