"""`sdc certify RUN` without a golden run, on 3 real DDP ranks (gloo, CPU) recorded with replica agreement and
checkpoints every 2 steps: a fault in rank 1's optimizer update at step 3 certifies the checkpoint of step 2 (the
state before step 3 is the last the replicas agreed on); a healthy run its last checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch import launch
from sdc.cli import main
from tests.parallel.ddp_guard import UPDATE_ON_ONE_RANK
from tracer.checkpoint import checkpoint_dir

pytestmark = pytest.mark.slow  # launches ranks as processes

TARGET = "tests.parallel.ddp_guard:train_with_replica_check"  # the tiny DDP MLP, replica agreement on


def record(tmp_path: Path, name: str, fault_step: int | None) -> Path:
    job: dict = {"out": str(tmp_path / name), "steps": 6, "checkpoint_every": 2}
    if fault_step is not None:
        profile = tmp_path / "update.toml"
        profile.write_text(UPDATE_ON_ONE_RANK.format(step=fault_step, rank=1), encoding="utf-8")
        job["profile_path"] = str(profile)
    launch(TARGET, job, 3, timeout_s=120)
    return tmp_path / name


def test_replica_agreement_certifies_the_checkpoint_before_the_disagreement(tmp_path: Path, capsys) -> None:
    run = record(tmp_path, "faulty", fault_step=3)
    code = main(["certify", str(run)])
    captured = capsys.readouterr()
    assert code == 0 and captured.out == f"{checkpoint_dir(run, 2)}\n"
    assert captured.err.startswith(f"certified: step 2 of {run} (the replicas disagreed at step 3: rank 1 disagrees")


def test_a_healthy_run_whose_replicas_agreed_certifies_its_last_checkpoint(tmp_path: Path, capsys) -> None:
    run = record(tmp_path, "healthy", fault_step=None)
    code = main(["certify", str(run)])
    captured = capsys.readouterr()
    assert code == 0 and captured.out == f"{checkpoint_dir(run, 6)}\n"
    assert "the replicas agreed at every step through step 5" in captured.err
