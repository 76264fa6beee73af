-- RQ3: per pair and task, how often the suspect fine-tune's final answers differ from the golden's, beside the baseline of the pair's shuffle-seed twin (twin_node)
WITH final_prediction_step AS (
    SELECT run_id, max(step) AS step FROM finetune_predictions GROUP BY run_id
),
final_predictions AS (
    SELECT p.run_id, p.task, p.example, p.predicted
    FROM finetune_predictions AS p
    JOIN final_prediction_step USING (run_id, step)
),
final_eval_step AS (
    SELECT run_id, max(step) AS step FROM finetune_eval GROUP BY run_id
),
final_accuracy AS (
    SELECT e.run_id, e.task, e.accuracy
    FROM finetune_eval AS e
    JOIN final_eval_step USING (run_id, step)
),
nodes AS (
    SELECT run_id, min(node_label) AS node_label FROM runs GROUP BY run_id
),
compared AS (
    SELECT pairs.pair_id, g.task, g.example,
           s.predicted <> g.predicted AS suspect_differs,
           t.predicted <> g.predicted AS twin_differs
    FROM pairs
    JOIN final_predictions AS g ON g.run_id = pairs.golden_run_id
    JOIN final_predictions AS s ON s.run_id = pairs.suspect_run_id AND s.task = g.task AND s.example = g.example
    LEFT JOIN final_predictions AS t ON t.run_id = pairs.twin_run_id AND t.task = g.task AND t.example = g.example
    WHERE NOT coalesce(pairs.baseline, false)  -- a twin diffed as a baseline pair is a twin, not a suspect
),
per_task AS (
    SELECT pair_id, task, count(*) AS examples,
           avg(suspect_differs::DOUBLE) AS disagreement,
           avg(twin_differs::DOUBLE) AS baseline_disagreement
    FROM compared
    GROUP BY pair_id, task
),
report AS (
    SELECT per_task.pair_id, gn.node_label AS golden_node, sn.node_label AS suspect_node, tn.node_label AS twin_node,
           per_task.task,
           per_task.examples, per_task.disagreement, per_task.baseline_disagreement,
           ga.accuracy AS golden_accuracy, sa.accuracy AS suspect_accuracy, ta.accuracy AS twin_accuracy
    FROM per_task
    JOIN pairs USING (pair_id)
    LEFT JOIN nodes AS gn ON gn.run_id = pairs.golden_run_id
    LEFT JOIN nodes AS sn ON sn.run_id = pairs.suspect_run_id
    LEFT JOIN nodes AS tn ON tn.run_id = pairs.twin_run_id
    LEFT JOIN final_accuracy AS ga ON ga.run_id = pairs.golden_run_id AND ga.task = per_task.task
    LEFT JOIN final_accuracy AS sa ON sa.run_id = pairs.suspect_run_id AND sa.task = per_task.task
    LEFT JOIN final_accuracy AS ta ON ta.run_id = pairs.twin_run_id AND ta.task = per_task.task
)
SELECT pair_id, golden_node, suspect_node, twin_node, task, examples, disagreement, baseline_disagreement,
       golden_accuracy, suspect_accuracy, twin_accuracy
FROM report
ORDER BY golden_node, suspect_node, pair_id, task
