"""A --db sdctrace did not create is refused in one line, by `sdc diff`, `sdc query` and `sdc report`, and is
left byte for byte as it was; a new --db is created and one sdctrace wrote is appended to (issue 31, case 6)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import duckdb
import pytest

from analysis.load import load_parquet
from analysis.study_db import SCHEMA_VERSION, check_study_db, open_read_only, schema_sql
from sdc.cli import main
from tests.analysis.test_load import stage
from tracer.errors import UsageError

FOREIGN = "a DuckDB database sdctrace did not create"
NOT_DUCKDB = "cannot open as a DuckDB study database"
CASES = {  # name: (SQL that makes the DuckDB file, or bytes for a file that is none, what the one line says)
    "another program's database": ("CREATE TABLE notes (x INTEGER); INSERT INTO notes VALUES (1)", FOREIGN),
    "its table runs": ("CREATE TABLE runs (x INTEGER)", FOREIGN),
    "its table loss": ("CREATE TABLE loss (step INTEGER, value DOUBLE)", FOREIGN),
    "its table event_diffs": ("CREATE TABLE event_diffs (x VARCHAR)", FOREIGN),
    "its view pairs": ("CREATE VIEW pairs AS SELECT 1 AS pair_id", FOREIGN),
    "its table pair_nodes": ("CREATE TABLE pair_nodes (x INTEGER)", FOREIGN),
    "its sdctrace_schema of other columns": ("CREATE TABLE sdctrace_schema (version VARCHAR, owner VARCHAR)", FOREIGN),
    "its sdctrace_schema as a view": ("CREATE VIEW sdctrace_schema AS SELECT 7 AS version", FOREIGN),
    "an empty database": ("", FOREIGN),
    "another schema version": (f"{schema_sql()}; INSERT INTO sdctrace_schema VALUES (3)", "schema version [3]"),
    "sdctrace's with a view for a table": (
        "CREATE TABLE sdctrace_schema (version INTEGER NOT NULL); "
        f"INSERT INTO sdctrace_schema VALUES ({SCHEMA_VERSION}); CREATE VIEW pairs AS SELECT 1 AS x",
        "its view 'pairs' is not the table of sdctrace's schema",
    ),
    "a text file": (b"my thesis\n" * 100, NOT_DUCKDB),
    "an empty file": (b"", NOT_DUCKDB),
}


def make(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
        return path
    con = duckdb.connect(str(path))
    try:
        if content:
            con.execute(content)
    finally:
        con.close()
    return path


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder``: its digest and mtime (nanoseconds)."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("case", CASES)
def test_diff_refuses_a_db_sdctrace_did_not_create_and_leaves_it_as_it_was(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    content, says = CASES[case]
    folder = tmp_path / "theirs"
    folder.mkdir()
    db = make(folder / "study.duckdb", content)
    before = snapshot(folder)
    line = one_line_error(capsys, ["diff", "--golden", str(pretrained), "--suspect", str(pretrained), "--db", str(db)])
    assert says in line and str(db) in line, line
    assert snapshot(folder) == before  # no byte, no mtime, no .wal, no scratch folder


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", [["query", "--sql", "SELECT 1"], ["query", "summary"], ["report", "--quiet"]])
def test_query_and_report_refuse_a_db_sdctrace_did_not_create(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, command: list[str]
) -> None:
    content, says = CASES[case]
    folder = tmp_path / "theirs"
    folder.mkdir()
    db = make(folder / "study.duckdb", content)
    before = snapshot(folder)
    out = ["--out", str(tmp_path / "report")] if command[0] == "report" else []
    line = one_line_error(capsys, [*command, *out, "--db", str(db)])
    assert says in line and str(db) in line, line
    assert snapshot(folder) == before


def test_a_new_db_is_created_and_one_sdctrace_wrote_is_appended_to(tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    check_study_db(db)  # a path that does not exist yet passes
    load_parquet(db, stage(tmp_path / "a", [1.0, 2.0]), "pair-a")
    check_study_db(db)
    load_parquet(db, stage(tmp_path / "b", [3.0], run_id="run-h"), "pair-b")
    con = open_read_only(db)
    try:
        assert con.execute("SELECT pair_id, count(*) FROM loss GROUP BY ALL ORDER BY ALL").fetchall() == [
            ("pair-a", 2),
            ("pair-b", 1),
        ]
        assert con.execute("SELECT version FROM sdctrace_schema").fetchall() == [(SCHEMA_VERSION,)]
    finally:
        con.close()


@pytest.mark.parametrize("case", ["its table runs", "its sdctrace_schema of other columns", "an empty database"])
def test_load_refuses_before_writing(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir()
    db = make(folder / "study.duckdb", CASES[case][0])
    before = snapshot(folder)
    with pytest.raises(UsageError, match=FOREIGN):
        load_parquet(db, stage(tmp_path / "s", [1.0]), "pair-a")
    assert snapshot(folder) == before


@pytest.mark.parametrize("kind", ["a FIFO (named pipe)", "a character device"])
def test_a_db_that_is_no_regular_file_is_named_for_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    db = tmp_path / "study.duckdb"
    os.mkfifo(db) if kind.startswith("a FIFO") else db.symlink_to("/dev/zero")
    for argv in (["query", "summary"], ["report", "--quiet", "--out", str(tmp_path / "report")]):
        line = one_line_error(capsys, [*argv, "--db", str(db)])
        assert f"--db {db}: is {kind}, not a study database" in line, line  # not "no such study database"
