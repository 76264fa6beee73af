-- Per pair: records compared and differing, how far the runs were compared, the largest drift and the loss spikes
--
-- The totals `sdc diff` prints after loading a pair; `summary` breaks them down by RQ.
--   golden_run_id, suspect_run_id      the pair's runs (lowest rank)
--   events_compared, events_differing   event_diffs rows, and those whose fingerprints are not equal
--   compared_through                    last step both runs hold (max over ranks; null: no rank compared)
--   max_drift                           largest parameter drift (group *) at a common checkpoint (null: none)
--   loss_spikes                         loss spikes of either run
--   golden_status, suspect_status       complete, failed, crashed (no END) or corrupt (read past corruption)
--   lost_steps                          compared steps corruption made unknown (table lost_ranges)
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node, golden_run_id, suspect_run_id
    FROM pair_nodes
    JOIN pairs USING (pair_id)
),

events AS (
    SELECT pair_id, count(*) AS events_compared, count(*) FILTER (NOT equal) AS events_differing
    FROM event_diffs
    GROUP BY pair_id
),

compared AS (
    SELECT pair_id, max(compared_through) AS compared_through
    FROM pair_ranks
    GROUP BY pair_id
),

drift AS (
    SELECT pair_id, max(drift) AS max_drift
    FROM param_drift
    WHERE "group" = '*'
    GROUP BY pair_id
),

statuses AS (
    SELECT pair_id, golden_status, suspect_status, lost_steps FROM pair_status
),

spikes AS (
    SELECT pair_id, count(*) AS loss_spikes
    FROM loss_spikes
    GROUP BY pair_id
)

SELECT
    n.suspect_node AS node_label,
    n.golden_node,
    n.pair_id,
    n.golden_run_id,
    n.suspect_run_id,
    coalesce(e.events_compared, 0) AS events_compared,
    coalesce(e.events_differing, 0) AS events_differing,
    c.compared_through,
    d.max_drift,
    coalesce(s.loss_spikes, 0) AS loss_spikes,
    st.golden_status,
    st.suspect_status,
    coalesce(st.lost_steps, 0) AS lost_steps
FROM nodes AS n
LEFT JOIN events AS e USING (pair_id)
LEFT JOIN compared AS c USING (pair_id)
LEFT JOIN drift AS d USING (pair_id)
LEFT JOIN spikes AS s USING (pair_id)
LEFT JOIN statuses AS st USING (pair_id)
ORDER BY node_label, n.pair_id
