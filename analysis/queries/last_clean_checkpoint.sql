-- Certified checkpoints: per pair and rank, the last checkpoint at which every record up to it matched golden
--
-- A checkpoint of step s holds the state before step s: it is clean on a rank when every record of the
-- steps before s matched golden, bit for bit, and nothing of those steps was lost to corruption:
--   verified_until     the first step not known to match, on this rank: the earliest of the first differing
--                      record (first_divergence: site outputs, input gradients, gradients, parameters, inputs),
--                      the first step whose loss differs or one run lacks (loss), the first step of a damaged
--                      or missing part of either log (lost_ranges; null first_step: 0), and the step after
--                      the last one both runs hold (compared_through + 1): never certify what was not read
--                      (a lost range or corruption of no rank counts for every rank)
--   limited_by         what sets verified_until: divergence, loss, lost, or end (every compared step matched)
--   first_name, first_phase   the first differing record when limited_by is divergence
--   divergence_order   when limited_by is divergence, the rank's place in the pair's execution order
--                      (first_divergence_ranked: 1 went first; a pipeline stage that only received the
--                      corruption comes later), so a tie on verified_until names the rank where it entered
--   checkpoints        the checkpoint steps both runs hold on this rank, read and checked against their logs
--                      (param_drift); a checkpoint with a corruptions row is not one of them
--   certified_step     the last of them with step <= verified_until whose model tensors equal golden's
--                      (param_drift group * diff_norm = 0); null: none is clean
--   clean_checkpoints  all of them that are clean so, ascending (certified_step is the last): where `sdc certify`
--                      looks for an earlier one when the files no longer verify the last
--   run_certified_step the last checkpoint step clean on every rank of the pair: the one to resume the run from
--                      (null: none); the same on each of the pair's rows
--   suspect_path       the suspect's run directory as given to `sdc diff`: the checkpoint is
--                      <suspect_path>/checkpoints/step-<certified_step, 6 digits>
WITH

nodes AS (
    SELECT pair_id, golden_node, suspect_node FROM pair_nodes
),

ranks AS (
    SELECT pair_id, rank, compared_through FROM pair_ranks
),

loss_mismatch AS (
    SELECT o.pair_id, o.rank, min(o.step) AS step
    FROM loss AS o
    JOIN ranks AS r USING (pair_id, rank)
    WHERE o.golden_loss IS DISTINCT FROM o.suspect_loss AND o.step <= r.compared_through
    GROUP BY o.pair_id, o.rank
),

lost AS (
    SELECT r.pair_id, r.rank, min(coalesce(l.first_step, 0)) AS step
    FROM lost_ranges AS l
    JOIN ranks AS r ON r.pair_id = l.pair_id AND (l.rank IS NULL OR l.rank = r.rank)
    GROUP BY r.pair_id, r.rank
),

limits AS (
    SELECT r.pair_id, r.rank, r.compared_through, f.name AS first_name, f.phase AS first_phase,
        unnest([
            {'step': f.step, 'what': 'divergence'},
            {'step': m.step, 'what': 'loss'},
            {'step': l.step, 'what': 'lost'},
            {'step': coalesce(r.compared_through, -1) + 1, 'what': 'end'}
        ]) AS lim
    FROM ranks AS r
    LEFT JOIN first_divergence AS f USING (pair_id, rank)
    LEFT JOIN loss_mismatch AS m USING (pair_id, rank)
    LEFT JOIN lost AS l USING (pair_id, rank)
),

verified AS (
    SELECT pair_id, rank, compared_through,
        min(lim.step) AS verified_until,
        arg_min(lim.what, [lim.step, list_position(['divergence', 'loss', 'lost', 'end'], lim.what)])
            AS limited_by,
        any_value(first_name) AS first_name,
        any_value(first_phase) AS first_phase
    FROM limits
    WHERE lim.step IS NOT NULL
    GROUP BY pair_id, rank, compared_through
),

damaged_checkpoints AS (
    SELECT DISTINCT pair_id, rank, CAST(regexp_extract(path, 'checkpoints/step-([0-9]+)/', 1) AS BIGINT) AS step
    FROM corruptions
    WHERE regexp_matches(path, 'checkpoints/step-[0-9]+/')
),

checkpoints AS (
    SELECT d.pair_id, d.rank, d.step, d.diff_norm = 0 AS equal_to_golden
    FROM param_drift AS d
    WHERE d."group" = '*'
      AND NOT EXISTS (
          SELECT 1 FROM damaged_checkpoints AS x
          WHERE x.pair_id = d.pair_id AND (x.rank IS NULL OR x.rank = d.rank) AND x.step = d.step
      )
),

clean AS (
    SELECT c.pair_id, c.rank, c.step
    FROM checkpoints AS c
    JOIN verified AS v USING (pair_id, rank)
    WHERE c.step <= v.verified_until AND c.equal_to_golden
),

per_rank AS (
    SELECT v.*,
        (SELECT list(c.step ORDER BY c.step) FROM checkpoints AS c
         WHERE c.pair_id = v.pair_id AND c.rank = v.rank) AS checkpoints,
        (SELECT list(c.step ORDER BY c.step) FROM clean AS c
         WHERE c.pair_id = v.pair_id AND c.rank = v.rank) AS clean_checkpoints,
        (SELECT max(c.step) FROM clean AS c WHERE c.pair_id = v.pair_id AND c.rank = v.rank) AS certified_step
    FROM verified AS v
),

per_run AS (
    SELECT c.pair_id, max(c.step) AS run_certified_step
    FROM (
        SELECT pair_id, step FROM clean
        GROUP BY pair_id, step
        HAVING count(DISTINCT rank) = (SELECT count(*) FROM ranks AS r WHERE r.pair_id = clean.pair_id)
    ) AS c
    GROUP BY c.pair_id
)

SELECT
    n.suspect_node AS node_label,
    n.golden_node,
    p.pair_id,
    p.rank,
    p.compared_through,
    p.verified_until,
    p.limited_by,
    CASE WHEN p.limited_by = 'divergence' THEN p.first_name END AS first_name,
    CASE WHEN p.limited_by = 'divergence' THEN p.first_phase END AS first_phase,
    CASE WHEN p.limited_by = 'divergence' THEN o.divergence_order END AS divergence_order,
    p.checkpoints,
    p.clean_checkpoints,
    p.certified_step,
    u.run_certified_step,
    s.suspect_path
FROM per_rank AS p
JOIN nodes AS n USING (pair_id)
JOIN pairs AS s USING (pair_id)
LEFT JOIN per_run AS u USING (pair_id)
LEFT JOIN first_divergence_ranked AS o ON o.pair_id = p.pair_id AND o.rank = p.rank
ORDER BY node_label, p.pair_id, p.rank
