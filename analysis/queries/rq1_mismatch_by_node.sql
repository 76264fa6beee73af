-- RQ1 per suspect node: how often its submodule results differ from the healthy node's, and by how much
--
-- From lockstep replays (site_mismatch): every site call ran on golden inputs, so each
-- difference is that submodule's own error. One row per pair.
--   calls              site calls compared (step x microbatch x site x phase)
--   mismatching_calls  calls with at least one differing element; call_rate = their share
--   frequency          mismatch frequency: differing elements / compared elements, over all calls
--   severity           mismatch severity: mean over the mismatching calls of each call's mean
--                      relative difference of its differing elements
--   max_rel            the largest relative difference of any element
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

per_pair AS (
    SELECT
        pair_id,
        count(*) AS calls,
        count(*) FILTER (WHERE mismatched > 0) AS mismatching_calls,
        sum(elements)::BIGINT AS elements,
        sum(mismatched)::BIGINT AS mismatched,
        avg(severity) FILTER (WHERE mismatched > 0) AS severity,
        max(max_rel) AS max_rel
    FROM site_mismatch
    GROUP BY pair_id
)

SELECT
    n.suspect_node AS node_label,
    c.pair_id,
    c.calls,
    c.mismatching_calls,
    c.mismatching_calls / c.calls AS call_rate,
    c.elements,
    c.mismatched,
    c.mismatched / nullif(c.elements, 0) AS frequency,
    c.severity,
    c.max_rel
FROM per_pair AS c
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, c.pair_id
