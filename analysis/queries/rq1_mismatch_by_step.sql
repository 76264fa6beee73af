-- RQ1 per suspect node and replayed step: mismatch frequency and severity over time
--
-- From lockstep replays (site_mismatch); columns as in rq1_mismatch_by_node, one row per
-- (pair, step) replayed, including steps where nothing differed.
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

per_step AS (
    SELECT
        pair_id,
        step,
        count(*) AS calls,
        count(*) FILTER (WHERE mismatched > 0) AS mismatching_calls,
        sum(elements)::BIGINT AS elements,
        sum(mismatched)::BIGINT AS mismatched,
        avg(severity) FILTER (WHERE mismatched > 0) AS severity,
        max(max_rel) AS max_rel
    FROM site_mismatch
    GROUP BY pair_id, step
)

SELECT
    n.suspect_node AS node_label,
    c.pair_id,
    c.step,
    c.calls,
    c.mismatching_calls,
    c.mismatching_calls / c.calls AS call_rate,
    c.elements,
    c.mismatched,
    c.mismatched / nullif(c.elements, 0) AS frequency,
    c.severity,
    c.max_rel
FROM per_step AS c
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, c.pair_id, c.step
