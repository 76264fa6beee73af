-- RQ3 over the fleet: spread of unhealthy nodes' drift rates and SDC rates, the baseline's and the trigger's rate
--
-- One row per golden run with pretraining pairs, named by the golden's node_label. Unhealthy nodes: the golden run's pairs that
-- are neither its baseline pair nor the trigger node (node_label 'trigger-ulp'), with at least
-- one injected fault and a measurable drift rate (at least 3 points in the growth window,
-- drift_rates). For them: min, median and max drift rate and the max/min ratio; the same for
-- their SDC rates, with log10 of that ratio (orders of magnitude). baseline_rate is the baseline
-- pair's drift rate, trigger_rate the trigger node's, and trigger_over_median the trigger's rate
-- over the unhealthy nodes' median.
WITH

rates AS (
    SELECT * FROM drift_rates
),

unhealthy AS (
    SELECT golden_run_id, drift_rate, sdc_rate
    FROM rates
    WHERE NOT baseline AND node_label IS DISTINCT FROM 'trigger-ulp' AND faults > 0 AND points >= 3
),

spread AS (
    SELECT
        golden_run_id,
        count(*) AS nodes,
        min(drift_rate) AS min_rate,
        median(drift_rate) AS median_rate,
        max(drift_rate) AS max_rate,
        min(sdc_rate) AS min_sdc_rate,
        median(sdc_rate) AS median_sdc_rate,
        max(sdc_rate) AS max_sdc_rate
    FROM unhealthy
    GROUP BY golden_run_id
),

references_ AS (
    SELECT
        golden_run_id,
        avg(drift_rate) FILTER (WHERE baseline) AS baseline_rate,
        avg(drift_rate) FILTER (WHERE NOT baseline AND node_label = 'trigger-ulp') AS trigger_rate
    FROM rates
    GROUP BY golden_run_id
)

SELECT
    (SELECT min(node_label) FROM runs WHERE run_id = r.golden_run_id) AS node_label,
    r.golden_run_id,
    coalesce(s.nodes, 0) AS nodes,
    s.min_rate,
    s.median_rate,
    s.max_rate,
    s.max_rate / nullif(s.min_rate, 0) AS rate_ratio,
    s.min_sdc_rate,
    s.median_sdc_rate,
    s.max_sdc_rate,
    s.max_sdc_rate / nullif(s.min_sdc_rate, 0) AS sdc_rate_ratio,
    log10(s.max_sdc_rate / nullif(s.min_sdc_rate, 0)) AS sdc_rate_decades,
    r.baseline_rate,
    r.trigger_rate,
    r.trigger_rate / nullif(s.median_rate, 0) AS trigger_over_median
FROM references_ AS r
LEFT JOIN spread AS s USING (golden_run_id)
ORDER BY node_label, r.golden_run_id
