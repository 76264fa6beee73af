"""Step times of an untraced and a traced workload, measured side by side."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

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
