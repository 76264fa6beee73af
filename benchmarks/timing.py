"""Step times of an untraced and a traced workload, measured side by side."""

from __future__ import annotations

import statistics
import time

from tracer.tracing import Tracer
from workload.protocol import Workload, run_step


def warmup(steps: int) -> int:
    """Steps left out of the medians: first-call allocation and caches."""
    return max(1, steps // 5)


def side_by_side(plain: Workload, traced: Workload, tracer: Tracer, steps: int) -> tuple[float, float]:
    """Alternate an untraced step of ``plain`` and a traced step of ``traced``; their median step times."""
    t_plain, t_traced = [], []
    for step in range(steps):
        s = time.perf_counter()
        with tracer.paused():  # a collective observer is process-wide: keep the untraced twin's out of the log
            run_step(plain, step)
        t_plain.append(time.perf_counter() - s)
        s = time.perf_counter()
        with tracer.step(step):
            run_step(traced, step, tracer)
        t_traced.append(time.perf_counter() - s)
    warm = warmup(steps)
    return statistics.median(t_plain[warm:]), statistics.median(t_traced[warm:])
