-- RQ3 per pretraining pair: drift rate (slope of ln drift over its growth window), fit, final drift, SDC rate
--
-- From the drift_rates view (rules in SCHEMA.md, docs/drift.md). A pair's growth window runs
-- from its first checkpoint with drift > 0 up to, not including, its saturation step: the
-- first checkpoint where its drift reaches half the drift of its golden run's baseline pair
-- (`sdc diff --baseline`) at the same step. Without a baseline pair, and for the baseline pair
-- itself, the window is every checkpoint with drift > 0. drift_rate is the slope of ln(drift)
-- over steps (regr_slope; drift grows e^drift_rate-fold per step), r2 its regr_r2; fewer than
-- 2 points give null. sdc_rate is the suspect's injected faults per compared step.
WITH

rates AS (
    SELECT * FROM drift_rates
),

growth AS (
    SELECT
        pair_id,
        CASE WHEN drift_rate > 0 THEN ln(2) / drift_rate END AS doubling_steps
    FROM rates
)

SELECT
    r.node_label,
    r.pair_id,
    r.baseline,
    r.points,
    r.first_step,
    r.last_step,
    r.saturation_step,
    r.drift_rate,
    g.doubling_steps,
    r.r2,
    r.final_step,
    r.final_drift,
    r.faults,
    r.steps,
    r.sdc_rate,
    r.golden_run_id
FROM rates AS r
JOIN growth AS g USING (pair_id)
ORDER BY r.baseline, r.node_label, r.pair_id
