"""`sdc diff --twin` of fine-tunes: finetune tables, pairs.twin_run_id, and the RQ3 queries checked against the logs."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import duckdb
import numpy as np
import pytest

from pipelines.arguments import DiffRequest
from pipelines.run import diff
from tests.pipelines.conftest import IN_MEMORY
from tests.pipelines.test_end_to_end import query
from tests.support import TINY_FINETUNE, events
from tracer.errors import ValidationError
from tracer.log import LogReader, rank_dir

pytestmark = pytest.mark.slow  # every test reads fine-tunes (the tuned fixture) diffed by Beam

QUERIES = Path(__file__).resolve().parents[2] / "analysis" / "queries"


def run_query(db: Path, name: str) -> list[dict]:
    sql = (QUERIES / f"{name}.sql").read_text(encoding="utf-8")
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description]
        return [dict(zip(columns, row)) for row in cur.fetchall()]
    finally:
        con.close()


def final_predictions(run: Path) -> dict[str, np.ndarray]:
    """Task -> predicted choice per test example at the run's last evaluation, from the log itself."""
    preds = events(run, "finetune_prediction")
    last = max(p.step for p in preds)
    by_task: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p in preds:
        if p.step == last:
            by_task[p.fields["task"]].append((p.fields["example"], p.fields["predicted"]))
    return {task: np.array([v for _, v in sorted(rows)]) for task, rows in by_task.items()}


def final_accuracy(run: Path) -> dict[str, float]:
    evals = events(run, "finetune_eval")
    last = max(e.step for e in evals)
    return {e.fields["task"]: e.fields["accuracy"] for e in evals if e.step == last}


def run_id(run: Path) -> str:
    return LogReader(rank_dir(run, 0)).header.run_id


@pytest.fixture(scope="module")
def study(tuned: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sick node against golden with its twin, and the healthy node against golden without one."""
    db = tmp_path_factory.mktemp("study") / "study.duckdb"
    for suspect, twin in (("sick", str(tuned["twin"])), ("node", None)):
        request = DiffRequest(
            golden=str(tuned["golden"]), suspect=str(tuned[suspect]), db=db, twin=twin, beam_args=tuple(IN_MEMORY)
        )
        lines: list[str] = []
        diff(request, echo=lines.append)
        (db.parent / f"{suspect}.txt").write_text("\n".join(lines))
    return db


def test_the_diff_summary_shows_fine_tune_accuracy_and_disagreement(study: Path) -> None:
    for suspect in ("sick", "node"):
        lines = [ln for ln in (study.parent / f"{suspect}.txt").read_text().splitlines() if "fine-tune" in ln]
        assert [ln.split(":")[0] for ln in lines] == [f"  fine-tune {t}" for t in sorted(TINY_FINETUNE.tasks)]
        assert all(("(twin baseline" in ln) == (suspect == "sick") for ln in lines)
        if suspect == "node":
            assert all("answers differ on 0%" in ln for ln in lines)


def test_finetune_tables_hold_every_run_once(tuned: dict[str, Path], study: Path) -> None:
    evals_per_run = (TINY_FINETUNE.steps // TINY_FINETUNE.eval_every + 1) * len(TINY_FINETUNE.tasks)
    counts = dict(query(study, "SELECT run_id, count(*) FROM finetune_eval GROUP BY run_id"))
    assert counts == {run_id(tuned[n]): evals_per_run for n in ("golden", "twin", "sick", "node")}
    counts = dict(query(study, "SELECT run_id, count(*) FROM finetune_predictions GROUP BY run_id"))
    assert set(counts.values()) == {evals_per_run * TINY_FINETUNE.test_per_task}
    rows = query(
        study,
        "SELECT step, task, examples, correct, accuracy, chance, collapsed FROM finetune_eval "
        "WHERE run_id = ? ORDER BY step, task",
        run_id(tuned["sick"]),
    )
    logged = sorted(
        (
            e.step,
            e.fields["task"],
            e.fields["examples"],
            e.fields["correct"],
            e.fields["accuracy"],
            e.fields["chance"],
            e.fields["collapsed"],
        )
        for e in events(tuned["sick"], "finetune_eval")
    )
    assert rows == logged
    assert sorted(query(study, "SELECT suspect_run_id, twin_run_id FROM pairs")) == sorted(
        [(run_id(tuned["sick"]), run_id(tuned["twin"])), (run_id(tuned["node"]), None)]
    )
    # The fine-tune's own training is diffed like pretraining: loss curve, drift after the fault at step 1.
    (pid,) = query(study, "SELECT pair_id FROM pairs WHERE twin_run_id IS NOT NULL")[0]
    drift = dict(query(study, "SELECT step, drift FROM param_drift WHERE pair_id = ? AND \"group\" = '*'", pid))
    assert drift[0] == 0.0 and drift[2] > 0 and drift[4] > 0
    assert query(study, "SELECT min(step), max(step) FROM loss WHERE pair_id = ?", pid) == [
        (0, TINY_FINETUNE.steps - 1)
    ]
    assert query(study, "SELECT step, microbatch, name FROM first_divergence WHERE pair_id = ?", pid)[0][0] == 1


def test_rq3_accuracy_query_matches_the_logs(tuned: dict[str, Path], study: Path) -> None:
    rows = run_query(study, "rq3_finetune_accuracy")
    roles = {"golden": "golden", "twin": "twin", "sick": "suspect", "node": "suspect"}
    expected = sorted(
        (name, run_id(tuned[name]), role, task, TINY_FINETUNE.steps, accuracy)
        for name, role in roles.items()
        for task, accuracy in final_accuracy(tuned[name]).items()
    )
    found = sorted((r["node_label"], r["run_id"], r["role"], r["task"], r["step"], r["accuracy"]) for r in rows)
    assert found == expected
    assert all(
        r["chance"] == 0.25 and r["collapsed"] == (r["accuracy"] <= 0.25 + 2 * np.sqrt(0.25 * 0.75 / 8)) for r in rows
    )
    golden, n = final_accuracy(tuned["golden"]), TINY_FINETUNE.test_per_task
    for r in rows:
        g, a = golden[r["task"]], r["accuracy"]
        pooled = (g + a) / 2
        assert r["golden_accuracy"] == g and r["accuracy_vs_golden"] == pytest.approx(a - g)
        assert r["below_golden"] == bool(g - a > 2 * np.sqrt(pooled * (1 - pooled) * 2 / n)), r


def test_rq3_disagreement_query_matches_the_logs(tuned: dict[str, Path], study: Path) -> None:
    rows = {(r["suspect_node"], r["task"]): r for r in run_query(study, "rq3_finetune_disagreement")}
    assert set(rows) == {(s, t) for s in ("sick", "node") for t in TINY_FINETUNE.tasks}
    golden, twin = final_predictions(tuned["golden"]), final_predictions(tuned["twin"])
    for (suspect, task), r in rows.items():
        mine = final_predictions(tuned[suspect])
        assert r["golden_node"] == "golden" and r["examples"] == TINY_FINETUNE.test_per_task
        assert r["disagreement"] == pytest.approx(float(np.mean(mine[task] != golden[task])))
        assert r["golden_accuracy"] == final_accuracy(tuned["golden"])[task]
        assert r["suspect_accuracy"] == final_accuracy(tuned[suspect])[task]
        if suspect == "sick":
            assert r["baseline_disagreement"] == pytest.approx(float(np.mean(twin[task] != golden[task])))
            assert r["twin_accuracy"] == final_accuracy(tuned["twin"])[task]
        else:  # a healthy node agrees bit for bit, and this pair has no twin
            assert r["disagreement"] == 0.0 and r["baseline_disagreement"] is None and r["twin_accuracy"] is None


def test_reloading_replaces_a_runs_finetune_rows(tuned: dict[str, Path], study: Path, run_diff, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    db.write_bytes(study.read_bytes())
    before = query(db, "SELECT count(*) FROM finetune_eval")
    run_diff(tuned["golden"], tuned["node"], db=db)
    assert query(db, "SELECT count(*) FROM finetune_eval") == before


@pytest.mark.parametrize(
    "twin, message",
    [
        ("node", "config.finetune.shuffle_seed: both 0 (a twin must differ here)"),
        ("pretrained", "role: 'finetune' vs 'train' (both must be fine-tunes)"),
    ],
)
def test_a_run_that_is_not_a_twin_is_refused(
    tuned: dict[str, Path], pretrained: Path, run_diff, twin: str, message: str
) -> None:
    path = pretrained if twin == "pretrained" else tuned[twin]
    with pytest.raises(
        ValidationError,
        match=f"twin {re.escape(str(path))} is not the shuffle-seed twin of golden .*{re.escape(message)}",
    ):
        run_diff(tuned["golden"], tuned["sick"], twin=str(path))
