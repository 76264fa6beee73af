"""The guard across DDP ranks (gloo, CPU): an alarm on one rank re-runs the step on every rank, the outcome is
decided together, and a transient fault leaves the weights a healthy run has."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch import launch
from tests.parallel.ddp_guard import TRANSIENT_ON_RANK_1

pytestmark = pytest.mark.slow  # every test launches ranks as processes

TARGET = "tests.parallel.ddp_guard:train_guarded"
STEPS, FAULT_STEP = 5, 2


def test_a_transient_fault_on_one_rank_is_rerun_on_both_and_training_ends_as_healthy(tmp_path: Path) -> None:
    profile = tmp_path / "rank1.toml"
    profile.write_text(TRANSIENT_ON_RANK_1.format(step=FAULT_STEP))
    healthy = launch(TARGET, {"out": str(tmp_path / "healthy"), "steps": STEPS}, 2, timeout_s=120)
    guarded = launch(
        TARGET, {"out": str(tmp_path / "guarded"), "steps": STEPS, "profile_path": str(profile)}, 2, timeout_s=120
    )
    assert [h["guard"] for h in healthy] == [[], []]
    for rank, got in enumerate(guarded):
        [(step, event)] = got["guard"]
        assert step == FAULT_STEP, rank
        assert (event["outcome"], event["action"], event["accepted"]) == ("transient", "continue", 2)
        assert [r["attempt"] for r in event["runs"]] == [0, 1, 2]
        # DDP averages rank 1's infinite gradient into rank 0's: both ranks see the alarm on the first run.
        assert [a["detector"] for a in event["alarms"]] == ["non_finite"]
        assert event["runs"][0]["nonfinite"] > 0 and event["runs"][2]["nonfinite"] == 0
        assert event["runs"][0]["events"].get("fault", 0) == (1 if rank == 1 else 0)
        assert got["params"] == healthy[rank]["params"]  # the weights a healthy run ends with, bit for bit
    assert guarded[0]["params"] == guarded[1]["params"]
