"""rq3_finetune_accuracy on seeded tables: each run judged against chance (collapsed) and its golden (below_golden)."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest

from analysis.study_db import schema_sql
from workload.multiple_choice import collapsed

QUERY = Path(__file__).resolve().parents[2] / "analysis" / "queries" / "rq3_finetune_accuracy.sql"
N = 128  # test examples per task, as in the default settings

# run -> task -> correct answers at the final step (200); golden's shuffle twin and three suspects.
CORRECT = {
    "golden": {"copy": 120, "find": 96, "match": 40},
    "twin": {"copy": 118, "find": 90, "match": 35},
    "dented": {"copy": 119, "find": 70, "match": 38},  # find: 20 points below golden, far beyond noise
    "nan": {"copy": 32, "find": 32, "match": 32},  # NaN weights: always "A", exactly chance
    "equal": {"copy": 120, "find": 96, "match": 40},
}


def below_golden(correct: int, golden: int, n: int = N) -> bool:
    """The documented rule, written out: pooled one-sided two-proportion z-test at two standard errors."""
    pooled = (correct + golden) / (2 * n)
    return (golden - correct) / n > 2 * math.sqrt(pooled * (1 - pooled) * 2 / n)


@pytest.fixture()
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute(schema_sql())
    for run in CORRECT:
        con.execute(
            "INSERT INTO runs (run_id, rank, path, node_label) VALUES (?, 0, ?, ?)",
            [f"id-{run}", f"/runs/{run}", "golden" if run == "twin" else run],
        )
        for task, correct in CORRECT[run].items():
            for step, right in ((0, N // 4), (200, correct)):  # the query must read the final step only
                acc = right / N
                con.execute(
                    "INSERT INTO finetune_eval VALUES (?, 0, ?, ?, ?, ?, ?, 0.25, ?)",
                    [f"id-{run}", step, task, N, right, acc, collapsed(acc, 0.25, N)],
                )
    for suspect in ("dented", "nan", "equal"):
        con.execute(
            "INSERT INTO pairs (pair_id, golden_path, suspect_path, golden_run_id, suspect_run_id, "
            "twin_run_id) VALUES (?, '/runs/golden', ?, 'id-golden', ?, 'id-twin')",
            [f"p-{suspect}", f"/runs/{suspect}", f"id-{suspect}"],
        )
    return con


def test_each_run_is_judged_against_chance_and_against_its_golden(con: duckdb.DuckDBPyConnection) -> None:
    cur = con.execute(QUERY.read_text(encoding="utf-8"))
    rows = [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]
    assert sorted((r["run_id"], r["task"]) for r in rows) == sorted(
        (f"id-{run}", task) for run in CORRECT for task in CORRECT[run]
    )
    golden = CORRECT["golden"]
    for r in rows:
        run = r["run_id"].removeprefix("id-")
        right = CORRECT[run][r["task"]]
        assert r["role"] == {"golden": "golden", "twin": "twin"}.get(run, "suspect") and r["step"] == 200
        assert r["accuracy"] == right / N and r["golden_accuracy"] == golden[r["task"]] / N
        assert r["accuracy_vs_golden"] == pytest.approx((right - golden[r["task"]]) / N)
        assert r["collapsed"] == collapsed(right / N, 0.25, N)
        assert r["below_golden"] == below_golden(right, golden[r["task"]]), r
    flagged = {(r["run_id"], r["task"]) for r in rows if r["below_golden"]}
    assert flagged == {("id-dented", "find"), ("id-nan", "copy"), ("id-nan", "find")}
    # NaN weights: at chance, collapsed on every task; on the task golden barely learns, not below golden.
    assert all(r["collapsed"] and r["accuracy"] <= r["chance"] for r in rows if r["run_id"] == "id-nan")
