"""The study database file: the one place that opens it, and that decides whether a file is one sdctrace wrote.

    check_study_db(path)          # an existing file: sdctrace's, of this schema version, or a one-line UsageError
    db_written_by_sdctrace(path)  # sdctrace's, of any schema version: what an --overwrite may delete
    con = open_writable(path)     # a new file is created; sdctrace's is opened; anything else refused, untouched
    con = open_read_only(path)    # sdctrace's only: read-only, no file system access, configuration locked
    publish_new_db(loaded, path)  # a database loaded in a scratch folder becomes `path` whole, or not at all

A file is sdctrace's when DuckDB opens it and it holds a table ``sdctrace_schema`` with exactly the
column ``version INTEGER`` (what ``schema.sql`` creates) whose rows name `SCHEMA_VERSION` (or none yet),
and every other table or view ``schema.sql`` declares is either absent or of the declared kind and
columns. Anything else, a foreign DuckDB database, a study database of another schema version, a file
that is not DuckDB at all, is refused in one line naming the file and the fix, before anything is
written: the check opens an existing file read-only, so a refused file keeps its bytes and its mtime.
"""

from __future__ import annotations

import errno
import functools
import os
from importlib import resources
from pathlib import Path

import duckdb

from tracer.bounded_read import FILE_KINDS
from tracer.errors import StorageError, UsageError

SCHEMA_VERSION = 7
VERSION_TABLE = "sdctrace_schema"
# Read-only connections run one thread: DuckDB's parallel aggregates of doubles (sums, regr_slope, var_pop) combine
# in any order, so the same query could differ in its last bits from run to run; named queries and the report must not.
LOCKED = {"enable_external_access": False, "threads": 1, "lock_configuration": True}
MESSAGE_CHARS = 300  # DuckDB's advice after a failed CSV sniff alone runs to a kilobyte
_NEW_PATH = "give a new --db path (sdctrace creates it) or a study database `sdc diff` wrote"


def schema_sql() -> str:
    return resources.files("analysis").joinpath("schema.sql").read_text()


def open_read_only(db_path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to a study database sdctrace wrote, without file system access, configuration locked."""
    path = Path(db_path)
    if path.is_dir():
        raise UsageError(f"--db {path}: is a directory, not a study database; name the .duckdb file `sdc diff` wrote")
    if not path.is_file():
        kind = _not_a_file(path)
        if kind:
            raise UsageError(f"--db {path}: is {kind}, not a study database; name the .duckdb file `sdc diff` wrote")
        raise UsageError(f"{path}: no such study database; create it with `sdc diff ... --db {path}`")
    try:
        con = duckdb.connect(str(path), read_only=True, config=dict(LOCKED))
    except duckdb.Error as exc:
        raise open_error(path, exc) from None
    try:
        check_catalog(con, path)
    except BaseException:
        con.close()
        raise
    return con


def _not_a_file(path: Path) -> str | None:
    """What ``path`` is when it exists and is no regular file (a FIFO, a device: never opened), else None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")


def check_study_db(db_path: str | Path) -> None:
    """Refuse an existing file that is not a study database this sdctrace writes; opened read-only, so left as it
    was. A path that does not exist passes (`open_writable` creates it)."""
    path = Path(db_path)
    if path.exists() or path.is_symlink():
        open_read_only(path).close()


def db_written_by_sdctrace(db_path: str | Path) -> bool:
    """Whether an existing file is a study database some sdctrace wrote, of any schema version (it holds the
    version table): what an ``--overwrite`` may delete. Opened read-only, so left as it was."""
    try:
        con = duckdb.connect(str(db_path), read_only=True, config=dict(LOCKED))
        try:
            return (
                con.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [VERSION_TABLE]
                ).fetchone()[0]
                > 0
            )
        finally:
            con.close()
    except duckdb.Error:
        return False


def open_writable(db_path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-write connection: to a new file (created), or to a study database sdctrace wrote (checked read-only
    first, then again on this connection). Anything else is a one-line UsageError and the file is not touched."""
    path = Path(db_path)
    new = not (path.exists() or path.is_symlink())
    if not new:
        check_study_db(path)
    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as exc:
        raise open_error(path, exc) from None
    try:
        if not new:
            check_catalog(con, path)
    except BaseException:
        con.close()
        raise
    return con


def publish_new_db(loaded: Path, db_path: str | Path) -> None:
    """Make ``loaded``, a new database written in a scratch folder on the same file system, the file ``db_path``:
    its write-ahead log merged into it first (a full disk fails here, before anything is at ``db_path``), then
    linked there in one step, never over a file that appeared there meanwhile."""
    path = Path(db_path)
    con = open_writable(loaded)
    try:
        con.execute("CHECKPOINT")
    except duckdb.Error as exc:
        raise StorageError(f"{path}: could not write the new study database: {duckdb_message(exc)}") from None
    finally:
        con.close()
    if loaded.with_name(loaded.name + ".wal").exists():
        raise StorageError(f"{path}: DuckDB left a write-ahead log beside the new database; nothing was created")
    try:
        os.link(loaded, path)
    except FileExistsError:
        raise UsageError(
            f"--db {path}: created by another process while this diff ran; nothing was written to it, "
            "run the diff again to add this pair to it"
        ) from None
    except OSError as exc:  # a file system without hard links
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV) or path.exists() or path.is_symlink():
            raise
        os.rename(loaded, path)


def check_catalog(con: duckdb.DuckDBPyConnection, path: str | Path) -> None:
    """The rule of this module's docstring, on an open connection (a database with nothing in it is foreign too:
    sdctrace creates its schema in the transaction that creates the file)."""
    found = dict(
        con.execute(
            "SELECT table_name, 'table' FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = 'main' UNION ALL SELECT view_name, 'view' FROM duckdb_views() "
            "WHERE NOT internal AND database_name = current_database() AND schema_name = 'main'"
        ).fetchall()
    )
    declared = _declared()
    columns = _columns(con)
    if found.get(VERSION_TABLE) != "table" or columns.get(VERSION_TABLE) != declared[VERSION_TABLE][1]:
        raise UsageError(
            f"--db {path}: a DuckDB database sdctrace did not create (no {VERSION_TABLE} table of one column "
            f"`version INTEGER`); sdctrace never writes into another program's database: {_NEW_PATH}"
        )
    versions = [v for (v,) in con.execute(f"SELECT DISTINCT version FROM {VERSION_TABLE} ORDER BY 1").fetchall()]
    if versions and versions != [SCHEMA_VERSION]:
        raise UsageError(
            f"{path}: a study database of schema version {versions}, this sdctrace writes version {SCHEMA_VERSION} "
            "(and reads only that); diff into a new --db file, or use the sdctrace that wrote it"
        )
    for name, (kind, declared_columns) in declared.items():
        if name not in found:
            continue
        if found[name] != kind or (kind == "table" and columns.get(name, []) != declared_columns):
            raise UsageError(
                f"--db {path}: its {found[name]} {name!r} is not the {kind} of sdctrace's schema "
                f"(analysis/SCHEMA.md); {_NEW_PATH}"
            )


def open_error(path: Path, exc: BaseException) -> UsageError:
    """The one-line error for a study database DuckDB cannot open: locked by another process, or not a database."""
    text = duckdb_message(exc)
    if "lock" in text.lower():
        return UsageError(
            f"--db {path}: locked by another process that has it open for writing ({text}); wait for that `sdc diff` "
            "or other DuckDB writer to finish (or close it), or use another --db"
        )
    return UsageError(
        f"--db {path}: cannot open as a DuckDB study database ({text}); give the .duckdb file `sdc diff` wrote, "
        "or a new path"
    )


def duckdb_message(exc: BaseException) -> str:
    """DuckDB's message up to its ``LINE n:`` excerpt, on one line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("LINE ")), len(lines))
    text = " ".join(lines[:cut] or lines)
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[str, str]]]:
    """Every table of the main schema: name -> [(column, type)] in column order, in one catalog query (a named
    query opens the database each time, and the check runs on every open)."""
    tables: dict[str, list[tuple[str, str]]] = {}
    for table, column, data_type in con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' ORDER BY table_name, column_index"
    ).fetchall():
        tables.setdefault(table, []).append((column, data_type))
    return tables


@functools.cache
def _declared() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Every table and view ``schema.sql`` declares: name -> (kind, [(column, type)])."""
    con = duckdb.connect()
    try:
        con.execute(schema_sql())
        kinds = con.execute(
            "SELECT table_name, 'table' FROM duckdb_tables() UNION ALL "
            "SELECT view_name, 'view' FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
        columns = _columns(con)
        return {name: (kind, columns.get(name, [])) for name, kind in kinds}
    finally:
        con.close()
