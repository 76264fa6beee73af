-- Every fault rule of every node's profile, as the runs recorded it: what the fault model builds in
--
-- From runs.extra (a node's run header records its fault profile whole). One row per (node, rule)
-- of the runs that trained with a profile (role train or finetune, rank 0); every experiment of a
-- fleet study records the same profiles, so any part's database answers. The reproduction table's
-- provenance column reads it (analysis/reproduction_provenance.py).
--   profile, rule          the profile's name and the rule's index in it (0: the first [[fault]])
--   kind, ops, sites       the corruption (bitflip, scale, stuck, ...), the op classes and module paths hit
--   bits                   a bitflip's bits (e.g. "mantissa", "random": uniform over the word, or a bit number)
--   flips                  a bitflip's bits flipped per element, as a range (null: one)
--   value                  a stuck rule's value as text (e.g. "NaN", "Infinity", "0.0")
--   p_call                 the rule's probability per eligible call while on
--   p_enter, p_exit        its burst chain (null: always on)
--   factor_min, factor_max a scale rule's factor range
--   roles, steps           the run roles it fires in and the steps it names (null: any): a rule naming
--                          steps is scripted (the destroyer, the trigger), not drawn
WITH

profiled AS (
    SELECT DISTINCT
        node_label,
        json_extract_string(extra, '$.fault_profile.name') AS profile,
        json_extract(extra, '$.fault_profile.profile.fault') AS rules
    FROM runs
    WHERE rank = 0 AND json_extract(extra, '$.fault_profile') IS NOT NULL
),

rules AS (
    SELECT node_label, profile, r.rule, rules -> r.rule AS body
    FROM profiled,
        range(CAST(coalesce(json_array_length(rules), 0) AS BIGINT)) AS r (rule)
)

SELECT
    node_label,
    profile,
    rule,
    json_extract_string(body, '$.kind') AS kind,
    json_extract(body, '$.ops') AS ops,
    json_extract_string(body, '$.sites') AS sites,
    json_extract_string(body, '$.bits') AS bits,
    json_extract(body, '$.flips') AS flips,
    json_extract_string(body, '$.value') AS value,
    CAST(json_extract(body, '$.p_call') AS DOUBLE) AS p_call,
    CAST(json_extract(body, '$.p_enter') AS DOUBLE) AS p_enter,
    CAST(json_extract(body, '$.p_exit') AS DOUBLE) AS p_exit,
    CAST(json_extract(body, '$.factor[0]') AS DOUBLE) AS factor_min,
    CAST(json_extract(body, '$.factor[1]') AS DOUBLE) AS factor_max,
    json_extract(body, '$.roles') AS roles,
    json_extract(body, '$.steps') AS steps
FROM rules
ORDER BY node_label, profile, rule
