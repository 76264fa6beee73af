-- RQ1 per unhealthy node of a fleet: mismatch frequency and severity, bursts (Fano factor), heavy tail, ABFT recall
--
-- From lockstep replays (site_mismatch) and the fault ground truth (faults, suspect side),
-- one row per pair whose suspect was emulated with a fault profile other than healthy-node.
--   profile                         the suspect's fault profile (runs.extra)
--   steps_replayed, steps_mismatching   lockstep steps, and those with any differing site call
--   site_calls, mismatching_calls   site calls compared, and those with a differing element
--   frequency                       mismatched elements / compared elements, over every call
--   max_frequency                   the largest frequency of one call
--   median_severity                 median over mismatching calls of their mean relative difference
--   max_rel                         the largest relative difference of one element
--   fano                            variance / mean of the per-step count of mismatching calls over the
--                                   replayed steps (null: no mismatch); one fault mismatches several calls
--                                   (a site's output and its input gradient), so this exceeds 1 without bursts
--   faults_in_window, fault_steps   faults the emulator injected into the recorded run at the replayed steps,
--                                   and the replayed steps with at least one
--   fault_fano                      variance (population) / mean of the per-step count of injected faults over
--                                   the replayed steps, steps without a fault counted as 0 (null: none); a
--                                   steady Poisson rate gives about 1 (the burstiness rule, analysis/reproduction_rules.py)
--   faults                          corruptions the emulator injected into the recorded run
--   faults_outside_matmul           those in an op no ABFT check covered (softmax, norms, elementwise, ...)
--   faults_below_bound              those in a checked matmul that ABFT did not flag (below its bound)
--   abft_flagged, abft_recall       faults ABFT flagged, and their share of all faults (null: no fault)
-- The injected ground truth beside the measured numbers (the reproduction table's recovery columns), from the
-- fault events' original and corrupted values at the replayed steps:
--   injected_median_rel             median over those faults of the mean relative change of the elements each
--                                   changed (|corrupted - original| / |original|; NaN or Inf written: Inf)
--   injected_max_rel                the largest relative change of one injected element (Inf: NaN or Inf written)
--   faults_traced, faults_detected  faults at the replayed steps in a traced site, and those whose site's
--                                   fingerprint differs (the tool saw them)
WITH

nodes AS (
    SELECT
        n.pair_id,
        n.suspect_node,
        json_extract_string(r.extra, '$.fault_profile.name') AS profile
    FROM pair_nodes AS n
    JOIN pairs AS p USING (pair_id)
    JOIN runs AS r ON r.run_id = p.suspect_run_id AND r.rank = 0
    WHERE n.role = 'train'
),

unhealthy AS (
    SELECT * FROM nodes WHERE profile IS NOT NULL AND profile <> 'healthy-node'
),

per_step AS (
    SELECT
        pair_id,
        step,
        count(*) AS calls,
        count(*) FILTER (WHERE mismatched > 0) AS mismatching
    FROM site_mismatch
    GROUP BY pair_id, step
),

steps AS (
    SELECT
        pair_id,
        count(*) AS steps_replayed,
        count(*) FILTER (WHERE mismatching > 0) AS steps_mismatching,
        CASE WHEN avg(mismatching) > 0 THEN var_pop(mismatching) / avg(mismatching) END AS fano
    FROM per_step
    GROUP BY pair_id
),

calls AS (
    SELECT
        pair_id,
        count(*) AS site_calls,
        count(*) FILTER (WHERE mismatched > 0) AS mismatching_calls,
        sum(mismatched) / sum(elements) AS frequency,
        max(frequency) AS max_frequency,
        median(severity) FILTER (WHERE mismatched > 0) AS median_severity,
        max(max_rel) AS max_rel
    FROM site_mismatch
    GROUP BY pair_id
),

fault_counts AS (
    SELECT pair_id, step, count(*) AS faults
    FROM faults
    WHERE side = 'suspect'
    GROUP BY pair_id, step
),

fault_steps AS (
    SELECT
        s.pair_id,
        sum(coalesce(f.faults, 0)) AS faults_in_window,
        count(*) FILTER (WHERE f.faults > 0) AS fault_steps,
        CASE WHEN avg(coalesce(f.faults, 0)) > 0
            THEN var_pop(coalesce(f.faults, 0)) / avg(coalesce(f.faults, 0)) END AS fault_fano
    FROM per_step AS s
    LEFT JOIN fault_counts AS f USING (pair_id, step)
    GROUP BY s.pair_id
),

window_faults AS (
    SELECT f.*
    FROM faults AS f
    JOIN per_step AS s ON s.pair_id = f.pair_id AND s.step = f.step
    WHERE f.side = 'suspect'
),

elements AS (
    SELECT pair_id, segment, "offset", unnest(original) AS o, unnest(corrupted) AS c
    FROM window_faults
),

changes AS (
    SELECT
        pair_id,
        segment,
        "offset",
        CASE WHEN isnan(c) OR isinf(c) THEN 'inf'::DOUBLE ELSE abs(c - o) / nullif(abs(o), 0) END AS rel
    FROM elements
    WHERE c IS DISTINCT FROM o AND NOT (isnan(c) AND isnan(o))
),

per_fault AS (
    SELECT pair_id, segment, "offset", avg(rel) AS mean_rel, max(rel) AS max_rel
    FROM changes
    GROUP BY pair_id, segment, "offset"
),

truth AS (
    SELECT
        w.pair_id,
        median(pf.mean_rel) AS injected_median_rel,
        max(pf.max_rel) AS injected_max_rel,
        count(*) FILTER (WHERE w.fingerprint_detected IS NOT NULL) AS faults_traced,
        count(*) FILTER (WHERE w.fingerprint_detected) AS faults_detected
    FROM window_faults AS w
    LEFT JOIN per_fault AS pf USING (pair_id, segment, "offset")
    GROUP BY w.pair_id
),

injected AS (
    SELECT
        pair_id,
        count(*) AS faults,
        count(*) FILTER (WHERE abft_flagged IS NULL) AS faults_outside_matmul,
        count(*) FILTER (WHERE NOT abft_flagged) AS faults_below_bound,
        count(*) FILTER (WHERE abft_flagged) AS abft_flagged
    FROM faults
    WHERE side = 'suspect'
    GROUP BY pair_id
)

SELECT
    u.suspect_node AS node_label,
    u.pair_id,
    u.profile,
    s.steps_replayed,
    s.steps_mismatching,
    c.site_calls,
    c.mismatching_calls,
    c.frequency,
    c.max_frequency,
    c.median_severity,
    c.max_rel,
    s.fano,
    fs.faults_in_window,
    fs.fault_steps,
    fs.fault_fano,
    coalesce(i.faults, 0) AS faults,
    coalesce(i.faults_outside_matmul, 0) AS faults_outside_matmul,
    coalesce(i.faults_below_bound, 0) AS faults_below_bound,
    coalesce(i.abft_flagged, 0) AS abft_flagged,
    i.abft_flagged / nullif(i.faults, 0) AS abft_recall,
    t.injected_median_rel,
    t.injected_max_rel,
    coalesce(t.faults_traced, 0) AS faults_traced,
    coalesce(t.faults_detected, 0) AS faults_detected
FROM unhealthy AS u
JOIN steps AS s USING (pair_id)
JOIN calls AS c USING (pair_id)
JOIN fault_steps AS fs USING (pair_id)
LEFT JOIN injected AS i USING (pair_id)
LEFT JOIN truth AS t USING (pair_id)
ORDER BY node_label, u.pair_id
