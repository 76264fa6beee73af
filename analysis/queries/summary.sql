-- Overview: one row per pair with its node, first divergence and the RQ1, RQ2 and RQ3 headline numbers
--
-- The table to read first; the rq1_, rq2_ and rq3_ queries break each number down.
-- Empty (null) where the pair has no such data: RQ1 needs a lockstep replay, RQ2 a
-- parameter-sync replay, drift two checkpoints of the same step.
--   compared_through        last step both runs hold (max over ranks)
--   role                    train (a pretraining pair) or finetune (a pair of fine-tunes, `sdc diff --twin`)
--   first_rank, first_step, first_microbatch, first_site   the earliest first divergence over ranks, in
--                           execution order (SCHEMA.md): the rank where corruption entered, and the record's
--                           step, microbatch (null: the whole step's) and site and phase; never inside a step
--                           corruption made unknown (lost_ranges): corruption on disk is not SDC
--   first_tied_ranks        where several ranks first differ at that same point (a site after a collective):
--                           those ranks, and first_rank is null; a tie is never credited to one rank
--   golden_status, suspect_status   complete, failed, crashed (no END record) or corrupt
--   lost_steps              compared steps corruption made unknown, over ranks: no divergence is reported there
--   mismatch_frequency, mismatch_severity, mismatching_steps, lockstep_steps   RQ1
--   worst_noise             RQ2: the largest noise-to-signal ratio of any step
--   final_drift, max_drift  RQ3: drift at the last checkpoint both runs hold, and its maximum
--   suspect_spikes          loss spikes of the suspect run
--   faults, abft_rate       injected faults (either run) and the share ABFT flagged of those it checked
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node, role FROM pair_nodes
),

compared AS (
    SELECT pair_id, max(compared_through) AS compared_through
    FROM pair_ranks
    GROUP BY pair_id
),

known_firsts AS (
    SELECT f.*, min(divergence_order) OVER (PARTITION BY pair_id) AS earliest
    FROM first_divergence_ranked AS f
    WHERE NOT EXISTS (
        SELECT 1 FROM lost_ranges AS l
        WHERE l.pair_id = f.pair_id AND l.rank = f.rank
          AND (l.first_step IS NULL OR f.step >= l.first_step) AND (l.last_step IS NULL OR f.step <= l.last_step)
    )
),

first_divergence_per_pair AS (
    SELECT
        pair_id,
        CASE WHEN count(*) = 1 THEN min(rank) END AS first_rank,
        CASE WHEN count(*) > 1 THEN list(rank ORDER BY rank) END AS first_tied_ranks,
        min(step) AS first_step,
        min(microbatch) AS first_microbatch,
        min(name || ' ' || phase) AS first_site
    FROM known_firsts
    WHERE divergence_order = earliest
    GROUP BY pair_id
),

statuses AS (
    SELECT pair_id, golden_status, suspect_status, lost_steps FROM pair_status
),

rq1_mismatch AS (
    SELECT
        pair_id,
        sum(mismatched) / nullif(sum(elements), 0) AS mismatch_frequency,
        avg(severity) FILTER (WHERE mismatched > 0) AS mismatch_severity
    FROM site_mismatch
    GROUP BY pair_id
),

rq1_steps AS (
    SELECT pair_id, count(*) AS lockstep_steps, count(*) FILTER (WHERE mismatching) AS mismatching_steps
    FROM (
        SELECT pair_id, step, bool_or(mismatched > 0) AS mismatching
        FROM site_mismatch
        GROUP BY pair_id, step
    )
    GROUP BY pair_id
),

rq2_noise AS (
    SELECT pair_id, max(ratio) AS worst_noise
    FROM grad_noise
    WHERE name = '*'
    GROUP BY pair_id
),

rq3_drift AS (
    SELECT pair_id, arg_max(drift, step) AS final_drift, max(drift) AS max_drift
    FROM param_drift
    WHERE "group" = '*'
    GROUP BY pair_id
),

rq3_spikes AS (
    SELECT pair_id, count(*) AS suspect_spikes
    FROM loss_spikes
    WHERE side = 'suspect'
    GROUP BY pair_id
),

injected AS (
    SELECT
        pair_id,
        count(*) AS faults,
        count(*) FILTER (WHERE abft_flagged) / nullif(count(abft_flagged), 0) AS abft_rate
    FROM faults
    GROUP BY pair_id
)

SELECT
    n.suspect_node AS node_label,
    n.role,
    n.golden_node,
    n.pair_id,
    c.compared_through,
    f.first_rank,
    f.first_tied_ranks,
    f.first_step,
    f.first_microbatch,
    f.first_site,
    st.golden_status,
    st.suspect_status,
    coalesce(st.lost_steps, 0) AS lost_steps,
    m.mismatch_frequency,
    m.mismatch_severity,
    s.mismatching_steps,
    s.lockstep_steps,
    q.worst_noise,
    d.final_drift,
    d.max_drift,
    coalesce(k.suspect_spikes, 0) AS suspect_spikes,
    coalesce(i.faults, 0) AS faults,
    i.abft_rate
FROM nodes AS n
LEFT JOIN compared AS c USING (pair_id)
LEFT JOIN first_divergence_per_pair AS f USING (pair_id)
LEFT JOIN statuses AS st USING (pair_id)
LEFT JOIN rq1_mismatch AS m USING (pair_id)
LEFT JOIN rq1_steps AS s USING (pair_id)
LEFT JOIN rq2_noise AS q USING (pair_id)
LEFT JOIN rq3_drift AS d USING (pair_id)
LEFT JOIN rq3_spikes AS k USING (pair_id)
LEFT JOIN injected AS i USING (pair_id)
ORDER BY node_label, n.role DESC, n.pair_id
