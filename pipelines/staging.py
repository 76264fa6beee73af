"""What the diff reads back from its staging directory before loading it: problems that fail it, runs that ended badly.

    with local_copy(staging) as local:          # the directory itself, or a download of a remote one
        check_problems(local, skip_corrupt, echo)
        report_runs(local, plan, echo)

Unreadable files (the ``errors`` table, never loaded) always fail the diff; corrupt
regions (``corruptions``) fail it unless ``--skip-corrupt``. A rank that crashed,
failed or was read past corruption gets one warning line.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipelines.plan import DiffPlan
from tracer.errors import LogCorruptionError, LogFormatError

Echo = Callable[[str], None]


@contextmanager
def local_copy(staging: str) -> Iterator[Path]:
    """The staging directory on this machine: itself if local, else a downloaded copy."""
    if Path(staging).is_dir():
        yield Path(staging)
        return
    with tempfile.TemporaryDirectory(prefix="sdc-staging-") as tmp:
        for m in FileSystems.match([FileSystems.join(staging, "*", "*.parquet")])[0].metadata_list:
            table_name, file_name = m.path.rstrip("/").split("/")[-2:]
            (Path(tmp) / table_name).mkdir(exist_ok=True)
            with FileSystems.open(m.path) as src, open(Path(tmp) / table_name / file_name, "wb") as dst:
                shutil.copyfileobj(src, dst)
        yield Path(tmp)


def check_problems(staging: Path, skip_corrupt: bool, echo: Echo) -> None:
    """Unreadable files always fail the diff; corruption fails it unless --skip-corrupt."""
    errors = _read(staging, "errors")
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise LogFormatError(f"{errors[0]['message']}{more}")
    corrupt = _read(staging, "corruptions")
    if corrupt and not skip_corrupt:
        first = corrupt[0]
        more = (
            f"; {len(corrupt) - 1} more corrupt region(s) in {', '.join(sorted({c['path'] for c in corrupt}))}"
            if len(corrupt) > 1
            else ""
        )
        raise LogCorruptionError(first["path"], first["offset"], first["reason"] + more)
    for c in corrupt:
        echo(f"  warning: skipped corrupt data in {c['path']} at byte {c['offset']}: {c['reason']}")


def report_runs(staging: Path, plan: DiffPlan, echo: Echo) -> None:
    """One line per rank of a run that did not close cleanly: crashed, failed, or read past corruption."""
    sides = {run_id: side for (side, _), run_id in plan.run_ids().items()}
    lost: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in _read(staging, "lost_ranges"):
        lost.setdefault((r["run_id"], r["rank"]), []).append(r)
    for r in sorted(_read(staging, "runs"), key=lambda r: (sides.get(r["run_id"], ""), r["rank"])):
        side, status = sides.get(r["run_id"], "run"), r["status"]
        where = f"{side} run {r['path']} rank {r['rank']}"
        step = "before completing its first step" if r["last_step"] is None else f"at step {r['last_step']}"
        if status == "crashed":
            echo(f"  warning: {where} crashed {step}: no END record (its records stop there)")
        elif status == "failed":
            echo(f"  warning: {where} failed {step}: training raised, the log was closed")
        elif status == "corrupt":
            ranges = lost.get((r["run_id"], r["rank"]), [])
            steps = ", ".join(
                f"{'?' if x['first_step'] is None else x['first_step']}.."
                f"{'end' if x['last_step'] is None else x['last_step']}"
                for x in ranges
            )
            echo(
                f"  warning: {where} is corrupt: at least {sum(x['records'] for x in ranges)} records lost, "
                f"steps {steps or 'none'} unknown (not compared as differences)"
            )


def _read(staging: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted((staging / name).glob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return sorted(rows, key=lambda r: (r["path"], r.get("offset") or 0))
