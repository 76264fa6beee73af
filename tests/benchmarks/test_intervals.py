"""The benchmarks' intervals: a ratio of means over pairs, its bootstrap interval, and a target met only by the
interval's upper end."""

from __future__ import annotations

import random

import pytest


def test_paired_ratio_counts_a_rare_slow_step_that_a_median_would_drop(intervals) -> None:
    base = [1.0] * 20
    cost = [1.0] * 19 + [3.0]  # one step in twenty carries the writer's flush
    r = intervals.paired_ratio(cost, base)
    assert r.value == pytest.approx(1.1)
    assert r.low <= r.value <= r.high
    assert r.high > 1.1 and r.low == pytest.approx(1.0)


def test_machine_drift_shared_by_a_pair_cancels(intervals) -> None:
    slow = [1.0 if i < 10 else 10.0 for i in range(20)]
    r = intervals.paired_ratio([1.04 * s for s in slow], slow)
    assert (r.value, r.low, r.high) == pytest.approx((1.04, 1.04, 1.04))
    assert r.meets(1.05) and not r.meets(1.03)


def test_a_target_inside_the_interval_is_not_met(intervals) -> None:
    rng = random.Random(1)
    base = [1.0 + rng.random() for _ in range(30)]
    cost = [b * (1.0 + rng.uniform(-0.1, 0.2)) for b in base]
    r = intervals.paired_ratio(cost, base)
    assert r.low < r.value < r.high
    assert not r.meets(r.value) and r.meets(r.high)
    assert "NOT met" in r.describe(r.value) and "met" in r.describe(r.high)
    assert r.describe().startswith(f"{r.value:.3f} (95 % CI")


def test_marginal_ratio_cancels_the_one_time_cost(intervals) -> None:
    # Untraced: 1 s a step; traced: 1.02 s a step plus 5 s once (start, kernel load, close).
    short = [(10.0 + e, 10.2 + 5 + e) for e in (0.0, 0.01, -0.01)]
    long = [(60.0 + e, 61.2 + 5 + e) for e in (0.0, 0.02, -0.02)]
    ratio, per_step = intervals.marginal_ratio(short, long, extra_steps=50)
    assert ratio.value == pytest.approx(1.02)
    assert per_step.value == pytest.approx(1.02)
    assert ratio.low <= 1.02 <= ratio.high


def test_too_few_samples_are_refused(intervals) -> None:
    with pytest.raises(ValueError, match="two or more"):
        intervals.paired_ratio([1.0], [1.0])
    with pytest.raises(ValueError, match="two or more"):
        intervals.mean_interval([1.0])
