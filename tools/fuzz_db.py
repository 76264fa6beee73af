"""The database kind of tools/fuzz_inputs.py: crafted study databases given to every command that reads one.

A base study database is made the way a user makes one (two tiny runs recorded, then ``sdc diff``), and each case
is a copy of it damaged one way, or a file that never was one:

- not DuckDB at all, under a ``.duckdb`` name: text, random bytes, an empty file, an SQLite header, a FIFO, a
  folder, a link to ``/dev/zero``;
- a DuckDB database sdctrace did not create: another program's tables, the base with ``sdctrace_schema`` dropped,
  emptied of its column or holding another version, a table of the schema with a column of another type, a column
  removed, renamed or added, a table replaced by a view;
- the base cut short or with a byte flipped, with tables of the schema dropped (a database may lack those `sdc diff` or
  `sdc incident load` has not created yet), or with values no diff writes (counts of 2^63 - 1 or -1, NaN and
  infinite doubles, strings of a megabyte or of terminal escapes, 100,000 more rows).

Each goes to one of ``sdc query summary``, ``sdc query --sql`` (a read-only SELECT of a user's), ``sdc report``,
``sdc certify RUN --golden G --db``, ``sdc diff --db`` and ``sdc incident load --db``. The first two groups must be
refused in one line naming the file, and a file sdctrace did not create keeps its bytes whatever the command's exit
(no ``.wal`` appears beside it either): ``data changed`` otherwise. The third may also succeed (``ok``): it is
sdctrace's database, holding what a user may ask about. A tenth of the cases give the base itself to
``sdc query --sql`` with SQL that would write, read files, attach, install or change a setting (``EXPLAIN ANALYZE``
of those too): refused in one line, the database's bytes unchanged, no file written where the SQL named one.
"""

from __future__ import annotations

import io
import os
import random
import shutil
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import duckdb

from tools.fuzz_case import Case

SQL = (  # a user's read-only SELECTs (sdc query --sql)
    "SELECT * FROM runs",
    "SELECT count(*) AS n, max(step) AS last FROM event_diffs",
    "SELECT * FROM first_divergence_ranked",
    "SELECT pair_id, sum(suspect_loss) FROM loss GROUP BY ALL ORDER BY ALL",
    "SELECT * FROM pair_status",
    "SELECT * FROM incident_signatures",
)
HOSTILE_SQL = (  # a user's SQL that would write, reach files or change settings: refused, the database unchanged
    "DELETE FROM runs",
    "CREATE TEMP TABLE t AS SELECT 1",
    "COPY runs TO '{marker}'",
    "ATTACH '{marker}' AS other",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('{db}')",
    "SELECT * FROM glob('/*')",
    "INSTALL httpfs",
    "SET enable_external_access = true",
    "PRAGMA enable_profiling",
    "CHECKPOINT",
    "SELECT 1; DROP TABLE runs",
    "EXPLAIN ANALYZE CHECKPOINT",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '{marker}'",
    "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
    "EXPLAIN ANALYZE SET threads = 7",
)
NOT_DUCKDB: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "text named .duckdb": lambda rng, base: b"my thesis, chapter %d\n" % rng.randrange(99) * 200,
    "random bytes": lambda rng, base: rng.randbytes(rng.choice([7, 4096, 300_000])),
    "empty file": lambda rng, base: b"",
    "SQLite file": lambda rng, base: b"SQLite format 3\x00" + bytes(4080),
}


@dataclass(frozen=True)
class Base:
    """What every database case is built from: a study database holding one pair, the pair's runs and a bundle
    `sdc incident load` reads."""

    db: Path
    golden: Path
    suspect: Path
    bundle: Path


def make_base(root: Path, bundle: Path) -> Base:
    """Record two tiny runs in ``root`` and diff them into ``root/db-base.duckdb``."""
    from jobs.record import record_run
    from sdc.cli import main as sdc_main
    from tests.support import small_config

    runs = {}
    for name in ("golden", "suspect"):
        runs[name] = root / f"db-{name}"
        record_run(small_config(), runs[name], node_label=name, progress=False)
    db = root / "db-base.duckdb"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        code = sdc_main(["diff", "--golden", str(runs["golden"]), "--suspect", str(runs["suspect"]), "--db", str(db)])
    assert code == 0, "the base study database could not be made"
    return Base(db, runs["golden"], runs["suspect"], bundle)


def _columns(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str]]:
    """(table, column, type) of every column of the schema's tables, in a stable order."""
    return con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE schema_name = 'main' "
        "AND table_name IN (SELECT table_name FROM duckdb_tables()) ORDER BY table_name, column_index"
    ).fetchall()


def _retyped(rng: random.Random, con: duckdb.DuckDBPyConnection) -> str:
    table, column, kind = rng.choice([c for c in _columns(con) if c[0] != "sdctrace_schema"])
    other = "VARCHAR" if kind != "VARCHAR" else "BIGINT"
    con.execute(f'CREATE OR REPLACE TABLE "{table}" AS SELECT * REPLACE (TRY_CAST("{column}" AS {other}) '
                f'AS "{column}") FROM "{table}"')  # fmt: skip
    return f"{table}.{column} {kind} -> {other}"


def _reshaped(rng: random.Random, con: duckdb.DuckDBPyConnection) -> str:
    table, column, _ = rng.choice([c for c in _columns(con) if c[0] not in ("sdctrace_schema",)])
    how = rng.choice(["drop", "rename", "add", "view"])
    if how == "drop" and len([c for c in _columns(con) if c[0] == table]) > 1:
        con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
    elif how == "rename":
        con.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{column}" TO "{column}_x"')
    elif how == "view":
        con.execute(f'CREATE TABLE "{table}_copy" AS FROM "{table}"; DROP TABLE "{table}"; '
                    f'CREATE VIEW "{table}" AS FROM "{table}_copy"')  # fmt: skip
        return f"{table} a view"
    else:
        con.execute(f'ALTER TABLE "{table}" ADD COLUMN extra_x INTEGER')
        return f"{table} + a column"
    return f"{table}.{column} {how}"


def _version(rng: random.Random, con: duckdb.DuckDBPyConnection) -> str:
    how = rng.choice(["dropped", "version 3", "two versions", "as text", "another program"])
    if how == "dropped":
        con.execute("DROP TABLE sdctrace_schema")
    elif how == "version 3":
        con.execute("UPDATE sdctrace_schema SET version = 3")
    elif how == "two versions":
        con.execute("INSERT INTO sdctrace_schema VALUES (99)")
    elif how == "as text":
        con.execute("DROP TABLE sdctrace_schema; CREATE TABLE sdctrace_schema (version VARCHAR); "
                    "INSERT INTO sdctrace_schema VALUES ('7')")  # fmt: skip
    else:
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall():
            con.execute(f'DROP TABLE "{table}" CASCADE')
        con.execute("CREATE TABLE notes (x INTEGER); INSERT INTO notes VALUES (1)")
    return f"sdctrace_schema {how}"


def _dropped(rng: random.Random, con: duckdb.DuckDBPyConnection) -> str:
    tables = sorted({c[0] for c in _columns(con)} - {"sdctrace_schema"})
    gone = rng.sample(tables, rng.choice([1, 3, len(tables)]))
    for table in gone:
        con.execute(f'DROP TABLE "{table}"')
    return f"{len(gone)} table(s) dropped ({', '.join(gone)[:40]})"


def _odd_values(rng: random.Random, con: duckdb.DuckDBPyConnection) -> str:
    numeric = {"BIGINT": ["9223372036854775807", "-1"], "INTEGER": ["2147483647", "-1"],
               "DOUBLE": ["'nan'::DOUBLE", "'inf'::DOUBLE", "-1e308"], "VARCHAR": [
                   "repeat('x', 1000000)", "chr(27) || '[31mred' || chr(13)", "''"]}  # fmt: skip
    cells = [c for c in _columns(con) if c[2] in numeric and c[0] != "sdctrace_schema"]
    if rng.random() < 0.2:
        table = rng.choice(["event_diffs", "loss", "param_drift", "runs"])
        con.execute(f'INSERT INTO "{table}" SELECT "{table}".* FROM "{table}", range(100000 // '
                    f'(SELECT greatest(count(*), 1) FROM "{table}"))')  # fmt: skip
        return f"{table} + 100,000 rows"
    table, column, kind = rng.choice(cells)
    value = rng.choice(numeric[kind])
    con.execute(f'UPDATE "{table}" SET "{column}" = {value}')
    return f"{table}.{column} = {value[:24]}"


CHANGES: dict[str, tuple[Callable[[random.Random, duckdb.DuckDBPyConnection], str], bool]] = {
    # name: (the change, whether the result is still sdctrace's database: it may then be read, and written to)
    "retyped": (_retyped, False),
    "reshaped": (_reshaped, False),
    "version": (_version, False),
    "dropped": (_dropped, True),
    "odd values": (_odd_values, True),
}


def _craft(path: Path, base: Base, rng: random.Random) -> tuple[str, bool]:
    """Write one crafted database at ``path``; (what it is, whether sdctrace could have written it)."""
    roll = rng.random()
    if roll < 0.3:
        name = rng.choice(sorted(NOT_DUCKDB))
        path.write_bytes(NOT_DUCKDB[name](rng, base.db.read_bytes()))
        return name, False
    if roll < 0.38:
        how = rng.choice(["fifo", "dir", "dev-zero"])
        {"fifo": os.mkfifo, "dir": Path.mkdir, "dev-zero": lambda p: p.symlink_to("/dev/zero")}[how](path)
        return f"-> {how}", False
    shutil.copy(base.db, path)
    if roll < 0.45:  # sdctrace's, damaged: read (and written to) as far as DuckDB can, else refused, unchanged
        data = bytearray(path.read_bytes())
        if rng.random() < 0.5:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
            return "byte flipped", True
        cut = rng.choice([8, 4096, 12_288, 262_144, len(data) // 2, len(data) - 1])
        path.write_bytes(bytes(data[:cut]))
        return f"cut to {cut:,} bytes", True
    kind = rng.choice(sorted(CHANGES))
    change, sdctraces = CHANGES[kind]
    con = duckdb.connect(str(path))
    try:
        done = change(rng, con)
    finally:
        con.close()
    return done, sdctraces


def _argv(rng: random.Random, db: Path, base: Base, out: Path) -> tuple[str, ...]:
    golden, suspect = str(base.golden), str(base.suspect)
    return rng.choice(
        [
            ("query", "summary", "--db", str(db)),
            ("query", "--sql", rng.choice(SQL), "--db", str(db), "--format", rng.choice(["table", "csv", "json"])),
            ("report", "--db", str(db), "--out", str(out), "--quiet"),
            ("certify", suspect, "--golden", golden, "--db", str(db)),
            ("diff", "--golden", golden, "--suspect", suspect, "--db", str(db)),
            ("incident", "load", str(base.bundle), "--db", str(db)),
        ]
    )


def db_cases(root: Path, n: int, rng: random.Random, bundle: Path) -> list[Case]:
    """``n`` crafted databases in ``root``, each with the command that reads it."""
    base = make_base(root, bundle)
    cases = []
    for i in range(n):
        db = root / f"db-{i}.duckdb"
        if rng.random() < 0.1:  # sdctrace's own database, a user's SQL crafted to change it or reach beyond it
            shutil.copy(base.db, db)
            marker = root / f"db-marker-{i}"
            sql = rng.choice(HOSTILE_SQL).format(marker=marker, db=db)
            argv = ("query", "--sql", sql, "--db", str(db))
            cases.append(Case("database", f"query --sql {sql[:40]}", argv, "", str(db), str(marker), foreign=True))
            continue
        name, sdctraces = _craft(db, base, rng)
        argv = _argv(rng, db, base, root / f"db-report-{i}")
        cases.append(
            Case(
                "database", f"{argv[0]}: {name}", argv, str(db), str(db), foreign=not sdctraces, may_succeed=sdctraces
            )  # fmt: skip
        )
    return cases
