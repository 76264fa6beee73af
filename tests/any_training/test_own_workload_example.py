"""examples/own_workload.py as its docstring shows it: the hand-written loop records the golden node, `sdc record
--workload` the twin and a sick node, and `sdc replay --workload` (a fresh process) rebuilds the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples import own_workload
from sdc.cli import main
from tests.support import events
from tracer.compare import compare_runs

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = "examples.own_workload:build"


def test_the_own_loop_and_sdc_record_agree_and_replay_rebuilds_the_run(tmp_path: Path) -> None:
    golden, twin, sick, lock = (tmp_path / n for n in ("golden", "twin", "sick", "lock"))
    own_workload.main(["--out", str(golden)])
    record = ["record", "--workload", WORKLOAD, "--quiet", "--out"]
    assert main([*record, str(twin), "--node-label", "node-c"]) == 0
    assert (
        main([*record, str(sick), "--node-label", "node-b", "--fault-profile", "bursty-mismatch", "--fault-seed", "1"])
        == 0
    )
    # Your loop and the protocol's run_step produce the same bits.
    same = compare_runs(golden, twin)
    assert same.first is None and same.steps == 8
    assert compare_runs(golden, sick).first is not None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sdc.cli",
            "replay",
            "--golden",
            str(golden),
            "--suspect",
            str(sick),
            "--workload",
            WORKLOAD,
            "--at-first-divergence",
            "--mode",
            "lockstep",
            "--out",
            str(lock),
            "--quiet",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    hit = {e.step for e in events(lock, "site_mismatch") if e.fields["mismatched"]}
    assert hit and hit == {e.step for e in events(lock, "fault")}
