"""The runnable examples end to end, as their docstrings show them: record a golden node and a sick one, then
``python -m sdc.cli replay --workload examples.<name>:build`` in a fresh process around the first divergence."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import events

pytestmark = pytest.mark.slow  # records real runs or starts processes: seconds each

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"hf_trainer": "transformers", "lightning_module": "pytorch_lightning"}  # example -> its extra's package


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_an_example_records_and_replays_from_the_command_line(name: str, tmp_path: Path) -> None:
    if importlib.util.find_spec(EXAMPLES[name]) is None:
        pytest.skip(f"install the extras: pip install -e '.[hf,lightning]' ({EXAMPLES[name]} is missing)")
    example = importlib.import_module(f"examples.{name}")
    golden, sick, lock = tmp_path / "golden", tmp_path / "sick", tmp_path / "lock"
    example.main(["--out", str(golden)])
    example.main(
        ["--out", str(sick), "--node-label", "node-b", "--fault-profile", "bursty-mismatch", "--fault-seed", "1"]
    )
    assert min(e.step for e in events(sick, "fault")) == 3  # bursty-mismatch with fault seed 1 starts at step 3
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
            f"examples.{name}:build",
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
    assert "first divergence: rank 0, step 3, microbatch 0, forward" in done.stdout
    # The suspect's profile is emulated again; sites mismatch exactly on the steps it corrupted.
    hit = {e.step for e in events(lock, "site_mismatch") if e.fields["mismatched"]}
    assert hit and hit == {e.step for e in events(lock, "fault")}
