-- RQ3 per golden checkpoint: the golden run's sharpness beside the fleet's drift rates, lr and 2/lr
--
-- One row per `sharpness` row (rank 0's) of a run that is some pretraining pair's golden run;
-- node_label is the golden's.
-- lr is golden's learning rate in that step (loss.lr), two_over_lr = 2 / lr the edge of
-- stability of plain gradient descent (an adaptive optimizer's threshold differs: docs/drift.md).
-- local_median_rate is the median, over the golden's unhealthy nodes (not the baseline pair, not
-- 'trigger-ulp'), of (ln drift(step) - ln drift(previous checkpoint)) / (steps between), where
-- both checkpoints lie in the node's growth window (drift_curve); local_nodes counts them.
-- median_rate is the same nodes' median drift rate over their whole window (drift_rates).
WITH

goldens AS (
    SELECT DISTINCT golden_run_id AS run_id FROM drift_curve
),

sharp AS (
    SELECT s.run_id, s.step, s.value, s.iterations, s.converged, s.residual
    FROM sharpness AS s JOIN goldens USING (run_id)
    WHERE s.rank = 0
),

lrs AS (
    SELECT p.golden_run_id AS run_id, l.step, min(l.lr) AS lr
    FROM loss AS l JOIN pairs AS p USING (pair_id)
    WHERE l.rank = 0
    GROUP BY p.golden_run_id, l.step
),

fleet AS (
    SELECT *
    FROM drift_curve
    WHERE NOT baseline AND node_label IS DISTINCT FROM 'trigger-ulp'
),

steps AS (
    SELECT
        golden_run_id AS run_id,
        pair_id,
        step,
        in_window,
        ln(drift) - ln(lag(drift) OVER w) AS dlog,
        step - lag(step) OVER w AS dstep,
        lag(in_window) OVER w AS previous_in_window
    FROM fleet
    WINDOW w AS (PARTITION BY pair_id ORDER BY step)
),

local_rates AS (
    SELECT run_id, step, median(dlog / dstep) AS local_median_rate, count(*) AS local_nodes
    FROM steps
    WHERE in_window AND previous_in_window
    GROUP BY run_id, step
),

overall AS (
    SELECT golden_run_id AS run_id, median(drift_rate) AS median_rate
    FROM drift_rates
    WHERE NOT baseline AND node_label IS DISTINCT FROM 'trigger-ulp' AND faults > 0 AND points >= 3
    GROUP BY golden_run_id
)

SELECT
    (SELECT min(node_label) FROM runs WHERE run_id = s.run_id) AS node_label,
    s.run_id,
    s.step,
    s.value AS sharpness,
    s.iterations,
    s.converged,
    s.residual,
    l.lr,
    2 / l.lr AS two_over_lr,
    r.local_median_rate,
    coalesce(r.local_nodes, 0) AS local_nodes,
    o.median_rate
FROM sharp AS s
LEFT JOIN lrs AS l USING (run_id, step)
LEFT JOIN local_rates AS r USING (run_id, step)
LEFT JOIN overall AS o USING (run_id)
ORDER BY node_label, s.run_id, s.step
