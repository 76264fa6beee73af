"""What one sharpness estimate costs (`workload.sharpness.sharpness`), in seconds and in untraced training steps.

    .venv/bin/python benchmarks/bench_sharpness.py [--config tiny] [--rounds 5] [--iterations 20]

`record_run(..., sharpness=K)` estimates the golden run's sharpness at every checkpoint (docs/drift.md); this prints
what each estimate adds. After two warm-up steps, each round runs one untraced training step, one estimate with
``tol=0`` (all ``--iterations`` Hessian-vector products) and one with the default tolerance (it may stop early),
side by side on the same workload, so the i-th estimate and the i-th step share the machine's state. Printed: each
estimate's mean seconds with its bootstrap 95 % interval (`intervals.mean_interval`), and estimate / untraced step as
the paired ratio of means (`intervals.paired_ratio`), with the iterations the default tolerance took. No target.
Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from intervals import mean_interval, paired_ratio
from timing import machine_load

from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import load_config
from workload.sharpness import sharpness

WARMUP = 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="workload config (default: tiny)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of step, tol=0 estimate, default estimate")
    p.add_argument("--iterations", type=int, default=20, help="K, Hessian-vector products at most (default 20)")
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error("--rounds must be at least 2 (an interval needs two samples)")
    print(machine_load(), flush=True)
    w = build(load_config(args.config))
    for step in range(WARMUP):
        run_step(w, step)
    steps: list[float] = []
    options: dict[str, dict[str, float]] = {"tol=0": {"tol": 0.0}, "default tol": {}}
    estimates: dict[str, list[float]] = {name: [] for name in options}
    used: list[int] = []
    for i in range(args.rounds):
        step = WARMUP + i
        s = time.perf_counter()
        run_step(w, step)
        steps.append(time.perf_counter() - s)
        for name, kwargs in options.items():
            s = time.perf_counter()
            result = sharpness(w, step + 1, iterations=args.iterations, **kwargs)
            estimates[name].append(time.perf_counter() - s)
            if not kwargs:
                used.append(result.iterations)
    config = args.config or "tiny"
    print(f"untraced step      : {mean_interval(steps).describe(unit=' s')} ({config})", flush=True)
    for name, seconds in estimates.items():
        extra = f"; iterations {min(used)}-{max(used)} of {args.iterations}" if name == "default tol" else ""
        label = f"sharpness, {name}"
        print(
            f"{label:<19}: {mean_interval(seconds).describe(unit=' s')} = "
            f"{paired_ratio(seconds, steps).describe()} untraced steps (K={args.iterations}{extra})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)
    sys.exit(main())
