-- RQ3: each fine-tuned run's final test accuracy per task, with its role (golden, twin or suspect) and whether it collapsed
WITH roles AS (
    SELECT golden_run_id AS run_id, 'golden' AS role FROM pairs
    UNION
    SELECT twin_run_id AS run_id, 'twin' AS role FROM pairs WHERE twin_run_id IS NOT NULL
    UNION
    SELECT suspect_run_id AS run_id, 'suspect' AS role FROM pairs
),
nodes AS (
    SELECT run_id, min(node_label) AS node_label FROM runs GROUP BY run_id
),
final_step AS (
    SELECT run_id, max(step) AS step FROM finetune_eval GROUP BY run_id
),
final_eval AS (
    SELECT e.run_id, e.task, e.step, e.accuracy, e.chance, e.collapsed
    FROM finetune_eval AS e
    JOIN final_step USING (run_id, step)
),
labelled AS (
    SELECT nodes.node_label, final_eval.run_id, roles.role, final_eval.task, final_eval.step,
           final_eval.accuracy, final_eval.chance, final_eval.collapsed
    FROM final_eval
    JOIN roles USING (run_id)
    LEFT JOIN nodes USING (run_id)
)
SELECT node_label, run_id, role, task, step, accuracy, chance, collapsed
FROM labelled
ORDER BY CASE role WHEN 'golden' THEN 0 WHEN 'twin' THEN 1 ELSE 2 END, node_label, run_id, task
