"""Diff a golden and a suspect run (and replay logs) into a DuckDB study database.

    python -m pipelines.run --golden runs/A --suspect runs/B [--replay runs/R ...] --db study.duckdb [beam options]
    sdc diff --golden runs/A --suspect runs/B --db study.duckdb [-- beam options]

Stages (docs/pipelines.md): parse (describe the runs, read their headers) -> pair
(validate, fail listing every differing field: `pipelines.plan`) -> key -> join -> diff
(the Beam job: `pipelines.beam_job`, on the runner `pipelines.runner_options` picks)
-> write (Parquet in a staging directory, checked by `pipelines.staging`, then
`analysis.load` into DuckDB in one transaction) -> summarise (`analysis.pair_summary`).

Options this module does not define pass through to Beam (``--runner``,
``--direct_num_workers``, ``--dask_client_address``, ...). Without ``--runner`` the
job runs on Beam's FnApiRunner, in this process below
`pipelines.runner_options.IN_MEMORY_BYTES` of logs, else in a worker process per core.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from apache_beam.io.filesystems import FileSystems
from apache_beam.runners.runner import PipelineState

from analysis.load import load_parquet
from analysis.pair_summary import summarize_pair
from analysis.study_db import check_study_db, duckdb_message, publish_new_db
from pipelines.arguments import DiffRequest, add_arguments
from pipelines.beam_job import build_pipeline, job_counters, run_job
from pipelines.plan import plan_diff
from pipelines.runner_options import describe_runner, new_pipeline, pipeline_options
from pipelines.scratch import beam_temp, scratch_dir
from pipelines.sink import write_table
from pipelines.staging import Echo, check_problems, local_copy, report_runs
from pipelines.tables import table
from tracer.errors import SdcError, StorageError, UsageError
from tracer.full_disk import full_disk_reason
from tracer.printable import printable

HEARTBEAT_S = 15.0


@dataclass
class DiffReport:
    pair_id: str
    staging: str
    rows: dict[str, int] = field(default_factory=dict)  # loaded rows per table
    counters: dict[str, int] = field(default_factory=dict)  # Beam metrics, where the runner reports them
    pipeline_s: float = 0.0


def diff(request: DiffRequest, echo: Echo = print) -> DiffReport:
    """`sdc diff`: plan, run the Beam job, check what it found, load into DuckDB, summarise. Every line goes through
    `printable`: node labels, run ids, paths and site names come from the logs and the database."""
    echo = _printable(echo)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    # Beam logs a failing step's error with its traceback, then re-raises it here, where it becomes one line (or a
    # traceback of its own, if it is no error a user can cause): its log would print the traceback twice.
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    echo("reading run headers ...")
    plan = plan_diff(request)
    for side, run in plan.sides().items():
        h = run.header
        segments = sum(len(r.segments) for r in run.ranks.values())
        echo(
            f"  {side:<8} {run.path}: run {h.run_id[:12]}, node {h.node_label!r}, role {h.role}, "
            f"{len(run.ranks)} rank(s), {segments} segment(s)"
        )
    h = plan.golden.header
    match = "baseline pair, data order differs" if plan.baseline else "headers match"
    echo(
        f"[1/3] pair {plan.pair_id}: {match} (config {h.config_fingerprint[:12]}, seed {h.seed}, "
        f"world size {h.world_size}); {len(plan.drift)} checkpoint pair(s) for drift"
    )
    for warning in plan.warnings:
        echo(f"      warning: setting differs: {warning}")
    if plan.tolerance is not None:
        echo(
            f"      tolerance map {plan.tolerance.source}: {len(plan.tolerance.places)} place(s) compared within "
            "their band"
        )
    opts = pipeline_options(request.beam_args, sum(run.bytes for run in plan.sides().values()))
    keep = request.staging is not None
    if keep and FileSystems.match([FileSystems.join(request.staging, "**")])[0].metadata_list:
        raise UsageError(
            f"--staging {request.staging}: not empty; give an empty or new directory (all its "
            "Parquet is loaded as this pair's)"
        )
    check_study_db(request.db)  # a foreign, other-version, unreadable or locked --db fails now, untouched
    parent = request.db.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = request.staging or scratch_dir(parent, "staging")
    # A new database is loaded beside its place and linked there whole: a failed diff leaves none, not a part.
    new_db = None if request.db.exists() else Path(scratch_dir(parent, "db")) / request.db.name
    report = DiffReport(plan.pair_id, staging)
    stage = f"the Beam job writing Parquet to {staging}"
    try:
        echo(f"[2/3] Beam job on {describe_runner(opts)}, Parquet to {staging} ...")
        start = time.perf_counter()
        with _heartbeat(echo, start), beam_temp():
            p = new_pipeline(opts)
            build_pipeline(p, plan, staging)
            result, state = run_job(p)
        report.pipeline_s = time.perf_counter() - start
        if state != PipelineState.DONE:
            raise SdcError(f"the Beam job ended in state {state}; see the runner's log")
        write_table(staging, "pairs", table("pairs", [plan.pair_row()]))
        report.counters = c = job_counters(result)
        counts = (
            (
                f": {c.get('segments_read', 0)} segment(s), {c.get('tensor_records', 0):,} tensor records, "
                f"{c.get('events_compared', 0):,} events compared"
            )
            if c
            else " (this runner reports no metrics)"
        )
        echo(f"      done in {report.pipeline_s:.1f} s{counts}")
        with local_copy(staging) as local:
            check_problems(local, request.skip_corrupt, echo)
            report_runs(local, plan, echo)
            echo(f"[3/3] loading into {request.db} ...")
            stage = f"loading into {request.db}"
            report.rows = load_parquet(new_db or request.db, local, plan.pair_id)
        if new_db is not None:
            publish_new_db(new_db, request.db)
    except Exception as exc:
        if (reason := full_disk_reason(exc)) is not None:
            kept = "no database was created" if new_db is not None else f"{request.db} is as it was"
            raise StorageError(
                f"{stage}: {reason}; {kept}. Free space there (or raise the file size limit), or "
                "give --staging / --db on another file system, and run the diff again"
            ) from None
        if isinstance(exc, duckdb.Error):
            raise StorageError(
                f"{stage}: DuckDB failed: {duckdb_message(exc)}; "
                f"{'no database was created' if new_db is not None else 'the database is as it was'}"
            ) from None
        raise
    finally:
        if not keep:
            shutil.rmtree(staging, ignore_errors=True)
        if new_db is not None:
            shutil.rmtree(new_db.parent, ignore_errors=True)
    for line in summarize_pair(request.db, plan.pair_id):
        echo(line)
    return report


def _printable(echo: Echo) -> Echo:
    def say(line: str) -> None:
        echo(printable(line))

    return say


@contextmanager
def _heartbeat(echo: Echo, start: float) -> Iterator[None]:
    """A line every HEARTBEAT_S while the runner works: Beam's own logs stay at WARNING."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            echo(f"      ... running, {time.perf_counter() - start:.0f} s")

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    known, beam_args = parser.parse_known_args(argv)
    diff(DiffRequest.from_args(known, beam_args))
    return 0


if __name__ == "__main__":
    sys.exit(run())
