"""The ABFT check's cost per matmul on a workload's own products: check time / matmul time.

    .venv/bin/python benchmarks/bench_abft.py [--config tiny] [--rounds 8]
    .venv/bin/python benchmarks/bench_abft.py --profile 10 [--config tiny]

Records the checked calls of one training step (inputs and results kept), then times, round
after round and side by side, the op itself, `check_matmul` with the kernel and with torch ops.
With ``--profile N``: N traced steps with the checker on, as `make bench` runs them, under cProfile instead, and
the Python calls a step (in all, and in faults/ and tracer/) with the checker's functions by calls: the Python
around each checked product, which the per-call split above counts only in part (its interception, the scope,
the event are not in it). Call counts do not depend on the machine's load; times do.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from profile_step import calls_per_step

from faults import abft
from tracer.intercept import Call, Interceptor
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import load_config

Recorded = tuple  # (op, args, kwargs, result)


class _Record(Interceptor):
    """Keeps a copy (same strides) of every call the checker would check, as the checker sees it."""

    ops = abft.CHECKED

    def __init__(self) -> None:
        self.calls: list[Recorded] = []

    def intercept(self, func, args, kwargs, call: Call):  # noqa: ANN001, ANN201
        out = call(*args, **kwargs)
        keep = [_copy(a) for a in (*args, out)]
        self.calls.append((func, tuple(keep[:-1]), kwargs, keep[-1]))
        return out


def _copy(x: object) -> object:
    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).copy_(x.detach())


def step_calls(config: str | None) -> list[Recorded]:
    """The checked calls of one training step (the second: the first allocates)."""
    workload = build(load_config(config))
    run_step(workload, 0)
    record = _Record()
    with record:
        run_step(workload, 1)
    return record.calls


def _per_call(calls: list[Recorded], run: Callable[[Recorded], object]) -> float:
    start = time.perf_counter()
    for call in calls:
        run(call)
    return (time.perf_counter() - start) / len(calls)


def bench_abft(config: str | None = None, rounds: int = 8) -> dict[str, float]:
    """Median seconds per call of the op, the kernel check and the torch check; prints the ratios."""
    calls = step_calls(config)
    variants: dict[str, Callable[[Recorded], object]] = {
        "matmul": lambda c: c[0](*c[1], **c[2]),
        "torch": lambda c: abft.torch_check(*c),
    }
    if abft.abft_implementation() == "kernel":
        variants["kernel"] = lambda c: abft.check_matmul(*c)
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for _ in range(rounds):
            for name, run in variants.items():
                times[name].append(_per_call(calls, run))
    median = {name: statistics.median(t[1:]) for name, t in times.items()}
    us = {name: f"{t * 1e6:.0f} us" for name, t in median.items()}
    kernel = median.get("kernel", float("nan"))
    print(
        f"ABFT check         : kernel check / matmul = {kernel / median['matmul']:.2f}, torch ops / matmul = "
        f"{median['torch'] / median['matmul']:.2f}  (per call, {len(calls)} calls a step: {us})"
    )
    return median


def profile_checked_steps(config: str | None, steps: int, top: int = 25) -> None:
    """cProfile of ``steps`` traced steps with the ABFT checker on (after two warm-up steps), each drained."""
    cfg = load_config(config)
    w = build(cfg)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Tracer(
            w.model, w.optimizer, out=Path(tmp) / "run", run=RunInfo("profile", config=cfg.to_dict()), echo=None
        ) as t,
    ):
        checker = abft.AbftChecker(
            w.model, clock=lambda: (t.step_index, t.microbatch_index), sink=lambda kind, fields: t.event(kind, **fields)
        )
        profiler = cProfile.Profile()
        for step in range(2 + steps):
            if step == 2:
                profiler.enable()
            with checker, t.step(step):
                run_step(w, step, t)
            t.sync()
        profiler.disable()
    stats = pstats.Stats(profiler)
    print(calls_per_step(stats, steps, ("/faults/", "/tracer/"), "faults/ and tracer/"))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("ncalls").print_stats(r"faults/|tracer/", top)
    print(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="workload config (default: tiny)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--profile", type=int, metavar="N", help="profile N traced steps with the checker instead")
    args = p.parse_args(argv)
    if args.profile:
        profile_checked_steps(args.config, args.profile)
        return 0
    bench_abft(args.config, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
