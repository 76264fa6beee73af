"""The replay benchmark's method: an unpaired ratio of means with each side resampled on its own, and replayed
steps split by whether the emulator fired. Synthetic inputs, never a speed."""

from __future__ import annotations

import importlib
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

_BENCHMARKS = str(Path(__file__).parents[2] / "benchmarks")


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    """intervals.py and bench_replay.py, which imports its sibling `intervals` by its file's name."""
    sys.path.insert(0, _BENCHMARKS)
    try:
        yield importlib.import_module("intervals"), importlib.import_module("bench_replay")
    finally:
        sys.path.remove(_BENCHMARKS)


def test_the_value_is_the_ratio_of_means_of_groups_of_different_sizes(modules) -> None:
    unpaired, _ = modules
    r = unpaired.unpaired_ratio([2.0, 4.0, 3.0], [1.0, 1.0, 1.0, 1.0, 2.0, 2.0])
    assert r.value == pytest.approx(3.0 / (8.0 / 6.0))
    assert r.low <= r.value <= r.high
    assert r.samples == 3


def test_constant_sides_give_an_interval_of_width_zero(modules) -> None:
    unpaired, _ = modules
    r = unpaired.unpaired_ratio([1.5] * 4, [1.0] * 9)
    assert (r.value, r.low, r.high) == pytest.approx((1.5, 1.5, 1.5))
    assert r.meets(1.5) and not r.meets(1.49)


def test_noise_on_the_base_side_alone_widens_the_interval(modules) -> None:
    """Unpaired: the base's own spread counts, where a paired resampling would let it cancel."""
    unpaired, _ = modules
    rng = random.Random(3)
    base = [1.0 + rng.uniform(-0.5, 0.5) for _ in range(30)]
    r = unpaired.unpaired_ratio([1.2] * 30, base)
    assert r.low < r.value < r.high
    assert r.high - r.low > 0.1


def test_the_interval_covers_the_true_ratio_of_two_noisy_groups(modules) -> None:
    unpaired, _ = modules
    rng = random.Random(7)
    costs = [rng.gauss(1.8, 0.2) for _ in range(40)]
    bases = [rng.gauss(1.0, 0.1) for _ in range(60)]
    r = unpaired.unpaired_ratio(costs, bases)
    assert r.low < 1.8 < r.high
    assert not r.meets(1.5)


def test_one_sample_on_a_side_is_refused(modules) -> None:
    unpaired, _ = modules
    with pytest.raises(ValueError, match="two or more"):
        unpaired.unpaired_ratio([1.0], [1.0, 2.0])


def test_replayed_steps_split_by_whether_the_emulator_fired(modules) -> None:
    _, bench = modules
    faulty, clean = bench.split_by_faults([(0.3, 12), (0.1, 0), (0.4, 1), (0.2, 0)])
    assert faulty == [0.3, 0.4] and clean == [0.1, 0.2]


def test_executions_per_step_are_tallied_by_count(modules) -> None:
    _, bench = modules
    assert bench.executions_per_step([2, 2, 2]) == "2 (3 steps)"
    assert bench.executions_per_step([2, 1, 2]) == "1 (1 step), 2 (2 steps)"


def test_a_diff_rate_is_met_only_at_the_slow_end_of_its_interval() -> None:
    """bench_diff.py's events/s: the interval of the mean time, inverted (its `low` is the slow end)."""
    sys.path.insert(0, _BENCHMARKS)
    try:
        diff = importlib.import_module("bench_diff")
    finally:
        sys.path.remove(_BENCHMARKS)
    rate = diff.events_per_second(2_000_000, [1.0, 1.0, 4.0, 2.0])
    assert rate.value == pytest.approx(1_000_000)
    assert rate.low < rate.value < rate.high
    assert rate.low == pytest.approx(2_000_000 / diff.mean_interval([1.0, 1.0, 4.0, 2.0]).high)
    assert rate.low < diff.RATE_TARGET  # the mean alone would meet 800 000 events/s; its slow end does not
