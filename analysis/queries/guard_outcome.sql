-- What guarding changed: a node with and without the guard (flags, recomputes, overhead, loss spikes, drift, fine-tuned accuracy)
--
-- One row per guarded recording (a suspect whose node label is <node>-guarded, as a study
-- writes it) next to <node> unguarded; both diffed against the same golden run.
--   flagged, recomputed   steps the guard flagged; steps it ran again (runs - 1 re-runs each: reruns)
--   transient ... skipped  outcomes and skipped steps (guard_decisions)
--   faulty_flagged        flagged steps whose first run had a fault event
--   step_s, guarded_step_s  median step wall time of the unguarded and guarded runs' unflagged steps;
--                         overhead = their ratio - 1 (two recordings at different times: noisy)
--   spikes, guarded_spikes  suspect loss spikes (loss_spikes) of each run
--   drift, guarded_drift  parameter drift against golden at the last common checkpoint (group '*')
--   accuracy, guarded_accuracy  mean final fine-tuned test accuracy over tasks (null: not fine-tuned)
WITH

nodes AS (
    SELECT pair_id, suspect_node, role FROM pair_nodes
),

guarded AS (
    SELECT g.pair_id AS guarded_pair, g.suspect_node AS guarded_node, u.pair_id AS pair_id,
           u.suspect_node AS node_label
    FROM nodes AS g
    JOIN nodes AS u ON u.suspect_node || '-guarded' = g.suspect_node AND u.role = g.role
    WHERE g.role = 'train'
),

decisions AS (
    SELECT
        pair_id,
        count(*) AS flagged,
        count(*) FILTER (WHERE runs > 1) AS recomputed,
        sum(runs - 1)::BIGINT AS reruns,
        count(*) FILTER (WHERE outcome = 'transient') AS transient,
        count(*) FILTER (WHERE outcome = 'deterministic') AS deterministic,
        count(*) FILTER (WHERE outcome = 'unresolved') AS unresolved,
        count(*) FILTER (WHERE action = 'skip') AS skipped,
        count(*) FILTER (WHERE first_run_faults > 0) AS faulty_flagged
    FROM guard_decisions
    GROUP BY pair_id
),

walls AS (
    SELECT a.pair_id, median(a.wall_s) AS step_s, count(*) AS steps
    FROM detector_alarms AS a
    LEFT JOIN guard_decisions AS d USING (pair_id, rank, step)
    WHERE a.detector = 'guard' AND d.step IS NULL
    GROUP BY a.pair_id
),

spikes AS (
    SELECT pair_id, count(*) AS spikes FROM loss_spikes WHERE side = 'suspect' GROUP BY pair_id
),

drift AS (
    SELECT pair_id, arg_max(drift, step) AS drift
    FROM param_drift
    WHERE "group" = '*'
    GROUP BY pair_id
),

finetuned AS (
    SELECT r.node_label, avg(e.accuracy) AS accuracy
    FROM finetune_eval AS e
    JOIN (SELECT run_id, max(step) AS step FROM finetune_eval GROUP BY run_id) AS last USING (run_id, step)
    JOIN runs AS r ON r.run_id = e.run_id AND r.rank = e.rank AND r.role = 'finetune'
    GROUP BY r.node_label
)

SELECT
    g.node_label,
    g.guarded_node,
    w.steps + coalesce(d.flagged, 0) AS steps,
    coalesce(d.flagged, 0) AS flagged,
    coalesce(d.recomputed, 0) AS recomputed,
    coalesce(d.reruns, 0) AS reruns,
    coalesce(d.transient, 0) AS transient,
    coalesce(d.deterministic, 0) AS deterministic,
    coalesce(d.unresolved, 0) AS unresolved,
    coalesce(d.skipped, 0) AS skipped,
    coalesce(d.faulty_flagged, 0) AS faulty_flagged,
    uw.step_s,
    w.step_s AS guarded_step_s,
    w.step_s / nullif(uw.step_s, 0) - 1 AS overhead,
    coalesce(us.spikes, 0) AS spikes,
    coalesce(s.spikes, 0) AS guarded_spikes,
    ud.drift,
    gd.drift AS guarded_drift,
    uf.accuracy,
    f.accuracy AS guarded_accuracy
FROM guarded AS g
LEFT JOIN decisions AS d ON d.pair_id = g.guarded_pair
LEFT JOIN walls AS w ON w.pair_id = g.guarded_pair
LEFT JOIN walls AS uw ON uw.pair_id = g.pair_id
LEFT JOIN spikes AS s ON s.pair_id = g.guarded_pair
LEFT JOIN spikes AS us ON us.pair_id = g.pair_id
LEFT JOIN drift AS gd ON gd.pair_id = g.guarded_pair
LEFT JOIN drift AS ud ON ud.pair_id = g.pair_id
LEFT JOIN finetuned AS f ON f.node_label = g.guarded_node
LEFT JOIN finetuned AS uf ON uf.node_label = g.node_label
ORDER BY g.node_label, g.guarded_node
