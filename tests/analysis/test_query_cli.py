"""`sdc query`: the listing, the three formats, and SQL that would write refused with the database untouched."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from analysis import formats, queries
from analysis.load import ensure_schema
from analysis.queries import Result
from sdc.cli import main
from tests.analysis.conftest import Study


def one_error_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `sdc ARGS` here; it must fail with exactly one `sdc: error:` line."""
    assert main(list(args)) == 1
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("sdc: error: ") and not captured.out, captured
    return lines[0]


def test_list_shows_every_query_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--list"]) == 0
    listed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    files = sorted(p.stem for p in Path(queries.__file__).parent.glob("*.sql"))
    assert sorted(listed) == files
    assert all(listed[name].strip() == queries.description(name) for name in files)


@pytest.mark.slow
def test_formats_agree_with_the_query(study: Study, capsys: pytest.CaptureFixture[str]) -> None:
    expected = queries.run(study.db, "rq1_mismatch_by_step")
    assert main(["query", "rq1_mismatch_by_step", "--db", str(study.db), "--format", "csv"]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert table[0] == expected.columns
    for got, row in zip(table[1:], expected.rows, strict=True):
        assert got == ["" if v is None else str(v) if not isinstance(v, float) else repr(v) for v in row]
        assert [float(g) for g, v in zip(got, row) if isinstance(v, float)] == [v for v in row if isinstance(v, float)]

    assert main(["query", "rq1_mismatch_by_step", "--db", str(study.db), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected.records()

    assert main(["query", "rq1_mismatch_by_step", "--db", str(study.db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rule, body = lines[0], lines[1], lines[2:-1]
    assert header.split() == expected.columns and set(rule.replace(" ", "")) == {"-"}
    assert lines[-1] == f"({len(expected.rows)} rows)"
    starts = [i for i, ch in enumerate(rule) if ch == "-" and (i == 0 or rule[i - 1] == " ")]
    for line, row in zip(body, expected.rows, strict=True):
        ends = [s + len(w) for s, w in zip(starts, rule.split())]
        cells = [line[s:e].strip() for s, e in zip(starts, ends)]
        assert cells == [formats.cell(v) for v in row]  # aligned under the rule, floats to 4 significant digits


def test_cell_and_json_spell_out_what_text_cannot() -> None:
    assert [formats.cell(v) for v in (None, True, 0.000123456, 1234567.0, 3, "a\nb", [1, 2])] == [
        "-",
        "true",
        "0.0001235",
        "1.235e+06",
        "3",
        "a\\nb",
        "[1, 2]",
    ]
    result = Result(["x", "y"], [(float("inf"), None), (float("nan"), -float("inf"))])
    assert json.loads(formats.json_text(result)) == [{"x": "Infinity", "y": None}, {"x": "NaN", "y": "-Infinity"}]
    assert formats.json_text(Result(["x"], [])) == "[]\n"


@pytest.mark.slow
def test_sql_reads(study: Study, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--sql", "SELECT count(*) AS n FROM pairs", "--db", str(study.db), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]


WRITES = [
    "DELETE FROM loss",
    "UPDATE loss SET golden_loss = 0",
    "INSERT INTO pairs (pair_id, golden_path, suspect_path, golden_run_id, suspect_run_id) "
    "VALUES ('x', 'a', 'b', 'c', 'd')",
    "DROP TABLE loss",
    "CREATE TABLE t AS SELECT 1",
    "CREATE TEMP TABLE t AS SELECT 1",
    "ALTER TABLE loss ADD COLUMN x INTEGER",
    "ATTACH '{tmp}/other.duckdb' AS other",
    "COPY loss TO '{tmp}/loss.csv'",
    "COPY (SELECT 1) TO '{tmp}/one.parquet' (FORMAT parquet)",
    "EXPORT DATABASE '{tmp}/export'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET threads = 1",
    "PRAGMA enable_profiling",
    "CHECKPOINT",
    "SELECT 1; DELETE FROM loss",
    "VACUUM",
    "SELECT * FROM read_csv('/etc/passwd')",
]


@pytest.mark.slow
@pytest.mark.parametrize("statement", WRITES)
def test_sql_that_writes_is_refused_and_changes_nothing(
    study: Study, tmp_path: Path, statement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = hashlib.sha256(study.db.read_bytes()).hexdigest()
    counts = queries.run(study.db, "SELECT (SELECT count(*) FROM loss), (SELECT count(*) FROM pairs)").rows
    sql = statement.format(tmp=tmp_path, db=study.db)
    line = one_error_line(capsys, "query", "--sql", sql, "--db", str(study.db))
    assert "refused" in line or "one SQL statement" in line or "disabled" in line, line
    assert hashlib.sha256(study.db.read_bytes()).hexdigest() == before
    assert queries.run(study.db, "SELECT (SELECT count(*) FROM loss), (SELECT count(*) FROM pairs)").rows == counts
    assert not list(tmp_path.iterdir())  # nothing written beside it either


@pytest.mark.parametrize(
    "statement, refused",
    [
        ("EXPLAIN ANALYZE CHECKPOINT", "refused EXPLAIN of a CALL"),  # ANALYZE runs the statement it explains
        ("explain analyse create temp table t as select 1", "refused EXPLAIN of a CREATE"),
        ("EXPLAIN (FORMAT json) CHECKPOINT", "refused EXPLAIN of a CALL"),
        ("EXPLAIN ANALYZE SELECT count(*) FROM loss", None),
        ("EXPLAIN (FORMAT json) SELECT 1", None),
    ],
)
def test_explain_explains_a_select_only(
    tmp_path: Path, statement: str, refused: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.load import load_parquet
    from tests.analysis.test_load import stage

    db = tmp_path / "study.duckdb"
    load_parquet(db, stage(tmp_path / "s", [1.0]), "pair-a")
    if refused is None:
        assert main(["query", "--sql", statement, "--db", str(db)]) == 0
    else:
        assert refused in one_error_line(capsys, "query", "--sql", statement, "--db", str(db))


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["summary", "--db", "{tmp}/missing.duckdb"], "no such study database"),
        (["summary", "--db", "{tmp}/junk.duckdb"], "cannot open as a DuckDB study database"),
        (["sumary", "--db", "{db}"], "did you mean summary,"),
        (["--sql", "SELECT * FROM no_such_table", "--db", "{db}"], "Table with name no_such_table does not exist"),
        (["--sql", "SELEC 1", "--db", "{db}"], "does not parse"),
        (["summary"], "--db FILE is required"),
        (["--db", "{db}"], "give a query NAME or --sql"),
        (["summary", "--sql", "SELECT 1", "--db", "{db}"], "give a query NAME or --sql"),
    ],
)
def test_user_errors_are_one_line(
    study: Study, tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "junk.duckdb").write_bytes(b"not a database" * 100)
    line = one_error_line(capsys, "query", *[a.format(tmp=tmp_path, db=study.db) for a in args])
    assert message in line, line


@pytest.mark.slow
def test_a_refused_write_is_one_line_from_the_shell(study: Study) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sdc.cli", "query", "--sql", "DELETE FROM loss", "--db", str(study.db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "sdc: error: refused a DELETE statement: queries are read-only, only SELECT (or EXPLAIN) runs here"
    ]


def test_a_query_of_tables_loaded_later_names_the_command_that_loads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "study.duckdb"
    con = duckdb.connect(str(db))
    ensure_schema(con)
    con.execute("DROP TABLE incident_verdicts")
    con.execute("DROP TABLE incident_signatures")  # a database `sdc diff` wrote before any bundle was loaded
    con.close()
    line = one_error_line(capsys, "query", "signature_groups", "--db", str(db))
    assert "incident_signatures" in line and "`sdc incident load BUNDLE --db DB` creates it" in line
