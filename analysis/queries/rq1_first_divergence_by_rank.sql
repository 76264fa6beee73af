-- RQ1 across ranks: each rank's first divergence in execution order, and which rank went first
--
-- A fault on one rank reaches the others only through a collective, later in the same step,
-- so the rank that diverged first is where corruption entered (the suspect accelerator).
-- Ranks of one layout record the same sequence of tensors, so positions compare across ranks.
--   divergence_order   1 for the rank(s) that diverged first, then 2, ... (ranks that never diverged: absent)
--   step, microbatch, name, phase, status   the rank's earliest differing record (first_divergence)
--   position           that record's index among the rank's records of its step, in log order
--   (the order, and the tie rule, are the view first_divergence_ranked's: analysis/SCHEMA.md)
--   tied               another rank shares this rank's divergence_order: they first differ at the same point,
--                      which a collective reached on all of them (a site after an all-reduce), so no record
--                      tells which went first
--   went_first         divergence_order = 1 and not tied: a tie is never credited to one rank
--   stage              the pipeline stage of the record: the rank's (its header's extra.parallel.coords.pp); where
--                      a rank holds several (an interleaved schedule), the one whose modules (the header's
--                      extra.parallel.pipeline.stage_modules) hold the site, or a link's receiving stage
--                      (pipeline.S-D.recv.out: D) or sending one (pipeline.S-D.send.in: S); null outside a pipeline
--   slice, global_shape   for a gradient or parameter of a sharded (DTensor) parameter, the slice of it this
--                      rank's fingerprint covers (view param_shards, from the suspect's header); else null
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

ordered AS (
    SELECT *, count(*) OVER (PARTITION BY pair_id, divergence_order) > 1 AS tied FROM first_divergence_ranked
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
    o.tied,
    o.divergence_order = 1 AND NOT o.tied AS went_first,
    CASE WHEN json_extract(ru.extra, '$.parallel.pipeline.stage_modules') IS NULL
        THEN CAST(json_extract(ru.extra, '$.parallel.coords.pp') AS BIGINT)
        ELSE coalesce(
            CAST(nullif(regexp_extract(o.name, '^pipeline\.\d+-(\d+)\.recv\.out$', 1), '') AS BIGINT),
            CAST(nullif(regexp_extract(o.name, '^pipeline\.(\d+)-\d+\.send\.in$', 1), '') AS BIGINT),
            CAST(list_filter(
                map_entries(CAST(json_extract(ru.extra, '$.parallel.pipeline.stage_modules') AS MAP(VARCHAR, VARCHAR[]))),
                lambda e: len(list_filter(e.value, lambda m: o.name = m OR starts_with(o.name, m || '.'))) > 0
            )[1].key AS BIGINT))
    END AS stage,
    ps.slice,
    ps.global_shape
FROM ordered AS o
JOIN nodes AS n USING (pair_id)
LEFT JOIN pair_ranks AS pr ON pr.pair_id = o.pair_id AND pr.rank = o.rank
LEFT JOIN runs AS ru ON ru.run_id = pr.suspect_run_id AND ru.rank = o.rank
LEFT JOIN param_shards AS ps
  ON ps.run_id = pr.suspect_run_id AND ps.rank = o.rank AND ps.name = o.name AND o.phase IN ('grad', 'param')
ORDER BY node_label, o.pair_id, o.divergence_order, o.rank
