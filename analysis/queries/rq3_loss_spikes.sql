-- RQ3 every loss spike of either run, with both runs' loss at that step and what could explain it
--
-- From loss_spikes (rule in analysis/SCHEMA.md: not finite, or above 1.5x the median of
-- the previous 10 steps), loss, faults and the suspect's fault profile (runs.extra). One row
-- per (pair, rank, step, side); node_label is the node whose run spiked.
--   role                 train (pretraining) or finetune: the pair's suspect role
--   kind                 fleet (a fault profile), healthy (healthy-node or no profile), trigger (trigger-ulp),
--                        baseline (one of golden's shuffle-seed twins: pretraining's, or a fine-tune's, each diffed
--                        against golden as a baseline pair) or golden (the spike is golden's own)
--   golden_spike         golden spiked at the same step of the same pair and rank
--   faults_before        the suspect's faults in the window: steps step - 5 .. step (a fault in the
--                        step's forward moves its loss, one in its backward the next steps' losses)
--   scripted_faults_before   those at a step a rule of the suspect's profile names for the pair's role
--                        (a [[fault]]'s `steps`, a [[state]] rule's `step`, whose `roles` are absent or
--                        hold the role: the destroyer's scripted spike, the trigger's flip), not drawn at random
--   scripted_from        the first such step of the pair (null: no rule scripts one): from there on the
--                        suspect's spikes are the script's, whatever else fired (the reproduction rule
--                        reports them apart and never counts them)
WITH

nodes AS (
    SELECT
        n.pair_id,
        n.golden_node,
        n.suspect_node,
        n.role,
        n.baseline,
        json_extract_string(r.extra, '$.fault_profile.name') AS profile
    FROM pair_nodes AS n
    JOIN pairs AS p USING (pair_id)
    LEFT JOIN runs AS r ON r.run_id = p.suspect_run_id AND r.rank = 0
),

suspect_profiles AS (
    SELECT p.pair_id, n.role, r.extra
    FROM pairs AS p
    JOIN pair_nodes AS n USING (pair_id)
    JOIN runs AS r ON r.run_id = p.suspect_run_id AND r.rank = 0
),

profile_rules AS (
    -- every [[fault]] and [[state]] rule of the suspect's profile that fires in the pair's role
    SELECT pair_id, body
    FROM suspect_profiles,
        unnest(json_extract(extra, '$.fault_profile.profile.fault[*]')) AS t (body)
    WHERE json_extract(body, '$.roles') IS NULL OR list_contains(json_extract_string(body, '$.roles[*]'), role)
    UNION ALL
    SELECT pair_id, body
    FROM suspect_profiles,
        unnest(json_extract(extra, '$.fault_profile.profile.state[*]')) AS t (body)
    WHERE json_extract(body, '$.roles') IS NULL OR list_contains(json_extract_string(body, '$.roles[*]'), role)
),

scripted AS (
    -- every step such a rule names: a [[fault]]'s steps, a [[state]] rule's step
    SELECT DISTINCT pair_id, CAST(s AS BIGINT) AS step
    FROM profile_rules,
        unnest(json_extract_string(body, '$.steps[*]')) AS t (s)
    UNION
    SELECT DISTINCT pair_id, CAST(json_extract_string(body, '$.step') AS BIGINT) AS step
    FROM profile_rules
    WHERE json_extract_string(body, '$.step') IS NOT NULL
),

scripted_from AS (
    SELECT pair_id, min(step) AS scripted_from FROM scripted GROUP BY pair_id
),

suspect_faults AS (
    SELECT f.pair_id, f.rank, f.step, sc.step IS NOT NULL AS scripted
    FROM faults AS f
    LEFT JOIN scripted AS sc ON sc.pair_id = f.pair_id AND sc.step = f.step
    WHERE f.side = 'suspect'
),

spikes AS (
    SELECT pair_id, rank, step, side, loss, baseline, ratio
    FROM loss_spikes
),

explained AS (
    SELECT
        s.pair_id,
        s.rank,
        s.step,
        count(f.step) AS faults_before,
        count(f.step) FILTER (WHERE f.scripted) AS scripted_faults_before
    FROM spikes AS s
    LEFT JOIN suspect_faults AS f
        ON f.pair_id = s.pair_id AND f.rank = s.rank AND f.step BETWEEN s.step - 5 AND s.step
    WHERE s.side = 'suspect'
    GROUP BY s.pair_id, s.rank, s.step
)

SELECT
    CASE s.side WHEN 'golden' THEN n.golden_node ELSE n.suspect_node END AS node_label,
    s.pair_id,
    s.rank,
    s.step,
    s.side,
    s.loss,
    s.baseline,
    s.ratio,
    l.golden_loss,
    l.suspect_loss,
    n.role,
    CASE
        WHEN s.side = 'golden' THEN 'golden'
        WHEN n.baseline THEN 'baseline'
        WHEN n.profile IS NULL OR n.profile = 'healthy-node' THEN 'healthy'
        WHEN n.profile = 'trigger-ulp' THEN 'trigger'
        ELSE 'fleet'
    END AS kind,
    EXISTS (
        SELECT 1 FROM spikes AS g
        WHERE g.pair_id = s.pair_id AND g.rank = s.rank AND g.step = s.step AND g.side = 'golden'
    ) AS golden_spike,
    coalesce(e.faults_before, 0) AS faults_before,
    coalesce(e.scripted_faults_before, 0) AS scripted_faults_before,
    CASE WHEN s.side = 'suspect' THEN sf.scripted_from END AS scripted_from
FROM spikes AS s
JOIN nodes AS n USING (pair_id)
LEFT JOIN scripted_from AS sf USING (pair_id)
LEFT JOIN loss AS l USING (pair_id, rank, step)
LEFT JOIN explained AS e ON e.pair_id = s.pair_id AND e.rank = s.rank AND e.step = s.step AND s.side = 'suspect'
ORDER BY node_label, s.pair_id, s.rank, s.step, s.side
