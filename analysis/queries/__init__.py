"""Named SQL queries over the study database, and a read-only way to run them or any SELECT.

    names()                                  # ["rq1_abft_by_fault_kind", ..., "summary"]
    description("summary")                   # the file's first line
    run("study.duckdb", "summary")           # a named query ...
    run("study.duckdb", "SELECT * FROM runs") # ... or one SELECT: Result(columns, rows)
    with LIBRARY.session("study.duckdb") as s: # several on one connection (a report, a diff's summary)
        s.run("summary"); s.run("rq3_loss_spikes")

Each query is one ``.sql`` file in this folder: first line ``-- <description>``, then a
chain of named CTEs, no parameters, a deterministic ORDER BY. Any ``.sql`` file dropped
here is a query; `sdc query`, `sdc report` and these functions all read them from here.

User SQL never changes anything: the database is opened read-only (`analysis.study_db.open_read_only`,
which refuses a file sdctrace did not write), only a single SELECT (or EXPLAIN of one) statement is
accepted, and file system access (COPY ... TO, ATTACH, INSTALL, read_csv) is switched off with
the configuration locked.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import duckdb

from analysis.study_db import duckdb_message, open_read_only
from tracer.errors import UsageError, ValidationError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
_EXPLAIN = re.compile(r"\s*EXPLAIN\s+(?:\([^()]*\)\s*)?(?:ANALY[SZ]E\s+)?", re.IGNORECASE)  # before what it explains


@dataclass(frozen=True)
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


class QueryLibrary:
    """The ``.sql`` files of one folder; the shipped one is `LIBRARY`."""

    def __init__(self, folder: Traversable | Path) -> None:
        self.folder = folder

    def names(self) -> list[str]:
        return sorted(f.name[:-4] for f in self.folder.iterdir() if f.name.endswith(".sql") and f.is_file())

    def sql(self, name: str) -> str:
        if name not in self.names():
            close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UsageError(f"no query named {name!r}; {hint}`sdc query --list` shows them all")
        return self.folder.joinpath(f"{name}.sql").read_text(encoding="utf-8")

    def description(self, name: str) -> str:
        first = self.sql(name).split("\n", 1)[0]
        return first.removeprefix("--").strip()

    def run(self, db_path: str | Path, name_or_sql: str) -> Result:
        """A query by name, or one SELECT statement, on a read-only connection to ``db_path``."""
        text = self._resolve(name_or_sql)
        with self.session(db_path) as session:
            return session.execute(text)

    @contextmanager
    def session(self, db_path: str | Path) -> Iterator[Session]:
        """Several queries on one read-only connection to ``db_path``: opening a study database (a DuckDB instance,
        then the catalog check) costs about 30 ms, a report's or a diff summary's query a few."""
        con = open_read_only(db_path)
        try:
            yield Session(self, db_path, con)
        finally:
            con.close()

    def _resolve(self, name_or_sql: str) -> str:
        """The SQL of a named query; else the text itself, unless it is one word that is not SQL (a mistyped name)."""
        word = name_or_sql.strip()
        if word in self.names():
            return self.sql(word)
        if _NAME.fullmatch(word):
            try:
                duckdb.extract_statements(word)
            except duckdb.Error:
                return self.sql(word)  # raises: no such query, with the closest names
        return name_or_sql


@dataclass(frozen=True)
class Session:
    """Queries of one library on one read-only connection (`QueryLibrary.session`)."""

    library: QueryLibrary
    db_path: str | Path
    con: duckdb.DuckDBPyConnection

    def run(self, name_or_sql: str) -> Result:
        """As `QueryLibrary.run`, on this session's connection."""
        return self.execute(self.library._resolve(name_or_sql))

    def execute(self, text: str) -> Result:
        _check_read_only(self.con, text)
        try:
            cursor = self.con.execute(text)
            columns = [d[0] for d in cursor.description]
            return Result(columns, cursor.fetchall())
        except duckdb.Error as exc:
            raise ValidationError(
                f"{self.db_path}: the query failed: {duckdb_message(exc)}{_later_table_hint(exc)}"
            ) from None


# Tables that `sdc diff` does not create: a command loads them into a study database later.
LOADED_LATER = {
    "incident_signatures": "sdc incident load BUNDLE --db DB",
    "incident_verdicts": "sdc incident load BUNDLE --db DB",
}


def _later_table_hint(exc: duckdb.Error) -> str:
    """For a table another command loads (`LOADED_LATER`), the command; else nothing."""
    if not isinstance(exc, duckdb.CatalogException):
        return ""
    for table, command in LOADED_LATER.items():
        if f"name {table} does not exist" in str(exc):
            return f" (nothing has been loaded into {table} yet: `{command}` creates it)"
    return ""


def _check_read_only(con: duckdb.DuckDBPyConnection, text: str) -> None:
    try:
        statements = con.extract_statements(text)
    except duckdb.Error as exc:
        raise ValidationError(f"the SQL does not parse: {duckdb_message(exc)}") from None
    if len(statements) != 1:
        raise UsageError(f"expected one SQL statement, found {len(statements)}; run them one at a time")
    kind = statements[0].type
    if kind not in _ALLOWED:
        raise UsageError(f"refused a {kind.name} statement: queries are read-only, only SELECT (or EXPLAIN) runs here")
    if kind == duckdb.StatementType.EXPLAIN:  # EXPLAIN ANALYZE runs what it explains: a SELECT only
        prefix = _EXPLAIN.match(text)
        inner = _statements(con, text[prefix.end() :]) if prefix else []
        if len(inner) != 1 or inner[0].type != duckdb.StatementType.SELECT:
            what = inner[0].type.name if len(inner) == 1 else "statement other than one SELECT"
            raise UsageError(f"refused EXPLAIN of a {what}: queries are read-only, only a SELECT is explained here")


def _statements(con: duckdb.DuckDBPyConnection, text: str) -> list[duckdb.Statement]:
    try:
        return con.extract_statements(text)
    except duckdb.Error:
        return []


LIBRARY = QueryLibrary(resources.files(__name__))
names = LIBRARY.names
sql = LIBRARY.sql
description = LIBRARY.description
run = LIBRARY.run
