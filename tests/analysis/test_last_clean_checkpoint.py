"""The named query ``last_clean_checkpoint`` on a study database of the real schema holding crafted pairs: the
rules one by one (a divergence, a loss that differs, a lost log range, a damaged checkpoint, a checkpoint whose
model differs, ranks that disagree). tests/sdc/test_certify.py runs it on real recordings through `sdc certify`."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analysis import queries
from analysis.clean_checkpoints import clean_checkpoint_rows, newest_pair
from analysis.study_db import SCHEMA_VERSION, schema_sql

CHECKPOINTS = (0, 5, 10)


def add_pair(con: duckdb.DuckDBPyConnection, pair: str, ranks: int = 1, compared_through: int = 9) -> None:
    for side in ("golden", "suspect"):
        for rank in range(ranks):
            con.execute(
                "INSERT INTO runs (run_id, rank, path, node_label, role) VALUES (?, ?, ?, ?, 'train')",
                [f"{pair}-{side}", rank, f"/runs/{pair}-{side}", f"{pair}-{side}"],
            )
    con.execute(
        "INSERT INTO pairs (pair_id, golden_path, suspect_path, golden_run_id, suspect_run_id) VALUES (?, ?, ?, ?, ?)",
        [pair, f"/runs/{pair}-golden", f"/runs/{pair}-suspect", f"{pair}-golden", f"{pair}-suspect"],
    )
    for rank in range(ranks):
        con.execute(
            "INSERT INTO pair_ranks (pair_id, rank, compared_through) VALUES (?, ?, ?)", [pair, rank, compared_through]
        )
        for step in range(compared_through + 1):
            con.execute(
                "INSERT INTO loss (pair_id, rank, step, golden_loss, suspect_loss) VALUES (?, ?, ?, 4.0, 4.0)",
                [pair, rank, step],
            )
        for step in CHECKPOINTS:
            drift(con, pair, rank, step, 0.0)


def drift(con: duckdb.DuckDBPyConnection, pair: str, rank: int, step: int, diff_norm: float) -> None:
    con.execute("DELETE FROM param_drift WHERE pair_id = ? AND rank = ? AND step = ?", [pair, rank, step])
    con.execute(
        "INSERT INTO param_drift VALUES (?, ?, ?, '*', 100, 3.0, ?, ?)", [pair, rank, step, diff_norm, diff_norm / 3.0]
    )


def diverge(con: duckdb.DuckDBPyConnection, pair: str, rank: int, step: int) -> None:
    con.execute(
        "INSERT INTO first_divergence (pair_id, rank, step, microbatch, name, phase, occurrence, status, "
        "equal) VALUES (?, ?, ?, 0, 'layers.1.feed_forward', 'forward', 0, 'differ', false)",
        [pair, rank, step],
    )


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "study.duckdb"
    con = duckdb.connect(str(path))
    con.execute(schema_sql())
    con.execute("INSERT INTO sdctrace_schema VALUES (?)", [SCHEMA_VERSION])
    # a fault at step 7 on rank 0 of two: rank 1 stayed clean, the run is clean up to step 5
    add_pair(con, "fault", ranks=2)
    diverge(con, "fault", 0, 7)
    drift(con, "fault", 0, 10, 0.5)
    # a healthy twin whose checkpoint of step 10 does not hold golden's model: not certified
    add_pair(con, "changed")
    drift(con, "changed", 0, 10, 0.25)
    # the suspect's log lost steps 3 on: never certify what could not be read
    add_pair(con, "lost")
    con.execute(
        "INSERT INTO lost_ranges VALUES ('lost', 'lost-suspect', 'suspect', 0, '/runs/lost-suspect/"
        "rank-00000/000001.sdclog', 0, 0, 40, 3, NULL)"
    )
    # the loss of step 6 differs, and the checkpoint of step 5 is damaged (of no rank: every rank's)
    add_pair(con, "loss")
    con.execute("UPDATE loss SET suspect_loss = 4.5 WHERE pair_id = 'loss' AND step = 6")
    con.execute(
        "INSERT INTO corruptions VALUES ('loss', 'loss-suspect', 'suspect', NULL, "
        "'/runs/loss-suspect/checkpoints/step-000005/rank-00000.safetensors', 0, 'truncated')"
    )
    # a divergence at step 2, before every checkpoint but step 0's, whose checkpoint the run no longer holds
    add_pair(con, "early")
    diverge(con, "early", 0, 2)
    con.execute("DELETE FROM param_drift WHERE pair_id = 'early' AND step = 0")
    con.close()
    return path


def by_pair(db: Path) -> dict[tuple[str, int], dict]:
    return {(r["pair_id"], r["rank"]): r for r in queries.run(db, "last_clean_checkpoint").records()}


def test_the_last_clean_checkpoint_of_each_rank_and_run(db: Path) -> None:
    got = {
        key: (r["verified_until"], r["limited_by"], r["certified_step"], r["run_certified_step"])
        for key, r in by_pair(db).items()
    }
    assert got == {
        ("fault", 0): (7, "divergence", 5, 5),
        ("fault", 1): (10, "end", 10, 5),
        ("changed", 0): (10, "end", 5, 5),
        ("lost", 0): (3, "lost", 0, 0),
        ("loss", 0): (6, "loss", 0, 0),
        ("early", 0): (2, "divergence", None, None),
    }


def test_the_rows_say_what_ended_the_match_and_which_checkpoints_were_held(db: Path) -> None:
    rows = by_pair(db)
    fault = rows[("fault", 0)]
    assert (fault["node_label"], fault["golden_node"], fault["suspect_path"]) == (
        "fault-suspect",
        "fault-golden",
        "/runs/fault-suspect",
    )
    assert (fault["first_name"], fault["first_phase"], fault["checkpoints"]) == (
        "layers.1.feed_forward",
        "forward",
        [0, 5, 10],
    )
    assert rows[("fault", 1)]["first_name"] is None  # rank 1 never diverged
    assert rows[("loss", 0)]["checkpoints"] == [0, 10]  # the damaged checkpoint of step 5 is not one
    assert rows[("early", 0)]["checkpoints"] == [5, 10]


@pytest.mark.slow
def test_on_the_study_of_real_runs(study) -> None:
    # node-7's first fault hits step 1: only the initial state (step 0) is clean. node-3 is a healthy twin of 3
    # steps with checkpoints 0, 2 and 3; golden (6 steps) holds 0, 2, 4 and 6, so step 2 is the last both hold.
    got = {
        r["node_label"]: (r["verified_until"], r["limited_by"], r["checkpoints"], r["certified_step"])
        for r in queries.run(study.db, "last_clean_checkpoint").records()
    }
    assert got == {"node-7": (1, "divergence", [0, 2, 4, 6], 0), "node-3": (3, "end", [0, 2], 2)}


def test_certify_reads_one_pairs_rows_and_the_newest_pair_of_two_runs(db: Path) -> None:
    assert [(r["pair_id"], r["rank"]) for r in clean_checkpoint_rows(db, "fault")] == [("fault", 0), ("fault", 1)]
    assert clean_checkpoint_rows(db, "none") == []
    con = duckdb.connect(str(db))
    for pair, created in (("fault-old", 1.0), ("fault-new", 3.0), ("fault-mid", 2.0)):
        con.execute(
            "INSERT INTO pairs (pair_id, golden_path, suspect_path, golden_run_id, suspect_run_id, created_unix) "
            "VALUES (?, '/runs/fault-golden', '/runs/fault-suspect', 'fault-golden', 'fault-suspect', ?)",
            [pair, created],
        )
    con.close()
    assert newest_pair(db, "fault-golden", "fault-suspect") == "fault-new"
    assert newest_pair(db, "fault-suspect", "fault-golden") is None
