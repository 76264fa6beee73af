"""`pipelines.scoring.score` against the guard's own rule run step by step (`score_stepwise`), on runs full of
what makes histories part: spikes flagged and left out, non-finite values never pushed, short histories at the
start, windows of odd and even length, chunks cut by a flag."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from pipelines.scoring import Scored, Steps, score, score_stepwise
from tracer.guard import AbftFlags, Evidence, TwinMismatch
from tracer.guard.detectors import Alarm, GradNormSpike, LossSpike, NonFinite, UpdateRmsSpike


class _Twin:
    def __init__(self, fingerprints: dict[int, int]) -> None:
        self.fingerprints = fingerprints

    def fingerprint(self, step: int) -> int | None:
        return self.fingerprints.get(step)


def _run(seed: int, n: int, spiky: float) -> Steps:
    """A loss curve with level shifts and spikes (``spiky``: the share of steps with one), gradient norms likewise,
    NaN and Inf in both, steps without a loss, a stretch of zero norms (a median of 0)."""
    rng = random.Random(seed)
    loss, has_loss, norm = [], [], []
    for k in range(n):
        level = 3.0 if k < n // 3 else 1.5 if k < 2 * n // 3 else 2.5
        value = level + rng.gauss(0, 0.02)
        if rng.random() < spiky:
            value *= rng.choice([1.05, 1.3, 3.0, 0.2])
        if rng.random() < 0.01:
            value = rng.choice([math.nan, math.inf, -math.inf])
        given = rng.random() > 0.02
        loss.append(value if given else math.nan)
        has_loss.append(given)
        g = (1.0 + rng.gauss(0, 0.1)) * (10.0 if n // 2 <= k < n // 2 + 40 else 1.0)
        if rng.random() < spiky:
            g *= rng.choice([2.5, 6.0, 50.0])
        if rng.random() < 0.01:
            g = rng.choice([math.nan, math.inf])
        if n // 4 <= k < n // 4 + 12:
            g = 0.0
        norm.append(g)
    return Steps(
        step=np.arange(n, dtype=np.int64) * 2 + 5,
        loss=np.array(loss),
        has_loss=np.array(has_loss),
        grad_norm=np.array(norm),
        nonfinite=np.array([int(rng.random() < 0.01) for _ in range(n)], np.int64),
        abft_flags=np.array([rng.choice([0] * 30 + [1, 2]) for _ in range(n)], np.int64),
        fingerprint=[rng.getrandbits(64) for _ in range(n)],
    )


def _sets(steps: Steps) -> list[Scored]:
    twin = _Twin(
        {s: fp if i % 17 else fp ^ 1 for i, (s, fp) in enumerate(zip(steps.step.tolist(), steps.fingerprint)) if i % 29}
    )
    loose = (LossSpike(window=7, z=3.0, floor=0.0, min_history=2), GradNormSpike(window=6, factor=1.5, min_history=3))
    return [
        Scored((NonFinite(),)),
        Scored((AbftFlags(min_flags=2),)),
        Scored((TwinMismatch(twin),)),
        Scored((LossSpike(),)),
        Scored((GradNormSpike(),)),
        Scored(loose),
        Scored((NonFinite(), LossSpike(), GradNormSpike(), AbftFlags()), "guard"),
        Scored((NonFinite(), *loose, TwinMismatch(twin)), "loose"),
        Scored((LossSpike(window=1, z=0.5, min_history=1), GradNormSpike(window=2, factor=1.01, min_history=1))),
    ]


@pytest.mark.parametrize(("seed", "n", "spiky"), [(0, 40, 0.05), (1, 900, 0.02), (2, 700, 0.3), (3, 2000, 0.1)])
def test_score_gives_the_guards_verdicts_and_alarms(seed: int, n: int, spiky: float) -> None:
    steps = _run(seed, n, spiky)
    sets = _sets(steps)
    got = score(steps, sets)
    fired = 0
    for s, alarms in zip(sets, got):
        expected = score_stepwise(steps, s.detectors)
        assert repr(alarms) == repr(expected), s  # repr: a NaN measured value equals itself
        fired += len(expected)
    assert fired > n  # the detectors fire, and histories part


def test_a_flag_in_every_step_leaves_the_history_empty() -> None:
    steps = _run(4, 300, 0.05)
    steps.nonfinite[:] = 1
    (fired,) = score(steps, [Scored((NonFinite(), LossSpike(min_history=1), GradNormSpike(min_history=1)))])
    assert sorted(fired) == list(range(300))
    assert all(set(a) == {"non_finite"} for a in fired.values())  # no history ever: the spike detectors stay quiet


class _Quiet:
    """A detector of a user's: `score` cannot vectorise it and runs its set step by step."""

    name = "quiet"

    def check(self, e: Evidence) -> Alarm | None:
        return Alarm(self.name, e.grad_norm, 2.0) if e.grad_norm > 2.0 else None


def test_a_set_with_other_detectors_runs_step_by_step() -> None:
    steps = _run(5, 500, 0.1)
    sets = [Scored((LossSpike(), _Quiet())), Scored((UpdateRmsSpike(),))]
    got = score(steps, sets)
    assert repr(got) == repr([score_stepwise(steps, s.detectors) for s in sets])
    assert any("quiet" in a for a in got[0].values()) and not got[1]
