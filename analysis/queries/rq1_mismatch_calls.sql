-- RQ1 every lockstep site call whose result differed, one row each (the severity distribution)
--
-- From lockstep replays (site_mismatch), calls with at least one differing element.
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

mismatching AS (
    SELECT pair_id, replay_run_id, rank, step, microbatch, site, phase, elements, mismatched, frequency,
           severity, max_rel
    FROM site_mismatch
    WHERE mismatched > 0
)

SELECT n.suspect_node AS node_label, m.*
FROM mismatching AS m
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, m.pair_id, m.rank, m.step, m.microbatch, m.site, m.phase, m.replay_run_id
