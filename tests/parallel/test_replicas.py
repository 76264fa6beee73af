"""Replica agreement on real DDP ranks (gloo, CPU): a fault the emulator plays in one rank's AdamW update (a
profile rule in the "optimizer" phase) is named at its step, by rank and parameter, and 200 healthy steps raise
nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch import launch
from tests.parallel.ddp_guard import UPDATE_ON_ONE_RANK

pytestmark = pytest.mark.slow  # every test launches ranks as processes

TARGET = "tests.parallel.ddp_guard:train_with_replica_check"


def update_fault(tmp_path: Path, step: int, rank: int = 1) -> str:
    """A profile file: rank ``rank``'s AdamW update corrupted at ``step``."""
    path = tmp_path / "update.toml"
    path.write_text(UPDATE_ON_ONE_RANK.format(step=step, rank=rank), encoding="utf-8")
    return str(path)


def test_three_replicas_name_the_rank_whose_update_was_corrupted(tmp_path: Path) -> None:
    results = launch(
        TARGET, {"out": str(tmp_path / "run"), "steps": 6, "profile_path": update_fault(tmp_path, 3)}, 3, timeout_s=120
    )
    # The emulator's faults: rank 1 only, at step 3 only, in the optimizer phase (one per parameter's update).
    assert [len(got["fault"]) for got in results] == [0, 4, 0]
    assert all(
        step == 3 and f["phase"] == "optimizer" and f["op"] == "aten.addcdiv_.default"
        for step, f in results[1]["fault"]
    )
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
    results = launch(
        TARGET, {"out": str(tmp_path / "run"), "steps": 3, "profile_path": update_fault(tmp_path, 1)}, 2, timeout_s=120
    )
    for got in results:
        step, first = got["replicas"][0]
        assert step == 1 and first["tie"] is True and first["ranks"] == [] and first["replicas"] == [0, 1]
        assert "a tie" in first["detail"]


def test_two_hundred_healthy_steps_raise_no_alarm(tmp_path: Path) -> None:
    results = launch(TARGET, {"out": str(tmp_path / "run"), "steps": 200}, 3, timeout_s=300)
    assert results == [{"replicas": [], "guard": [], "fault": []}] * 3


def test_under_hsdp_the_replicas_of_the_faulty_ranks_shard_disagree_and_the_others_agree(tmp_path: Path) -> None:
    # A (replicate 2, shard 2) mesh: ranks 0 and 2 hold one half of every parameter, ranks 1 and 3 the other.
    results = launch(
        TARGET,
        {"out": str(tmp_path / "run"), "steps": 4, "profile_path": update_fault(tmp_path, 2), "hsdp": True},
        4,
        timeout_s=180,
    )
    assert [len(got["fault"]) for got in results] == [0, 4, 0, 0]  # rank 1's update of its shard of each parameter
    for rank in (1, 3):
        step, first = results[rank]["replicas"][0]
        assert step == 2 and first["replicas"] == [1, 3] and first["tie"] is True and first["parameters"]
    assert results[0]["replicas"] == [] and results[2]["replicas"] == []
    assert all(got["guard"] == [] for got in results)


def test_the_update_fault_is_the_ground_truth_replica_agreement_is_scored_against(tmp_path: Path) -> None:
    """The emulator's fault events (phase "optimizer") load into the diff's database and make rank 1's step 3 the
    faulty step `guard_detector_scores` scores the ``replica_agreement`` detector against."""
    import duckdb

    from analysis.queries import LIBRARY
    from pipelines.arguments import DiffRequest
    from pipelines.run import diff

    runs = {name: tmp_path / name for name in ("golden", "suspect")}
    launch(TARGET, {"out": str(runs["golden"]), "steps": 5}, 3, timeout_s=120)
    launch(
        TARGET, {"out": str(runs["suspect"]), "steps": 5, "profile_path": update_fault(tmp_path, 3)}, 3, timeout_s=120
    )
    db = tmp_path / "study.duckdb"
    diff(
        DiffRequest(
            golden=str(runs["golden"]),
            suspect=str(runs["suspect"]),
            db=db,
            beam_args=("--direct_running_mode=in_memory",),
        ),
        echo=lambda _: None,
    )
    con = duckdb.connect(str(db), read_only=True)
    try:
        faults = con.execute("SELECT rank, step, phase, site, op FROM faults ORDER BY rank, step").fetchall()
    finally:
        con.close()
    assert faults == [(1, 3, "optimizer", "", "aten.addcdiv_.default")] * 4
    scores = {r["detector"]: r for r in LIBRARY.run(db, "guard_detector_scores").records()}
    got = scores["replica_agreement"]
    # 5 steps on 3 ranks; rank 1 is blamed at step 3 (the fault: a true alarm) and at step 4 (DDP never re-syncs
    # the weights: the fault's aftermath), nothing else fires.
    assert (got["checked_steps"], got["faulty_steps"], got["alarms"]) == (15, 1, 2)
    assert (got["true_alarms"], got["false_alarms"], got["propagated"]) == (1, 0, 1)
    assert got["recall"] == 1.0 and got["precision"] == 1.0
