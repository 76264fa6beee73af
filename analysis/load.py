"""Load one pair's Parquet tables (the diff pipeline's staging directory) into a DuckDB file.

    load_parquet("study.duckdb", "staging/", pair_id)

Everything happens in one transaction: the pair's old rows (and the old rows of its
runs, in the tables keyed by run) are deleted, the new ones inserted, so loading a
pair again replaces it and a failed load leaves the database as it was. Many pairs and
nodes share one database. The database is opened read-write only through `analysis.study_db.open_writable`,
which creates a new file or opens one sdctrace wrote, and refuses anything else untouched.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from analysis.study_db import SCHEMA_VERSION, VERSION_TABLE, open_writable, schema_sql
from tracer.errors import UsageError

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


def load_parquet(db_path: str | Path, staging_dir: str | Path, pair_id: str) -> dict[str, int]:
    """Replace `pair_id`'s rows with those in `staging_dir`; rows loaded per table."""
    staging = Path(staging_dir)
    files = {t: sorted(str(p) for p in (staging / t).glob("*.parquet")) for t in TABLES}
    if not files["pairs"]:
        raise UsageError(f"{staging}: holds no pairs/*.parquet; expected the staging directory of one `sdc diff` run")
    wal = Path(f"{db_path}.wal")
    had_wal = wal.exists()
    con = open_writable(db_path)
    try:
        con.execute("BEGIN TRANSACTION")
        ensure_schema(con)
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
        rollback(con)
        con.close()
        if not had_wal and wal.is_file() and wal.stat().st_size == 0:
            wal.unlink()  # what a COMMIT that failed on a full disk leaves: the database is as it was without it
        raise
    con.close()
    return counts


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """The schema's tables and views, and the version row (`open_writable` checked any existing ones)."""
    con.execute(schema_sql())
    if not con.execute(f"SELECT count(*) FROM {VERSION_TABLE}").fetchone()[0]:
        con.execute(f"INSERT INTO {VERSION_TABLE} VALUES (?)", [SCHEMA_VERSION])


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Undo the open transaction; a failed COMMIT (a full disk) has ended it already, and DuckDB's complaint about
    that would hide the reason."""
    try:
        con.execute("ROLLBACK")
    except duckdb.TransactionException:
        pass


def _count(con: duckdb.DuckDBPyConnection, table: str, where: str, params: list) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE {where}", params).fetchone()[0]
