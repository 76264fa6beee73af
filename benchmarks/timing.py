"""Step times of workload variants measured side by side, counting everything a traced step causes.

    timed = interleave({"untraced": untraced, "traced": traced_step(workload, tracer)}, steps)
    print(timed.describe("traced", "untraced", target=1.05))

Every variant runs each step, in an order shuffled each step. A traced step's clock stops only after
`Tracer.sync()`: the writer thread's work for that step (encoding, CRC, the write) is inside it, never in whichever
step runs next. The first `WARMUP` steps of every variant are kept apart, not dropped: what they cost over as many
steady steps is printed as one-time cost in seconds, beside the Tracer's start and close (`OneTime`). The steady
ratio is the ratio of mean step times with its bootstrap 95 % interval over the steps (`intervals.paired_ratio`).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from intervals import Ratio, paired_ratio

from tracer.tracing import Tracer
from workload.protocol import Workload, run_step

WARMUP = 3  # steps of every variant run first and reported as one-time cost: allocation, caches, kernel load


@dataclass(frozen=True)
class Interleaved:
    """Each variant's steady step times and its first `WARMUP` steps' times; the i-th time of every variant is from
    the same step."""

    seconds: Mapping[str, tuple[float, ...]]
    warmup: Mapping[str, tuple[float, ...]]

    def mean(self, name: str) -> float:
        return statistics.fmean(self.seconds[name])

    def ratio(self, name: str, base: str) -> Ratio:
        """Mean step time of ``name`` over ``base``'s, with its interval over the steps (pairs: the same step)."""
        return paired_ratio(self.seconds[name], self.seconds[base])

    def first_steps(self, name: str) -> float:
        """Seconds the warm-up steps of ``name`` took over as many steady steps: a one-time cost."""
        return sum(self.warmup[name]) - len(self.warmup[name]) * self.mean(name)

    def describe(self, name: str, base: str, target: float | None = None, item: str = "step") -> str:
        """The ratio with its interval, its width and whether it decides ``target``, both means, and the warm-up
        (``item``: what one sample is, a step or a whole run)."""
        r = self.ratio(name, base)
        return (
            f"{r.describe(target)}; {width(r, target)}; mean {self.mean(name) * 1e3:.1f} ms vs "
            f"{self.mean(base) * 1e3:.1f} ms a {item}; first {len(self.warmup[name])} {item}s "
            f"{self.first_steps(name):+.3f} s vs {self.first_steps(base):+.3f} s over steady ones (one-time)"
        )


def width(r: Ratio, target: float | None) -> str:
    """The interval's width and, against ``target``, whether the steps decided the verdict: undecided while the
    target lies inside the interval."""
    text = f"interval width {r.high - r.low:.3f}"
    if target is None:
        return text
    if r.low <= target <= r.high:
        return f"{text}: the target lies inside the interval, run more steps to decide"
    return f"{text}: decided (the whole interval is on one side of the target)"


def disagree(a: Ratio, b: Ratio) -> bool:
    """Two estimates of one ratio whose intervals do not overlap: the methods measure different things."""
    return a.high < b.low or b.high < a.low


def interleave(
    variants: Mapping[str, Callable[[int], float]],
    steps: int,
    warmup: int = WARMUP,
    seed: int = 0,
    between: Callable[[], object] | None = None,
) -> Interleaved:
    """Run step 0, 1, ... (``warmup`` + ``steps`` in all) of every variant, in an order shuffled each step (by a
    seeded generator, so runs repeat, and every rank of a job draws the same), none always first or last; each
    variant returns the seconds its step took. ``between`` runs after every variant's step, outside its time (a
    barrier: no rank's wait for another's writer lands in the next variant's step)."""
    order, rng = list(variants), random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for step in range(warmup + steps):
        rng.shuffle(order)
        for name in order:
            times[name].append(variants[name](step))
            if between is not None:
                between()
    return Interleaved(
        {name: tuple(t[warmup:]) for name, t in times.items()}, {name: tuple(t[:warmup]) for name, t in times.items()}
    )


def drained(step: Callable[[int], object], drain: Callable[[], object]) -> Callable[[int], float]:
    """A variant for `interleave`: ``step``, timed until ``drain`` has returned, so the work the step left to other
    threads (the Tracer's writer) is counted in it."""

    def run(index: int) -> float:
        s = time.perf_counter()
        step(index)
        drain()
        return time.perf_counter() - s

    return run


def traced_step(workload: Workload, tracer: Tracer) -> Callable[[int], float]:
    """A variant for `interleave`: one traced step of ``workload``, timed until the writer has drained it."""

    def step(index: int) -> None:
        with tracer.step(index):
            run_step(workload, index, tracer)

    def drain() -> None:
        tracer.sync()  # the writer thread's work for this step, counted in it
        settle(workload)

    return drained(step, drain)


def settle(workload: Workload) -> None:
    """Wait for the step's last kernels on CUDA (the loss is read before the optimizer's step has run there)."""
    device = next(workload.model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def side_by_side(
    plain: Workload,
    traced: Workload,
    tracer: Tracer,
    steps: int,
    warmup: int = WARMUP,
    between: Callable[[], object] | None = None,
) -> Interleaved:
    """Untraced steps of ``plain`` and traced steps of ``traced``, interleaved ("untraced", "traced")."""

    def untraced(index: int) -> float:
        s = time.perf_counter()
        with tracer.paused():  # a collective observer is process-wide: keep the untraced twin's out of the log
            run_step(plain, index)
        settle(plain)
        return time.perf_counter() - s

    return interleave({"untraced": untraced, "traced": traced_step(traced, tracer)}, steps, warmup, between=between)


@dataclass(frozen=True)
class OneTime:
    """What a traced run pays once, in seconds: the Tracer's start (`__enter__`), its first steps over as many
    steady ones beyond what an untraced run's first steps take over its own (allocation, caches), its close
    (`__exit__`: the last records written). The digest kernel loads inside the start (`fingerprint.prepare_digests`);
    bench_tracing.py prints its load, measured in a fresh process, on its header line."""

    start_s: float
    first_steps_s: float
    close_s: float

    def describe(self) -> str:
        return (
            f"one-time {self.start_s + max(0.0, self.first_steps_s) + self.close_s:.3f} s: start "
            f"{self.start_s:.3f} s, first steps {self.first_steps_s:+.3f} s over steady ones (beyond untraced), "
            f"close {self.close_s:.3f} s"
        )


@contextmanager
def lifetime(tracer: AbstractContextManager, into: dict[str, float]) -> Iterator[Tracer]:
    """Enter ``tracer`` and exit it as `with` would, noting the seconds of each in ``into`` (start_s, close_s)."""
    s = time.perf_counter()
    entered = tracer.__enter__()
    into["start_s"] = time.perf_counter() - s
    try:
        yield entered
    except BaseException:
        if not tracer.__exit__(*sys.exc_info()):
            raise
    else:
        s = time.perf_counter()
        tracer.__exit__(None, None, None)
        into["close_s"] = time.perf_counter() - s


def process_seconds(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> float:
    """Wall seconds of one process from its start to its exit; a failed one is an error (RuntimeError naming it
    and the end of its stderr), not a sample."""
    start = time.perf_counter()
    done = subprocess.run(
        list(argv),
        env=None if env is None else dict(env),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-4000:]}")
    return seconds


def machine_load(seconds: float = 1.0, when: str = "before the run") -> str:
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
    line = f"machine            : {cores} cores, {busy:.2f} of them busy with other work over {seconds:g} s {when}"
    if busy > 0.25:
        line += " -- WARNING: another job is running; the ratios are unreliable (wait for it, then run again)"
    return line
