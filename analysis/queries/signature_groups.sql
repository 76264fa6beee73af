-- Defect signatures across incidents and nodes: per (op, dtype, shape class, most flipped bit, period), the nodes and incidents that show it
--
-- The fleet view of `sdc incident` bundles (loaded with `sdc incident load`): each row of incident_signatures is one
-- bundle output whose golden and suspect bits differ; a group is every such output of one kind:
--   op, dtype, shape_class   the op that computed the output, its dtype, its shape rounded up to powers of two
--   top_bit                  the bit flipped in the most elements (0 = least significant; the higher one on a tie)
--   period                   the gcd of the gaps between differing elements (null: one element differs)
--   nodes, node_labels       how many suspect nodes show the group, and which (sorted)
--   incidents, outputs       distinct bundles (two captures of one divergence are two) and their outputs in the group
--   first_step, sites        the earliest step of the group's incidents, and their sites (sorted)
--   max_differing, max_ulps  the most elements differing in one output, and the largest distance in ulps
--   reproductions            verdicts the group's incidents hold (incident_verdicts), emulated ones included
--   persistent_machines      the machines where a plain (not emulated) reproduction said 'persistent here' (sorted)
WITH

signatures AS (
    SELECT incident_id, node_label, step, site, op, dtype, shape_class, top_bit, period, differing, ulps_max
    FROM incident_signatures
),

groups AS (
    SELECT op, dtype, shape_class, top_bit, period,
        count(DISTINCT node_label) AS nodes,
        list(DISTINCT node_label ORDER BY node_label) AS node_labels,
        count(DISTINCT incident_id) AS incidents,
        count(*) AS outputs,
        min(step) AS first_step,
        list(DISTINCT site ORDER BY site) AS sites,
        max(differing) AS max_differing,
        max(ulps_max) AS max_ulps
    FROM signatures
    GROUP BY op, dtype, shape_class, top_bit, period
),

members AS (
    SELECT DISTINCT op, dtype, shape_class, top_bit, period, incident_id FROM signatures
),

verdicts AS (
    SELECT m.op, m.dtype, m.shape_class, m.top_bit, m.period,
        count(v.verdict) AS reproductions,
        list(DISTINCT v.machine ORDER BY v.machine)
            FILTER (WHERE v.verdict = 'persistent here' AND v.emulated IS NULL) AS persistent_machines
    FROM members AS m
    LEFT JOIN incident_verdicts AS v USING (incident_id)
    GROUP BY m.op, m.dtype, m.shape_class, m.top_bit, m.period
)

SELECT g.op, g.dtype, g.shape_class, g.top_bit, g.period, g.nodes, g.node_labels, g.incidents, g.outputs,
    g.first_step, g.sites, g.max_differing, g.max_ulps, v.reproductions,
    coalesce(v.persistent_machines, []) AS persistent_machines
FROM groups AS g
JOIN verdicts AS v
    ON v.op IS NOT DISTINCT FROM g.op AND v.dtype = g.dtype AND v.shape_class = g.shape_class
    AND v.top_bit IS NOT DISTINCT FROM g.top_bit AND v.period IS NOT DISTINCT FROM g.period
ORDER BY g.nodes DESC, g.incidents DESC, g.op, g.dtype, g.shape_class, g.top_bit, g.period
