-- RQ3: each fine-tuned run's final test accuracy per task, with its role (golden, twin or suspect), whether it collapsed (no better than chance) and whether it is significantly below the golden fine-tune of its pair
WITH roles AS (
    SELECT golden_run_id AS run_id, golden_run_id, 'golden' AS role FROM pairs
    UNION
    SELECT twin_run_id AS run_id, golden_run_id, 'twin' AS role FROM pairs WHERE twin_run_id IS NOT NULL
    UNION
    SELECT suspect_run_id AS run_id, golden_run_id, 'suspect' AS role FROM pairs WHERE NOT coalesce(baseline, false)
    UNION
    -- a shuffle-seed twin diffed against golden as a baseline pair (its spikes are row 12's null) is a twin
    SELECT suspect_run_id AS run_id, golden_run_id, 'twin' AS role FROM pairs WHERE baseline
),
nodes AS (
    SELECT run_id, min(node_label) AS node_label FROM runs GROUP BY run_id
),
final_step AS (
    SELECT run_id, max(step) AS step FROM finetune_eval GROUP BY run_id
),
final_eval AS (
    SELECT e.run_id, e.task, e.step, e.examples, e.correct, e.accuracy, e.chance, e.collapsed
    FROM finetune_eval AS e
    JOIN final_step USING (run_id, step)
),
labelled AS (
    SELECT nodes.node_label, f.run_id, roles.role, f.task, f.step, f.examples, f.correct, f.accuracy, f.chance,
           f.collapsed, g.examples AS golden_examples, g.correct AS golden_correct, g.accuracy AS golden_accuracy
    FROM final_eval AS f
    JOIN roles USING (run_id)
    LEFT JOIN final_eval AS g ON g.run_id = roles.golden_run_id AND g.task = f.task
    LEFT JOIN nodes ON nodes.run_id = f.run_id
),
-- One-sided two-proportion z-test, pooled: below golden when the shortfall exceeds two standard errors of the
-- difference of two runs that are equally good (about 2.3 % false alarms per run and task).
tested AS (
    SELECT *, accuracy - golden_accuracy AS accuracy_vs_golden,
           (correct + golden_correct)::DOUBLE / (examples + golden_examples) AS pooled
    FROM labelled
)
SELECT node_label, run_id, role, task, step, accuracy, chance, collapsed, golden_accuracy, accuracy_vs_golden,
       coalesce(golden_accuracy - accuracy
                > 2.0 * sqrt(pooled * (1 - pooled) * (1.0 / examples + 1.0 / golden_examples)), false) AS below_golden
FROM tested
ORDER BY CASE role WHEN 'golden' THEN 0 WHEN 'twin' THEN 1 ELSE 2 END, node_label, run_id, task
