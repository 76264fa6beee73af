-- The guard's detectors scored against the injected faults: recall (all and harmful faults), precision, false alarms
--
-- From detector_alarms (each detector run offline over the suspect's steps; rules in
-- docs/guard.md "Scoring the detectors"), with loss and grad_noise for harm. One row per
-- (pair, detector); detector 'guard' is the guard's default combination. A step is
-- faulty when the run the detectors saw has a fault event, harmful when it is faulty
-- and its param-sync noise-to-signal (name '*') exceeds 0.01 or its loss differs from
-- the golden run's by more than 10 %.
--   true_alarms    fired on a faulty step
--   false_alarms   fired on a clean step before the run's first faulty step (nothing injected explains it)
--   propagated     fired on a clean step from the first faulty step on (a fault's aftermath: neither)
--   recall         true_alarms / faulty_steps; harmful_recall: harmful steps caught / harmful_steps
--   precision      true_alarms / (true_alarms + false_alarms)
--   false_per_100  false alarms per 100 checked steps (on a healthy twin: its false-alarm rate)
WITH

nodes AS (
    SELECT pair_id, suspect_node FROM pair_nodes WHERE role = 'train'   -- pretraining pairs, not fine-tunes
),

noise AS (
    SELECT p.pair_id, g.rank, g.step, max(g.ratio) AS noise
    FROM grad_noise AS g
    JOIN pairs AS p ON list_contains(p.replay_run_ids, g.replay_run_id)
    WHERE g.name = '*'
    GROUP BY p.pair_id, g.rank, g.step
),

steps AS (
    SELECT
        a.pair_id,
        a.rank,
        a.step,
        a.detector,
        a.fired,
        a.faults > 0 AS faulty,
        a.faults > 0 AND (
            coalesce(n.noise, 0) > 0.01
            OR coalesce(abs(a.loss - l.golden_loss) / nullif(abs(l.golden_loss), 0), 0) > 0.1
            OR NOT isfinite(coalesce(a.loss, 0))
        ) AS harmful,
        a.step >= min(CASE WHEN a.faults > 0 THEN a.step END) OVER (PARTITION BY a.pair_id, a.rank, a.detector)
            AS after_fault
    FROM detector_alarms AS a
    LEFT JOIN noise AS n USING (pair_id, rank, step)
    LEFT JOIN loss AS l USING (pair_id, rank, step)
),

scores AS (
    SELECT
        pair_id,
        detector,
        count(*) AS checked_steps,
        count(*) FILTER (WHERE faulty) AS faulty_steps,
        count(*) FILTER (WHERE harmful) AS harmful_steps,
        count(*) FILTER (WHERE fired) AS alarms,
        count(*) FILTER (WHERE fired AND faulty) AS true_alarms,
        count(*) FILTER (WHERE fired AND NOT faulty AND after_fault IS NOT TRUE) AS false_alarms,
        count(*) FILTER (WHERE fired AND NOT faulty AND after_fault) AS propagated,
        count(*) FILTER (WHERE fired AND harmful) AS harmful_caught
    FROM steps
    GROUP BY pair_id, detector
)

SELECT
    n.suspect_node AS node_label,
    s.pair_id,
    s.detector,
    s.checked_steps,
    s.faulty_steps,
    s.harmful_steps,
    s.alarms,
    s.true_alarms,
    s.false_alarms,
    s.propagated,
    s.true_alarms / nullif(s.faulty_steps, 0) AS recall,
    s.harmful_caught / nullif(s.harmful_steps, 0) AS harmful_recall,
    s.true_alarms / nullif(s.true_alarms + s.false_alarms, 0) AS precision,
    100.0 * s.false_alarms / nullif(s.checked_steps, 0) AS false_per_100
FROM scores AS s
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, s.pair_id, s.detector
