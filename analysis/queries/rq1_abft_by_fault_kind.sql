-- RQ1 detection of injected faults by fault kind: the share ABFT flagged, and the share fingerprints saw
--
-- From the fault ground truth (faults: every corruption the emulator logged, on either
-- side of a pair). One row per (pair, side, kind); node_label is the node whose log holds them.
--   faults                          injected faults
--   abft_checked, abft_flagged      faults in an op call ABFT checked, and those it flagged;
--   abft_rate                       abft_flagged / abft_checked (the detection rate)
--   fingerprint_compared, fingerprint_detected, fingerprint_rate   the same for the traced
--                                   site's fingerprint (faults outside traced sites are not compared)
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

by_kind AS (
    SELECT
        pair_id,
        side,
        kind,
        count(*) AS faults,
        count(abft_flagged) AS abft_checked,
        count(*) FILTER (WHERE abft_flagged) AS abft_flagged,
        count(fingerprint_detected) AS fingerprint_compared,
        count(*) FILTER (WHERE fingerprint_detected) AS fingerprint_detected
    FROM faults
    GROUP BY pair_id, side, kind
)

SELECT
    CASE k.side WHEN 'golden' THEN n.golden_node ELSE n.suspect_node END AS node_label,
    k.pair_id,
    k.side,
    k.kind,
    k.faults,
    k.abft_checked,
    k.abft_flagged,
    k.abft_flagged / nullif(k.abft_checked, 0) AS abft_rate,
    k.fingerprint_compared,
    k.fingerprint_detected,
    k.fingerprint_detected / nullif(k.fingerprint_compared, 0) AS fingerprint_rate
FROM by_kind AS k
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, k.pair_id, k.side, k.kind
