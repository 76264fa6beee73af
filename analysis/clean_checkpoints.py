"""The queries `sdc certify` reads: which pair of a study database compares two runs, and the named query
``last_clean_checkpoint``'s rows of that pair (analysis/QUERIES.md), on a read-only connection.

    pair_id = newest_pair("study.duckdb", golden_run_id, suspect_run_id)   # None: not diffed into it yet
    rows = clean_checkpoint_rows("study.duckdb", pair_id)                   # one per rank
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from analysis import queries
from analysis.study_db import duckdb_message, open_read_only
from tracer.errors import ValidationError

_NEWEST_PAIR = """
SELECT pair_id
FROM pairs
WHERE golden_run_id = ? AND suspect_run_id = ?
ORDER BY created_unix DESC
LIMIT 1
"""


def newest_pair(db: str | Path, golden_run_id: str, suspect_run_id: str) -> str | None:
    """The pair_id of the newest pair in ``db`` of these two runs (their lowest rank's run ids); None: none."""
    rows = _read(db, _NEWEST_PAIR, [golden_run_id, suspect_run_id])
    return None if not rows else str(rows[0]["pair_id"])


def clean_checkpoint_rows(db: str | Path, pair_id: str) -> list[dict[str, Any]]:
    """The named query ``last_clean_checkpoint``'s rows of one pair, one per rank, in rank order."""
    sql = f"SELECT * FROM ({queries.sql('last_clean_checkpoint')}) WHERE pair_id = ? ORDER BY rank"
    return _read(db, sql, [pair_id])


def _read(db: str | Path, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """The rows of ``sql`` on a read-only connection to ``db``; a database DuckDB cannot read them from (a table
    dropped, a damaged block) is one ValidationError naming it."""
    con = open_read_only(db)
    try:
        cursor = con.execute(sql, params)
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]
    except duckdb.Error as exc:
        raise ValidationError(
            f"--db {db}: its pairs could not be read ({duckdb_message(exc)}); give certify a --db `sdc diff` wrote "
            "whole, a new path, or no --db (a temporary one)"
        ) from None
    finally:
        con.close()
