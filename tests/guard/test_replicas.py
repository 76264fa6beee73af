"""Replica agreement's rule (majority, tie) and its offline scoring, without ranks (tests/parallel/test_replicas.py
runs it on real DDP ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.alarms import StepFacts, checks_replicas, run_alarms
from tracer.errors import ConfigError
from tracer.guard import Guard, ReplicaAgreement
from tracer.guard.replicas import disagreement

NAMES = ["w", "b", "w", "b"]  # two gradients, then the two parameters


def test_the_majority_names_the_rank_off_it_and_the_tensor() -> None:
    table = np.array([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 3, 4]], np.uint64)
    d = disagreement(7, table, (0, 1, 2), NAMES, gradients=2)
    assert d is not None and (d.step, d.blamed, d.tie, d.parameters, d.gradients) == (7, (1,), False, ("b",), ())
    fields = d.fields()
    assert fields["detector"] == "replica_agreement" and fields["measured"] == 1.0 and fields["ranks"] == [1]
    assert fields["detail"] == "rank 1 disagrees with the majority of replicas [0, 1, 2]: b"


def test_two_replicas_apart_are_a_tie_and_agreeing_ones_nothing() -> None:
    d = disagreement(0, np.array([[5, 1, 1, 1], [6, 1, 1, 1]], np.uint64), (4, 5), NAMES, gradients=2)
    assert d is not None and d.blamed == () and d.tie and d.gradients == ("w",) and d.parameters == ()
    assert "a tie: nobody blamed" in d.alarm().detail
    assert disagreement(0, np.ones((3, 4), np.uint64), (0, 1, 2), NAMES, gradients=2) is None


def test_the_guard_records_it_in_the_header_and_refuses_anything_else() -> None:
    described = Guard(replicas=ReplicaAgreement()).describe()
    assert described["replicas"] == {"name": "replica_agreement", "gradients": True, "group": "layout"}
    assert checks_replicas({"guard": described}) and not checks_replicas({"guard": Guard().describe()})
    with pytest.raises(ConfigError, match="ReplicaAgreement"):
        Guard(replicas="yes")  # type: ignore[arg-type]  # the wrong type the guard refuses


def test_offline_scoring_fires_on_the_blamed_rank_and_on_both_sides_of_a_tie() -> None:
    blame = {
        "detector": "replica_agreement",
        "measured": 1.0,
        "threshold": 0.0,
        "detail": "rank 1 ...",
        "replicas": [0, 1, 2],
        "ranks": [1],
        "tie": False,
    }
    tie = {**blame, "replicas": [0, 1], "ranks": [], "tie": True}
    facts = [StepFacts(s, 1.0, 1.0, 0, 0, s, int(s == 1)) for s in range(3)]
    facts[1], facts[2] = facts[1]._replace(replicas=blame), facts[2]._replace(replicas=tie)

    def fired(rank: int) -> list[int]:
        t = run_alarms(facts, False, None, rank, replicas=True).to_pylist()
        return [r["step"] for r in t if r["detector"] == "replica_agreement" and r["fired"]]

    assert fired(1) == [1, 2] and fired(0) == [2] and fired(2) == []
    rows = run_alarms(facts, False, None, 1, replicas=False).to_pylist()
    assert not any(r["detector"] == "replica_agreement" for r in rows)
