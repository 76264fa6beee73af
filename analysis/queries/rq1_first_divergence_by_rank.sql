-- RQ1 across ranks: each rank's first divergence in execution order, and which rank went first (where corruption entered).
-- A fault on one rank reaches the others only through a collective, later in the same step: the rank
-- that diverged first (lowest step, then lowest position among that step's records) is the suspect
-- accelerator. Ranks of one layout record the same sequence of tensors, so positions are comparable.
WITH first_steps AS (
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
    pair_id, divergence_order, rank, step, microbatch, name, phase, status, position,
    divergence_order = 1 AS went_first
FROM ordered
ORDER BY pair_id, divergence_order, rank
