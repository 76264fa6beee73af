"""The study database: its schema matches the pipeline's Parquet, and loading a pair replaces it atomically."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from analysis.load import PAIR_TABLES, RUN_TABLES, TABLES, load_parquet
from analysis.study_db import SCHEMA_VERSION, schema_sql
from pipelines.tables import SCHEMAS, table
from tracer.errors import UsageError

DOCS = Path(__file__).resolve().parents[2] / "analysis" / "SCHEMA.md"


def declared() -> dict[str, list[str]]:
    con = duckdb.connect()
    con.execute(schema_sql())
    return {
        name: [
            c
            for (c,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [name]
            ).fetchall()
        ]
        for name in TABLES
    }


def test_schema_declares_every_parquet_column_plus_pair_id() -> None:
    for name, columns in declared().items():
        expected = SCHEMAS[name].names if name in RUN_TABLES else ["pair_id", *SCHEMAS[name].names]
        assert columns == expected, name
    assert set(TABLES) == set(SCHEMAS) - {"errors"}


def test_schema_doc_describes_every_table_and_column() -> None:
    doc = DOCS.read_text(encoding="utf-8")
    for name, columns in declared().items():
        section = re.search(rf"^### `{name}`\n(.*?)(?=^### |\Z)", doc, re.S | re.M)
        assert section, f"SCHEMA.md has no section for {name}"
        for column in columns:
            assert f"`{column}`" in section[1], f"SCHEMA.md does not describe {name}.{column}"


def stage(root: Path, loss: list[float], run_id: str = "run-g") -> Path:
    """A staging directory with a pair row, one run row and a loss curve."""
    for name, rows in {
        "pairs": [{"golden_path": "a", "suspect_path": "b", "golden_run_id": run_id, "suspect_run_id": "run-s"}],
        "runs": [{"run_id": run_id, "rank": 0, "path": "a"}],
        "loss": [{"rank": 0, "step": s, "golden_loss": v, "suspect_loss": v} for s, v in enumerate(loss)],
    }.items():
        (root / name).mkdir(parents=True)
        pq.write_table(table(name, rows), root / name / "part.parquet")
    return root


def test_loading_again_replaces_the_pair_only(tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    load_parquet(db, stage(tmp_path / "a1", [1.0, 2.0, 3.0]), "pair-a")
    load_parquet(db, stage(tmp_path / "b", [5.0], run_id="run-h"), "pair-b")
    counts = load_parquet(db, stage(tmp_path / "a2", [1.0, 2.5]), "pair-a")
    assert counts["loss"] == 2 and counts["runs"] == 1 and counts["event_diffs"] == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT pair_id, count(*) FROM loss GROUP BY ALL ORDER BY ALL").fetchall() == [
        ("pair-a", 2),
        ("pair-b", 1),
    ]
    assert con.execute("SELECT count(*) FROM runs").fetchall() == [(2,)]
    assert set(PAIR_TABLES) <= {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def test_a_failed_load_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    load_parquet(db, stage(tmp_path / "good", [1.0]), "pair-a")
    bad = stage(tmp_path / "bad", [2.0, 3.0])
    (bad / "loss" / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(duckdb.Error):
        load_parquet(db, bad, "pair-a")
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT golden_loss FROM loss").fetchall() == [(1.0,)]


def test_refuses_what_it_cannot_load(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="holds no pairs"):
        load_parquet(tmp_path / "study.duckdb", tmp_path, "pair-a")
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE sdctrace_schema (version INTEGER); INSERT INTO sdctrace_schema VALUES (99)")
    con.close()
    with pytest.raises(UsageError, match="schema version \\[99\\]"):
        load_parquet(db, stage(tmp_path / "s", [1.0]), "pair-a")


def test_detector_tables_load_and_a_version_3_database_is_refused(tmp_path: Path) -> None:
    root = stage(tmp_path / "a", [1.0])
    rows = [
        {
            "rank": 0,
            "run_id": "run-s",
            "node_label": "n",
            "step": s,
            "detector": d,
            "fired": s == 1 and d == "guard",
            "faults": int(s == 1),
            "guarded": False,
        }
        for s in range(3)
        for d in ("loss_spike", "guard")
    ]
    (root / "detector_alarms").mkdir()
    pq.write_table(table("detector_alarms", rows), root / "detector_alarms" / "part.parquet")
    counts = load_parquet(tmp_path / "study.duckdb", root, "pair-a")
    assert counts["detector_alarms"] == 6 and counts["guard_decisions"] == 0
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as con:
        con.execute("CREATE TABLE sdctrace_schema (version INTEGER NOT NULL); INSERT INTO sdctrace_schema VALUES (3)")
    with pytest.raises(UsageError, match=rf"schema version \[3\], this sdctrace writes version {SCHEMA_VERSION}"):
        load_parquet(old, root, "pair-a")
