"""The ratio of two means whose samples were not measured together, with a bootstrap 95 % interval.

    from unpaired_ratio import unpaired_ratio
    r = unpaired_ratio(replayed_step_seconds, recorded_step_seconds)   # an `intervals.Ratio`
    print(r.describe(1.5))

`intervals.paired_ratio` resamples pairs, which is right only when the i-th cost and the i-th base ran side by
side. When they did not (a replay's faulty steps against the steps of a recording made earlier; two groups of
different sizes), each side is resampled on its own, with its own size, and the interval is that of
mean(costs) / mean(bases): the noise of both sides widens it, and no drift cancels.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

from intervals import LEVEL, RESAMPLES, Ratio


def unpaired_ratio(costs: Sequence[float], bases: Sequence[float], seed: int = 0) -> Ratio:
    """mean(costs) / mean(bases) with a percentile bootstrap interval, each side resampled independently;
    ``samples`` is the smaller side's size (the one that limits the interval)."""
    if len(costs) < 2 or len(bases) < 2:
        raise ValueError(f"unpaired_ratio needs two or more samples on each side, got {len(costs)} and {len(bases)}")
    rng = random.Random(seed)

    def resampled_mean(values: Sequence[float]) -> float:
        return statistics.fmean(rng.choices(values, k=len(values)))

    boot = sorted(resampled_mean(costs) / resampled_mean(bases) for _ in range(RESAMPLES))
    tail = (1 - LEVEL) / 2
    low, high = boot[round(tail * (RESAMPLES - 1))], boot[round((1 - tail) * (RESAMPLES - 1))]
    value = statistics.fmean(costs) / statistics.fmean(bases)
    return Ratio(value, low, high, min(len(costs), len(bases)))
