-- RQ3: per fine-tuned run and task, the first evaluated step at which its accuracy leaves the plateau (chance + 10 points), the evaluations before it and its final accuracy: how long a fine-tune must run to learn the task
WITH runs_ AS (
    SELECT run_id, min(node_label) AS node_label FROM runs GROUP BY run_id
),
finetuned AS (
    SELECT DISTINCT run_id FROM finetune_eval
),
left_plateau AS (
    SELECT run_id, task, min(step) AS step FROM finetune_eval WHERE accuracy >= chance + 0.10 GROUP BY run_id, task
),
final_step AS (
    SELECT run_id, max(step) AS step FROM finetune_eval GROUP BY run_id
),
final AS (
    SELECT e.run_id, e.task, e.step, e.accuracy, e.chance FROM finetune_eval AS e JOIN final_step USING (run_id, step)
)
SELECT runs_.node_label, f.run_id, f.task, f.chance, p.step AS leaves_plateau_at, f.step AS final_step,
       f.accuracy AS final_accuracy, (SELECT count(*) FROM finetune_eval AS e
                                      WHERE e.run_id = f.run_id AND e.task = f.task) AS evaluations
FROM final AS f
JOIN finetuned USING (run_id)
LEFT JOIN runs_ USING (run_id)
LEFT JOIN left_plateau AS p ON p.run_id = f.run_id AND p.task = f.task
ORDER BY runs_.node_label, f.run_id, f.task
