-- RQ1 burst structure per suspect node: replayed steps, steps with mismatches, bursts, longest run
--
-- From lockstep replays (site_mismatch). A step is mismatching when any site call in it
-- differs; a burst is a maximal run of mismatching steps with consecutive step numbers.
--   steps_replayed, first_step, last_step   the steps the lockstep replays covered
--   steps_mismatching, step_fraction        mismatching steps, and their share of those replayed
--   bursts, longest_burst, longest_burst_start, mean_burst   the runs of consecutive mismatching steps
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

replayed_steps AS (
    SELECT pair_id, step, bool_or(mismatched > 0) AS mismatching
    FROM site_mismatch
    GROUP BY pair_id, step
),

mismatching_steps AS (
    -- consecutive steps share step - row number: the classic gaps-and-islands key
    SELECT pair_id, step, step - row_number() OVER (PARTITION BY pair_id ORDER BY step) AS island
    FROM replayed_steps
    WHERE mismatching
),

bursts AS (
    SELECT pair_id, island, min(step) AS start_step, count(*) AS length
    FROM mismatching_steps
    GROUP BY pair_id, island
),

burst_stats AS (
    SELECT
        pair_id,
        count(*) AS bursts,
        max(length) AS longest_burst,
        avg(length) AS mean_burst
    FROM bursts
    GROUP BY pair_id
),

longest AS (
    SELECT b.pair_id, min(b.start_step) AS longest_burst_start
    FROM bursts AS b
    JOIN burst_stats AS s ON s.pair_id = b.pair_id AND b.length = s.longest_burst
    GROUP BY b.pair_id
),

step_stats AS (
    SELECT
        pair_id,
        count(*) AS steps_replayed,
        min(step) AS first_step,
        max(step) AS last_step,
        count(*) FILTER (WHERE mismatching) AS steps_mismatching
    FROM replayed_steps
    GROUP BY pair_id
)

SELECT
    n.suspect_node AS node_label,
    s.pair_id,
    s.steps_replayed,
    s.first_step,
    s.last_step,
    s.steps_mismatching,
    s.steps_mismatching / s.steps_replayed AS step_fraction,
    coalesce(b.bursts, 0) AS bursts,
    coalesce(b.longest_burst, 0) AS longest_burst,
    l.longest_burst_start,
    b.mean_burst
FROM step_stats AS s
JOIN nodes AS n USING (pair_id)
LEFT JOIN burst_stats AS b USING (pair_id)
LEFT JOIN longest AS l USING (pair_id)
ORDER BY node_label, s.pair_id
