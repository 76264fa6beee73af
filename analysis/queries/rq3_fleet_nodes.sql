-- RQ3 per pretraining pair of a fleet: how far the loss curves part, how far the parameters drift, and loss spikes
--
-- From loss, loss_spikes and param_drift (group '*'), one row per pretraining pair.
--   kind                        fleet (a fault profile), healthy (healthy-node), trigger (trigger-ulp)
--                               or baseline (the golden run's shuffle-seed twin)
--   faults                      corruptions the emulator injected into the suspect run
--   steps                       steps with both losses
--   mean_abs_loss_diff, max_abs_loss_diff   |suspect loss - golden loss| / |golden loss|, over those steps
--   suspect_spikes              steps the suspect's loss spiked (rule in analysis/SCHEMA.md)
--   final_step, final_drift     the last checkpoint both runs hold, and ||theta_s - theta_h|| / ||theta_h|| there
WITH

nodes AS (
    SELECT
        n.pair_id,
        n.suspect_node,
        json_extract_string(r.extra, '$.fault_profile.name') AS profile,
        coalesce(p.baseline, false) AS baseline
    FROM pair_nodes AS n
    JOIN pairs AS p USING (pair_id)
    JOIN runs AS r ON r.run_id = p.suspect_run_id AND r.rank = 0
    WHERE n.role = 'train'
),

losses AS (
    SELECT
        pair_id,
        count(*) AS steps,
        avg(abs(rel_diff)) AS mean_abs_loss_diff,
        max(abs(rel_diff)) AS max_abs_loss_diff
    FROM loss
    WHERE golden_loss IS NOT NULL AND suspect_loss IS NOT NULL
    GROUP BY pair_id
),

spikes AS (
    SELECT pair_id, count(DISTINCT step) AS suspect_spikes FROM loss_spikes WHERE side = 'suspect' GROUP BY pair_id
),

drift AS (
    SELECT pair_id, max(step) AS final_step, arg_max(drift, step) AS final_drift
    FROM param_drift
    WHERE "group" = '*'
    GROUP BY pair_id
),

injected AS (
    SELECT pair_id, count(*) AS faults FROM faults WHERE side = 'suspect' GROUP BY pair_id
)

SELECT
    n.suspect_node AS node_label,
    n.pair_id,
    n.profile,
    CASE
        WHEN n.baseline THEN 'baseline'
        WHEN n.profile = 'healthy-node' THEN 'healthy'
        WHEN n.profile = 'trigger-ulp' THEN 'trigger'
        ELSE 'fleet'
    END AS kind,
    coalesce(i.faults, 0) AS faults,
    l.steps,
    l.mean_abs_loss_diff,
    l.max_abs_loss_diff,
    coalesce(s.suspect_spikes, 0) AS suspect_spikes,
    d.final_step,
    d.final_drift
FROM nodes AS n
LEFT JOIN losses AS l USING (pair_id)
LEFT JOIN spikes AS s USING (pair_id)
LEFT JOIN drift AS d USING (pair_id)
LEFT JOIN injected AS i USING (pair_id)
WHERE n.baseline OR n.profile IS NOT NULL
ORDER BY kind, node_label, n.pair_id
