"""The same job on a real distributed engine: Beam's DaskRunner against a local dask.distributed cluster.

Dataflow, Flink and Spark download a job server or binary at run time, which an
offline machine cannot; the DaskRunner runs the unchanged pipeline on separate
worker processes, so it shows the job has no single-process assumptions.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analysis.load import RUN_TABLES
from tests.pipelines.conftest import IN_MEMORY

pytestmark = pytest.mark.slow  # a Dask cluster and two Beam jobs

distributed = pytest.importorskip("dask.distributed", reason="install the test extra: pip install -e '.[test]'")

DASK = "apache_beam.runners.dask.dask_runner.DaskRunner"
# Columns that differ between two diffs of the same pair by design.
VOLATILE = {"pairs": ["created_unix"]}


def tables(db: Path, pair_id: str) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE table_name <> 'sdctrace_schema'"
        ).fetchall():
            every = [
                c
                for (c,) in con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [name]
                ).fetchall()
            ]
            columns = [c for c in every if c not in VOLATILE.get(name, [])]
            # a pair's rows; whole tables keyed by run (RUN_TABLES) or by none (incident_*: `sdc incident load`'s)
            by_pair = name not in RUN_TABLES and "pair_id" in every
            where = "WHERE pair_id = ?" if by_pair else ""
            select = ", ".join(f'"{c}"' for c in columns)
            out[name] = sorted(
                con.execute(f"SELECT {select} FROM {name} {where}", [pair_id] if by_pair else []).fetchall(),
                key=repr,
            )
        return out
    finally:
        con.close()


def test_dask_cluster_gives_the_directrunner_tables(runs, run_diff, tmp_path: Path) -> None:
    replays = (str(runs["replay"]),)
    direct, _ = run_diff(runs["golden"], runs["hooked"], replays=replays, beam=IN_MEMORY, db=tmp_path / "direct.duckdb")
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        dask, lines = run_diff(
            runs["golden"],
            runs["hooked"],
            replays=replays,
            db=tmp_path / "dask.duckdb",
            beam=["--runner", DASK, f"--dask_client_address={cluster.scheduler_address}"],
        )
    assert any("Beam job on DaskRunner" in line for line in lines)
    expected, got = tables(tmp_path / "direct.duckdb", direct.pair_id), tables(tmp_path / "dask.duckdb", dask.pair_id)
    assert expected["event_diffs"] and expected["first_divergence"] and expected["site_mismatch"]
    assert got == expected
