"""Step times of workload variants measured side by side: every variant runs each step, in a shuffled order."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tracer.tracing import Tracer
from workload.protocol import Workload, run_step


def warmup(steps: int) -> int:
    """Steps left out of the medians: first-call allocation and caches."""
    return max(1, steps // 5)


@dataclass(frozen=True)
class Interleaved:
    """Each variant's step times, warm-up left out; the i-th time of every variant is from the same step."""

    seconds: Mapping[str, tuple[float, ...]]

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def ratios(self, name: str, base: str) -> list[float]:
        return [a / b for a, b in zip(self.seconds[name], self.seconds[base])]

    def ratio(self, name: str, base: str) -> float:
        """The median of ``name``'s step time over ``base``'s in the same step: the machine's drift during a run
        (this VM's step times moved by up to 1.5x within one `make bench`) cancels step by step."""
        return statistics.median(self.ratios(name, base))

    def spread(self, name: str, base: str) -> tuple[float, float]:
        """The first and third quartiles of those per-step ratios: how far one ratio printed can be trusted."""
        q = statistics.quantiles(self.ratios(name, base), n=4)
        return q[0], q[2]

    def describe(self, name: str, base: str) -> str:
        """The ratio with its spread and both medians, as the benchmarks print it."""
        low, high = self.spread(name, base)
        steps = len(self.seconds[base])
        return (f"{self.ratio(name, base):.3f}  (middle half of steps {low:.3f}-{high:.3f}; median "
                f"{self.median(name) * 1e3:.1f} ms vs {self.median(base) * 1e3:.1f} ms, {steps} steps")


def interleave(variants: Mapping[str, Callable[[int], float]], steps: int, seed: int = 0) -> Interleaved:
    """Run step 0, 1, ... of every variant, in an order shuffled each step (by a seeded generator, so runs
    repeat), none always first or last; each variant returns the seconds its step took."""
    order, rng = list(variants), random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for step in range(steps):
        rng.shuffle(order)
        for name in order:
            times[name].append(variants[name](step))
    warm = warmup(steps)
    return Interleaved({name: tuple(t[warm:]) for name, t in times.items()})


def traced_step(workload: Workload, tracer: Tracer) -> Callable[[int], float]:
    """A variant for `interleave`: one traced step of ``workload``."""
    def step(index: int) -> float:
        s = time.perf_counter()
        with tracer.step(index):
            run_step(workload, index, tracer)
        return time.perf_counter() - s

    return step


def side_by_side(plain: Workload, traced: Workload, tracer: Tracer, steps: int) -> Interleaved:
    """Untraced steps of ``plain`` and traced steps of ``traced``, interleaved ("untraced", "traced")."""
    def untraced(index: int) -> float:
        s = time.perf_counter()
        with tracer.paused():  # a collective observer is process-wide: keep the untraced twin's out of the log
            run_step(plain, index)
        return time.perf_counter() - s

    return interleave({"untraced": untraced, "traced": traced_step(traced, tracer)}, steps)


def machine_load(seconds: float = 1.0) -> str:
    """One line on what else the machine is doing, measured while this process sleeps: every ratio here is
    measured side by side, but another job on a 2-core machine still moves them by 10 % or more."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all jiffies; idle and iowait

    cores = os.cpu_count() or 1
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return f"machine            : {cores} cores, load average {os.getloadavg()[0]:.2f} (no /proc/stat here)"
    busy = cores * (1 - (idle1 - idle0) / max(1, total1 - total0))
    line = f"machine            : {cores} cores, {busy:.2f} of them busy with other work over {seconds:g} s before the run"
    if busy > 0.25:
        line += " -- WARNING: another job is running; the ratios below are unreliable (wait for it, then run again)"
    return line
