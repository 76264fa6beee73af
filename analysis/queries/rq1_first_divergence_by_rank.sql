-- RQ1 across ranks: each rank's first divergence in execution order, and which rank went first
--
-- A fault on one rank reaches the others only through a collective, later in the same step,
-- so the rank that diverged first is where corruption entered (the suspect accelerator).
-- Ranks of one layout record the same sequence of tensors, so positions compare across ranks.
--   divergence_order   1 for the rank(s) that diverged first, then 2, ... (ranks that never diverged: absent)
--   step, microbatch, name, phase, status   the rank's earliest differing record (first_divergence)
--   position           that record's index among the rank's records of its step, in log order
--   went_first         divergence_order = 1
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

first_steps AS (
    SELECT DISTINCT pair_id, rank, step
    FROM first_divergence
),

positioned AS (
    SELECT
        e.pair_id, e.rank, e.step, e.microbatch, e.name, e.phase, e.occurrence,
        row_number() OVER (
            PARTITION BY e.pair_id, e.rank, e.step
            ORDER BY coalesce(e.golden_segment, e.suspect_segment), coalesce(e.golden_offset, e.suspect_offset)
        ) - 1 AS position
    FROM event_diffs AS e
    JOIN first_steps USING (pair_id, rank, step)
),

firsts AS (
    SELECT f.pair_id, f.rank, f.step, f.microbatch, f.name, f.phase, f.status, p.position
    FROM first_divergence AS f
    JOIN positioned AS p USING (pair_id, rank, step, microbatch, name, phase, occurrence)
),

ordered AS (
    SELECT *, rank() OVER (PARTITION BY pair_id ORDER BY step, position) AS divergence_order
    FROM firsts
)

SELECT
    n.suspect_node AS node_label,
    n.golden_node,
    o.pair_id,
    o.divergence_order,
    o.rank,
    o.step,
    o.microbatch,
    o.name,
    o.phase,
    o.status,
    o.position,
    o.divergence_order = 1 AS went_first
FROM ordered AS o
JOIN nodes AS n USING (pair_id)
ORDER BY node_label, o.pair_id, o.divergence_order, o.rank
