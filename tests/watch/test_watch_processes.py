"""`sdc watch` on two `sdc record` processes while they run: a divergence, a writer SIGKILLed and resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tracer.compare import compare_runs
from tracer.log import EventRecord, TornTailWarning, rank_dir
from tracer.log.follow import LogFollower
from tracer.log.segment import Entry

pytestmark = pytest.mark.slow  # three real recordings and a watch, in processes

ROOT = Path(__file__).parents[2]
TINY = ["--set", "model.n_layers=2", "--set", "data.batch_size=2", "--set", "data.seq_len=32", "--quiet"]
# One exponent flip in layers.1.feed_forward's forward matmuls at step STEP.
FLIP = """
seed = 7
[[fault]]
ops = ["matmul"]
sites = "layers\\\\.1\\\\.feed_forward"
phases = ["forward"]
steps = [{step}]
p_call = 1.0
elements = 1
kind = "bitflip"
bits = "exponent"
"""


def sdc(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.Popen(
        [sys.executable, "-m", "sdc.cli", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def record(out: Path, steps: int, *extra: str) -> subprocess.Popen[str]:
    return sdc("record", "--out", str(out), "--steps", str(steps), "--checkpoint-every", "5", *TINY, *extra)


def wait_for_step(run: Path, step: int, timeout_s: float = 120) -> None:
    """Block until `run`'s rank 0 has logged the end of `step` (read as `sdc watch` reads it)."""
    follower = LogFollower(rank_dir(run, 0), on_corruption="skip")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for item in follower.poll():
            if (
                isinstance(item, Entry)
                and isinstance(item.record, EventRecord)
                and item.record.kind == "step"
                and item.record.step >= step
            ):
                return
        time.sleep(0.02)
    raise AssertionError(f"{run} never reached step {step}")


def finish(proc: subprocess.Popen[str], timeout_s: float = 180) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out


def test_watch_reports_a_divergence_live_across_a_writer_killed_and_resumed(tmp_path: Path) -> None:
    (tmp_path / "flip.toml").write_text(FLIP.format(step=30))
    golden, suspect = tmp_path / "golden", tmp_path / "suspect"
    faults = ("--fault-profile", str(tmp_path / "flip.toml"))
    watch = sdc("watch", "--golden", str(golden), "--suspect", str(suspect), "--idle-timeout", "120")
    golden_writer, suspect_writer = record(golden, 60), record(suspect, 60, *faults)
    resumed = None
    try:
        wait_for_step(suspect, 12)
        os.kill(suspect_writer.pid, signal.SIGKILL)
        suspect_writer.wait()
        resumed = record(suspect, 60, *faults, "--resume")
        status, out = finish(watch)
        running = resumed.poll() is None  # the divergence was reported while the suspect was being recorded
        assert finish(golden_writer)[0] == 0
        resumed_status, resumed_out = finish(resumed)
    finally:
        for proc in (watch, golden_writer, suspect_writer, resumed):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert resumed_status == 0 and "resumed at step" in resumed_out, resumed_out
    assert status == 3, out
    assert "suspect rank 0: the writer stopped without finishing (crashed)" in out
    assert "suspect rank 0: resumed from the checkpoint of step" in out
    assert out.count("DIVERGENCE") == 1
    assert "DIVERGENCE at step 30, rank 0, microbatch 0: layers.1.feed_forward forward" in out
    assert running, "the divergence was reported only after the suspect's recording had ended"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TornTailWarning)  # the kill's torn tail ended a session, not the log
        first = compare_runs(golden, suspect).first
    assert first is not None and (first.step, first.name) == (30, "layers.1.feed_forward")
