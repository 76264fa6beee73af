"""Load one pair's Parquet tables (the diff pipeline's staging directory) into a DuckDB file.

    load_parquet("study.duckdb", "staging/", pair_id)

Everything happens in one transaction: the pair's old rows (and the old rows of its
runs, in the tables keyed by run) are deleted, the new ones inserted, so loading a
pair again replaces it and a failed load leaves the database as it was. Many pairs and
nodes share one database. This is the only place that opens the database read-write.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import duckdb

from tracer.errors import UsageError

SCHEMA_VERSION = 7
# Tables keyed by (run_id, rank), shared by every pair a run belongs to; the runs loaded are those in <staging>/runs.
RUN_TABLES = ("runs", "finetune_eval", "finetune_predictions", "sharpness")
# Tables holding a pair_id column, each loaded from <staging>/<table>/*.parquet.
PAIR_TABLES = (
    "pairs",
    "pair_ranks",
    "event_diffs",
    "first_divergence",
    "divergence_steps",
    "loss",
    "loss_spikes",
    "param_drift",
    "site_mismatch",
    "grad_noise",
    "faults",
    "abft",
    "detection_scores",
    "detector_alarms",
    "guard_decisions",
    "corruptions",
    "lost_ranges",
)
TABLES = (*RUN_TABLES, *PAIR_TABLES)


def schema_sql() -> str:
    return resources.files("analysis").joinpath("schema.sql").read_text()


def connect_writable(db_path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-write connection to the study database; a directory, a file that is no DuckDB database or a database
    another process holds are one-line UsageErrors naming --db and the fix."""
    from analysis.queries import open_error

    path = Path(db_path)
    if path.is_dir():
        raise UsageError(f"--db {path}: is a directory, not a study database; give a .duckdb file path")
    try:
        return duckdb.connect(str(path))
    except duckdb.Error as exc:
        raise open_error(path, exc) from None


def load_parquet(db_path: str | Path, staging_dir: str | Path, pair_id: str) -> dict[str, int]:
    """Replace `pair_id`'s rows with those in `staging_dir`; rows loaded per table."""
    staging = Path(staging_dir)
    files = {t: sorted(str(p) for p in (staging / t).glob("*.parquet")) for t in TABLES}
    if not files["pairs"]:
        raise UsageError(f"{staging}: holds no pairs/*.parquet; expected the staging directory of one `sdc diff` run")
    con = connect_writable(db_path)
    try:
        con.execute("BEGIN TRANSACTION")
        _ensure_schema(con, db_path)
        counts = {}
        loaded = "(run_id, rank) IN (SELECT (run_id, rank) FROM read_parquet(?))"
        for t in RUN_TABLES:
            if files["runs"]:
                con.execute(f"DELETE FROM {t} WHERE {loaded}", [files["runs"]])
                if files[t]:
                    con.execute(f"INSERT INTO {t} BY NAME SELECT * FROM read_parquet(?)", [files[t]])
            counts[t] = _count(con, t, loaded, [files["runs"]]) if files["runs"] else 0
        for t in PAIR_TABLES:
            con.execute(f"DELETE FROM {t} WHERE pair_id = ?", [pair_id])
            if files[t]:
                con.execute(f"INSERT INTO {t} BY NAME SELECT ? AS pair_id, * FROM read_parquet(?)", [pair_id, files[t]])
            counts[t] = _count(con, t, "pair_id = ?", [pair_id])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        con.close()
    return counts


def _ensure_schema(con: duckdb.DuckDBPyConnection, db_path: str | Path) -> None:
    con.execute(schema_sql())
    found = [v for (v,) in con.execute("SELECT DISTINCT version FROM sdctrace_schema").fetchall()]
    if not found:
        con.execute("INSERT INTO sdctrace_schema VALUES (?)", [SCHEMA_VERSION])
    elif found != [SCHEMA_VERSION]:
        raise UsageError(
            f"{db_path}: a study database of schema version {found}, this sdctrace writes version {SCHEMA_VERSION}; "
            "load into a new --db file"
        )


def _count(con: duckdb.DuckDBPyConnection, table: str, where: str, params: list) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE {where}", params).fetchone()[0]
