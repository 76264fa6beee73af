"""The ABFT check's cost per matmul on a workload's own products: check time / matmul time.

    .venv/bin/python benchmarks/bench_abft.py [--config tiny] [--rounds 8]

Records the checked calls of one training step (inputs and results kept), then times, round
after round and side by side, the op itself, `check_matmul` with the kernel and with torch ops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from faults import abft
from tracer.intercept import Call, Interceptor
from workload.reference_config import load_config
from workload.protocol import run_step
from workload.reference import build

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="workload config (default: tiny)")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    bench_abft(args.config, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
