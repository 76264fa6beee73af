"""The statistics the reproduction rules judge with, without scipy: binomial acceptance intervals, the chi-square
quantile behind the Poisson Fano-factor bound, and Spearman's rank correlation with its interval.

    lo, hi = binomial_interval(15, 2 / 15)     # (0, 5): the counts a 15-node fleet shows at 95 %
    poisson_fano_bound(24)                     # the largest Fano factor a steady Poisson rate shows over 24 steps
"""

from __future__ import annotations

import math
import statistics

LEVEL = 0.95  # of every interval and test here and in analysis/reproduction_rules.py


def binomial_interval(n: int, p: float, level: float = LEVEL) -> tuple[int, int]:
    """The central `level` acceptance interval of Binomial(n, p): the counts a fleet of `n` nodes shows with
    probability `level` when each node has the property with probability `p` (each tail at most (1-level)/2)."""
    tail = (1 - level) / 2
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    lo, below = 0, 0.0
    while below + pmf[lo] <= tail:
        below += pmf[lo]
        lo += 1
    hi, above = n, 0.0
    while above + pmf[hi] <= tail:
        above += pmf[hi]
        hi -= 1
    return lo, hi


def chi2_quantile(k: int, q: float = LEVEL) -> float:
    """The chi-square distribution's `q` quantile with `k` degrees of freedom, by Wilson and Hilferty's cube-root
    normal approximation (within 1 % of the exact value from k = 3 on; scipy is not a dependency)."""
    if k <= 0:
        raise ValueError(f"chi2_quantile needs k >= 1, not {k}")
    z = statistics.NormalDist().inv_cdf(q)
    a = 2 / (9 * k)
    return k * (1 - a + z * math.sqrt(a)) ** 3


def poisson_fano_bound(steps: int, level: float = LEVEL) -> float:
    """The Fano factor (population variance / mean) over `steps` steps that a steady Poisson rate with the same
    mean exceeds with probability 1 - `level`: the dispersion test, steps x Fano ~ chi-square(steps - 1)."""
    return chi2_quantile(steps - 1, level) / steps


def spearman_interval(rho: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The two-sided `level` confidence interval of Spearman's rho over `n` pairs: Fisher's z = atanh(rho), normal
    with variance 1.06 / (n - 3) (Fieller, Hartley and Pearson 1957), mapped back by tanh. Needs n >= 4."""
    if n < 4:
        raise ValueError(f"spearman_interval needs n >= 4 pairs, not {n}")
    z = math.atanh(max(-0.999999, min(0.999999, rho)))
    half = statistics.NormalDist().inv_cdf(1 - (1 - level) / 2) * math.sqrt(1.06 / (n - 3))
    return math.tanh(z - half), math.tanh(z + half)


def spearman(pairs: list[tuple[float, float]]) -> float:
    """Spearman's rank correlation, ties given their mean rank; 0 when either side is constant."""

    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        out = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    a, b = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    return statistics.correlation(a, b) if len(set(a)) > 1 and len(set(b)) > 1 else 0.0


def binomial_upper(n: int, p: float, level: float = LEVEL) -> int:
    """The smallest k with P(Binomial(n, p) > k) <= 1 - `level`: more than k hits rejects "each hit has
    probability p" at that level (one-sided)."""
    cdf, k = 0.0, 0
    while k <= n:
        cdf += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if cdf >= level:
            return k
        k += 1
    return n
