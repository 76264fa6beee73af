"""`sdc record --resume`: a recording killed mid-run and resumed gives the records of an uninterrupted one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from jobs.record import record_run
from pipelines.arguments import DiffRequest
from pipelines.run import diff
from sdc.cli import main
from tests.support import small_config
from tracer.compare import compare_runs
from tracer.errors import UsageError
from tracer.log import EventRecord, LogReader, TensorRecord, rank_dir
from tracer.log.sessions import RESUME

pytestmark = pytest.mark.slow  # records three small runs, one in a subprocess that dies

STEPS = ["run.steps=8", "run.checkpoint_every=3"]
# Dies at the end of step 5, the way a killed process does: no END, whatever the I/O thread had not written is lost.
DIES = """
import os, sys
from tests.support import small_config
from jobs.record import record_run
def die(step, loss):
    if step == 5:
        os._exit(9)
record_run(small_config(*sys.argv[2:]), sys.argv[1], node_label="node", progress=False, on_step=die)
"""


def timeline(run: Path) -> list[tuple]:
    """Every record, but the `step` events' wall times and the resume marker."""
    out = []
    for r in LogReader(rank_dir(run, 0)).records():
        if isinstance(r, TensorRecord):
            out.append(r)
        elif r.kind != RESUME:
            out.append((r.kind, r.step, {k: v for k, v in r.fields.items() if k != "wall_s"}))
    return out


def test_a_killed_recording_resumes_to_the_records_of_an_uninterrupted_one(tmp_path: Path, capsys) -> None:
    once, twice = tmp_path / "once", tmp_path / "twice"
    record_run(small_config(*STEPS), once, node_label="node", progress=False)
    died = subprocess.run([sys.executable, "-c", DIES, str(twice), *STEPS], cwd=Path(__file__).parents[2])
    assert died.returncode == 9
    assert not LogReader(rank_dir(twice, 0)).status.complete

    with pytest.raises(UsageError, match="--resume would not continue"):
        record_run(small_config(*STEPS, "train.seed=5"), twice, node_label="node", progress=False, resume=True)
    summary = record_run(small_config(*STEPS), twice, node_label="node", progress=False, resume=True)
    assert summary.resumed_from in (0, 3) and len(summary.losses) == 8 - summary.resumed_from

    assert timeline(twice) == timeline(once)
    comparison = compare_runs(once, twice)
    assert comparison.first is None and comparison.steps == 8
    reader = LogReader(rank_dir(twice, 0))
    markers = [r for r in reader.records() if isinstance(r, EventRecord) and r.kind == RESUME]
    assert [m.step for m in markers] == [summary.resumed_from]
    assert reader.status.complete and reader.status.superseded > 0

    assert main(["record", "--out", str(twice), "--resume", "--quiet"]) == 1
    assert "nothing to resume" in capsys.readouterr().err

    # The diff reads the same one timeline: the steps written before the crash and again after it count once.
    db = tmp_path / "study.duckdb"
    diff(
        DiffRequest(golden=str(once), suspect=str(twice), db=db, beam_args=("--direct_running_mode=in_memory",)),
        echo=lambda line: None,
    )
    with duckdb.connect(str(db), read_only=True) as con:
        differing, compared = con.execute(
            "SELECT count(*) FILTER (WHERE status <> 'equal'), count(*) FROM event_diffs"
        ).fetchone()
        assert con.execute("SELECT count(*) FROM first_divergence").fetchone() == (0,)
    assert differing == 0 and compared == sum(isinstance(r, TensorRecord) for r in timeline(once))
