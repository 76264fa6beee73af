"""A checkpoint changed together with its manifest (issue 31, case 4), through the real CLI: `sdc diff`, `sdc replay`
and `sdc record --resume` each end in one line naming the file, the tensor and the step the log recorded, never
in drift ("0 differ") or a verdict on the machine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs.record import record_run, resume_step
from sdc.cli import main
from tests.support import SMALL, small_config
from tests.tracer.checkpoint_tamper import tamper_both

pytestmark = pytest.mark.slow  # records three small runs, one in a subprocess that dies

STEPS = ["run.steps=5", "run.checkpoint_every=2"]
CHANGED = r"does not match the fingerprint the log recorded at step (\d+) .*changed after it was written; re-record"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("changed")
    for name in ("golden", "twin"):
        record_run(small_config(*STEPS), root / name, node_label=name, progress=False)
    changed = root / "changed"
    shutil.copytree(root / "golden", changed)
    name = tamper_both(changed, 2)
    return SimpleNamespace(root=root, golden=root / "golden", twin=root / "twin", changed=changed, tensor=name)


def one_line_error(capsys: pytest.CaptureFixture, code: int) -> tuple[str, str]:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 1 and len(lines) == 1, captured
    return lines[0], captured.out


def test_diff_names_the_changed_checkpoint_instead_of_reporting_drift(runs: SimpleNamespace, capsys) -> None:
    assert (
        main(
            [
                "diff",
                "--golden",
                str(runs.golden),
                "--suspect",
                str(runs.twin),
                "--db",
                str(runs.root / "healthy.duckdb"),
            ]
        )
        == 0
    )  # the healthy pair's checkpoints all match their logs
    capsys.readouterr()
    code = main(
        ["diff", "--golden", str(runs.twin), "--suspect", str(runs.changed), "--db", str(runs.root / "changed.duckdb")]
    )
    line, out = one_line_error(capsys, code)
    assert "differ" not in out.split("[2/3]")[-1]  # the job ran, no difference was reported
    assert f"{runs.changed}/checkpoints/step-000002/rank-00000.msgpack" in line and repr(runs.tensor) in line
    assert re.search(CHANGED, line)[1] == "1"


def test_replay_names_the_changed_checkpoint_and_gives_no_verdict_on_the_machine(runs: SimpleNamespace, capsys) -> None:
    code = main(
        [
            "replay",
            "--golden",
            str(runs.changed),
            "--suspect",
            str(runs.twin),
            "--steps",
            "2:3",
            "--mode",
            "lockstep",
            "--out",
            str(runs.root / "replay"),
            "--quiet",
        ]
    )
    line, out = one_line_error(capsys, code)
    assert "checkpoints/step-000002/rank-00000" in line and repr(runs.tensor) in line and "step 1 " in line
    assert "changed after it was written" in line and "mismatch" not in out


# Dies at the end of step 3, the way a killed process does: no END record, so the run can be resumed.
DIES = """
import os, sys
from tests.support import SMALL, small_config
from jobs.record import record_run
def die(step, loss):
    if step == 3:
        os._exit(9)
record_run(small_config(*sys.argv[2:]), sys.argv[1], node_label="node", progress=False, on_step=die)
"""


def test_resume_names_the_changed_checkpoint(runs: SimpleNamespace, capsys) -> None:
    crashed = runs.root / "crashed"
    died = subprocess.run([sys.executable, "-c", DIES, str(crashed), *STEPS], cwd=Path(__file__).parents[2])
    assert died.returncode == 9
    step = resume_step(crashed, 1)
    assert step == 2
    name = tamper_both(crashed, step)
    sets = [a for kv in (*SMALL, *STEPS) for a in ("--set", kv)]
    code = main(["record", "--out", str(crashed), "--resume", "--node-label", "node", *sets, "--quiet"])
    line, _ = one_line_error(capsys, code)
    assert "checkpoints/step-000002/rank-00000" in line and repr(name) in line
    assert "recorded at step 1 " in line and "changed after it was written" in line
