"""Replica agreement on real DDP ranks (gloo, CPU): an emulated fault in one rank's AdamW update is named at its
step, by rank and parameter, and 200 healthy steps raise nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch import launch

pytestmark = pytest.mark.slow  # every test launches ranks as processes

TARGET = "tests.parallel.ddp_guard:train_with_replica_check"


def test_three_replicas_name_the_rank_whose_update_was_corrupted(tmp_path: Path) -> None:
    results = launch(TARGET, {"out": str(tmp_path / "run"), "steps": 6, "fault_step": 3}, 3, timeout_s=120)
    for rank, got in enumerate(results):
        first_step, first = got["replicas"][0]
        assert first_step == 3, (rank, got["replicas"])
        assert first["detector"] == "replica_agreement" and first["ranks"] == [1] and first["tie"] is False
        assert first["replicas"] == [0, 1, 2]
        assert first["parameters"] and first["gradients"] == []  # the update, not the reduced gradients
        assert "rank 1 disagrees" in first["detail"]
        # DDP never re-syncs weights: rank 1 stays apart, and is named at every later step too.
        assert [s for s, f in got["replicas"]] == [3, 4, 5] and all(f["ranks"] == [1] for _, f in got["replicas"])
        assert got["guard"] == []


def test_two_replicas_that_differ_are_a_tie_that_blames_nobody(tmp_path: Path) -> None:
    results = launch(TARGET, {"out": str(tmp_path / "run"), "steps": 3, "fault_step": 1}, 2, timeout_s=120)
    for got in results:
        step, first = got["replicas"][0]
        assert step == 1 and first["tie"] is True and first["ranks"] == [] and first["replicas"] == [0, 1]
        assert "a tie" in first["detail"]


def test_two_hundred_healthy_steps_raise_no_alarm(tmp_path: Path) -> None:
    results = launch(TARGET, {"out": str(tmp_path / "run"), "steps": 200}, 3, timeout_s=300)
    assert results == [{"replicas": [], "guard": []}] * 3


def test_under_hsdp_the_replicas_of_the_faulty_ranks_shard_disagree_and_the_others_agree(tmp_path: Path) -> None:
    # A (replicate 2, shard 2) mesh: ranks 0 and 2 hold one half of every parameter, ranks 1 and 3 the other.
    results = launch(TARGET, {"out": str(tmp_path / "run"), "steps": 4, "fault_step": 2, "hsdp": True}, 4,
                     timeout_s=180)
    for rank in (1, 3):
        step, first = results[rank]["replicas"][0]
        assert step == 2 and first["replicas"] == [1, 3] and first["tie"] is True and first["parameters"]
    assert results[0]["replicas"] == [] and results[2]["replicas"] == []
    assert all(got["guard"] == [] for got in results)
