-- RQ1 detectors scored against the injected faults: recall and precision of fingerprints and ABFT per node
--
-- From detection_scores (rules in analysis/SCHEMA.md), summed over ranks. One row per
-- (pair, detector, side); node_label is the node that ran the detector (the suspect for
-- fingerprints, which compare both runs).
--   recall      tp / (tp + fn): faulted units the detector caught
--   precision   tp / (tp + fp): flagged units a fault explains
--   propagated  fingerprint units that differ downstream of a fault (neither tp nor fp)
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

scores AS (
    SELECT
        pair_id,
        detector,
        side,
        sum(units)::BIGINT AS units,
        sum(tp)::BIGINT AS tp,
        sum(fp)::BIGINT AS fp,
        sum(fn)::BIGINT AS fn,
        sum(tn)::BIGINT AS tn,
        sum(propagated)::BIGINT AS propagated
    FROM detection_scores
    GROUP BY pair_id, detector, side
)

SELECT
    CASE s.side WHEN 'golden' THEN n.golden_node ELSE n.suspect_node END AS node_label,
    s.pair_id,
    s.detector,
    s.side,
    s.units,
    s.tp,
    s.fp,
    s.fn,
    s.tn,
    s.propagated,
    s.tp / nullif(s.tp + s.fn, 0) AS recall,
    s.tp / nullif(s.tp + s.fp, 0) AS precision
FROM scores AS s
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, s.pair_id, s.detector, s.side
