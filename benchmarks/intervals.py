"""Ratios of costs with bootstrap 95 % intervals, and how a benchmark prints them against a target.

Every comparison in `make bench` reduces to one `Ratio`: a point estimate (the ratio of mean costs, so a rare
slow step, such as the one the writer thread flushes in, is counted, not voted away as a median would) and a
percentile bootstrap interval over the samples. A target is met only when the interval's upper end is at or
below it (`Ratio.meets`).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Ratio:
    """``value`` with its bootstrap interval ``low``-``high`` over ``samples`` samples (pairs, or runs)."""

    value: float
    low: float
    high: float
    samples: int

    def meets(self, target: float) -> bool:
        """The target is met when the upper end of the interval is at or below it."""
        return self.high <= target

    def describe(self, target: float | None = None, unit: str = "") -> str:
        text = f"{self.value:.3f}{unit} (95 % CI {self.low:.3f}-{self.high:.3f}, n={self.samples})"
        if target is None:
            return text
        verdict = "met" if self.meets(target) else "NOT met"
        return f"{text}, target <= {target:g}{unit}: {verdict}"


def _percentiles(values: list[float]) -> tuple[float, float]:
    values.sort()
    tail = (1 - LEVEL) / 2
    last = len(values) - 1
    return values[round(tail * last)], values[round((1 - tail) * last)]


def paired_ratio(costs: Sequence[float], bases: Sequence[float], seed: int = 0) -> Ratio:
    """mean(costs) / mean(bases), where the i-th cost and the i-th base were measured together (one step of each
    variant, or one alternating pair of whole processes); pairs are resampled together, so the machine's drift
    over the run, shared by both members of a pair, cancels."""
    if len(costs) != len(bases) or len(costs) < 2:
        raise ValueError(f"paired_ratio needs two or more pairs, got {len(costs)} and {len(bases)} samples")
    n, rng = len(costs), random.Random(seed)
    boot = []
    for _ in range(RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        boot.append(sum(costs[i] for i in picks) / sum(bases[i] for i in picks))
    low, high = _percentiles(boot)
    return Ratio(sum(costs) / sum(bases), low, high, n)


def unpaired_ratio(costs: Sequence[float], bases: Sequence[float], seed: int = 0) -> Ratio:
    """mean(costs) / mean(bases) where the samples were not measured together (a replay's faulty steps against the
    steps of a recording made earlier; groups of different sizes): each side is resampled on its own, with its own
    size, so the noise of both widens the interval and no drift cancels. ``samples`` is the smaller side's size."""
    if len(costs) < 2 or len(bases) < 2:
        raise ValueError(f"unpaired_ratio needs two or more samples on each side, got {len(costs)} and {len(bases)}")
    rng = random.Random(seed)

    def resampled_mean(values: Sequence[float]) -> float:
        return statistics.fmean(rng.choices(values, k=len(values)))

    low, high = _percentiles([resampled_mean(costs) / resampled_mean(bases) for _ in range(RESAMPLES)])
    return Ratio(statistics.fmean(costs) / statistics.fmean(bases), low, high, min(len(costs), len(bases)))


def mean_interval(values: Sequence[float], seed: int = 0) -> Ratio:
    """The mean of ``values`` (seconds, bytes, ...) with its bootstrap interval; a `Ratio` with no base."""
    if len(values) < 2:
        raise ValueError(f"mean_interval needs two or more samples, got {len(values)}")
    n, rng = len(values), random.Random(seed)
    boot = [statistics.fmean(values[rng.randrange(n)] for _ in range(n)) for _ in range(RESAMPLES)]
    low, high = _percentiles(boot)
    return Ratio(statistics.fmean(values), low, high, n)


def marginal_ratio(
    short: Sequence[tuple[float, float]], long: Sequence[tuple[float, float]], extra_steps: int, seed: int = 0
) -> tuple[Ratio, Ratio]:
    """Steady-state cost per step from whole runs of two lengths: each sample is (untraced s, traced s) of a run;
    a long run minus a short run, over the ``extra_steps`` between them, is the cost of a step with every one-time
    cost (start, first step, close) cancelled. Returns (traced / untraced per step, traced seconds per step)."""
    if len(short) < 2 or len(long) < 2:
        raise ValueError("marginal_ratio needs two or more runs of each length")
    rng = random.Random(seed)

    def estimate(s: Sequence[tuple[float, float]], g: Sequence[tuple[float, float]]) -> tuple[float, float]:
        plain = statistics.fmean(b for b, _ in g) - statistics.fmean(b for b, _ in s)
        traced = statistics.fmean(t for _, t in g) - statistics.fmean(t for _, t in s)
        return traced / plain, traced / extra_steps

    boot_ratio, boot_step = [], []
    for _ in range(RESAMPLES):
        r, t = estimate(
            [short[rng.randrange(len(short))] for _ in short], [long[rng.randrange(len(long))] for _ in long]
        )
        boot_ratio.append(r)
        boot_step.append(t)
    ratio, per_step = estimate(short, long)
    n = min(len(short), len(long))
    return Ratio(ratio, *_percentiles(boot_ratio), n), Ratio(per_step, *_percentiles(boot_step), n)
