"""XLA CPU against eager CPU, traced and untraced, in one process (torch 2.9 + torch-xla).

    make bench-xla        # or: PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/bench_xla.py [--steps N]

Four identical workloads take turns step by step, in an order shuffled each step: eager and XLA, each untraced
and traced. A traced step's clock stops after `Tracer.sync` (its records written and its writer drained); an
XLA step's after its graph ran and its losses were read (`run_step` reads them). Each ratio is the ratio of mean
step times over the steps after the first ``--warm``, paired step by step, with its bootstrap 95 % interval
(benchmarks/intervals.py). The first steps compile (step 0 builds the optimizer's state, a graph of its own):
they, the Tracers' start and their close are one-time costs, printed in seconds apart from the ratios. It also
counts, per traced XLA step, the graphs run and the host reads (torch_xla's metrics). No target: it reports
what XLA costs.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from intervals import Ratio, paired_ratio

NAMES = ("eager", "eager traced", "xla", "xla traced")


@dataclass(frozen=True)
class StepTimes:
    """Each variant's seconds per step, from step 0; the i-th of every variant were measured in one round."""

    seconds: Mapping[str, Sequence[float]]
    warm: int  # the first steps, which compile: one-time cost, left out of the ratios

    def ratio(self, name: str, base: str) -> Ratio:
        """Mean step time of ``name`` over ``base``'s, steps after the warm-up paired by step."""
        return paired_ratio(self.seconds[name][self.warm :], self.seconds[base][self.warm :])

    def first_steps(self, name: str) -> Sequence[float]:
        return self.seconds[name][: self.warm]


def counts() -> tuple[int, int, int, float]:
    """Graphs run, host reads, compilations, seconds compiling so far (after pending work ends)."""
    import torch_xla
    import torch_xla.debug.metrics as met

    torch_xla._XLAC._xla_wait_device_ops([])
    execute, transfer, compile_ = (met.metric_data(n) for n in ("ExecuteTime", "TransferFromDeviceTime", "CompileTime"))
    return (
        execute[0] if execute else 0,
        transfer[0] if transfer else 0,
        compile_[0] if compile_ else 0,
        compile_[1] / 1e9 if compile_ else 0.0,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="steps per workload (default 12)")
    p.add_argument("--warm", type=int, default=3, help="first steps left out of the ratios (default 3)")
    p.add_argument("--config", help="workload config (default: tiny)")
    args = p.parse_args(argv)
    if args.steps - args.warm < 2:
        p.error("--steps must exceed --warm by 2 or more: a ratio's interval needs two steps")
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla
    from timing import machine_load

    from tracer.options import RunInfo
    from tracer.tracing import Tracer
    from workload.protocol import run_step
    from workload.reference import build
    from workload.reference_config import load_config

    print(machine_load())
    cfg = load_config(args.config)
    devices = ("cpu", "cpu", torch_xla.device(), torch_xla.device())
    workloads = dict(zip(NAMES, (build(cfg, d) for d in devices)))
    times: dict[str, list[float]] = {n: [] for n in NAMES}
    per_step: list[tuple[int, int, int, int]] = []  # traced XLA steps: step, graphs, reads, compilations
    once: dict[str, float] = {}  # one-time costs other than the first steps, seconds
    order, rng = list(NAMES), random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        tracers = {}
        for n in NAMES[1::2]:
            s = time.perf_counter()
            tracer = Tracer(
                workloads[n].model,
                workloads[n].optimizer,
                out=Path(tmp) / n.replace(" ", "-"),
                run=RunInfo("bench", config=cfg.to_dict()),
                echo=None,
            )
            tracers[n] = tracer.__enter__()
            once[f"{n}: Tracer start"] = time.perf_counter() - s
        try:
            for step in range(args.steps):
                rng.shuffle(order)
                for name in order:
                    w, tracer = workloads[name], tracers.get(name)
                    before = counts()  # also waits: no XLA work overlaps the next step
                    s = time.perf_counter()
                    if tracer is None:
                        run_step(w, step)
                    else:
                        with tracer.step(step):
                            run_step(w, step, tracer)
                        tracer.sync()  # the writer's work for this step is this step's cost
                    times[name].append(time.perf_counter() - s)
                    if name == "xla traced":
                        after = counts()
                        per_step.append((step, *(a - b for a, b in zip(after[:3], before[:3]))))
        finally:
            for n, tracer in tracers.items():
                s = time.perf_counter()
                tracer.__exit__(None, None, None)
                once[f"{n}: Tracer close"] = time.perf_counter() - s
    report(StepTimes(times, args.warm), once, counts()[3], per_step)
    return 0


def report(
    t: StepTimes, once: Mapping[str, float], compiling: float, per_step: list[tuple[int, int, int, int]]
) -> None:
    steady = len(t.seconds["xla"]) - t.warm
    print(f"steady state: mean step time over steps {t.warm}-{t.warm + steady - 1}, paired by step")
    print(f"xla / eager, untraced          : {t.ratio('xla', 'eager').describe()}")
    print(f"xla / eager, traced            : {t.ratio('xla traced', 'eager traced').describe()}")
    print(f"tracing on xla, traced/untraced: {t.ratio('xla traced', 'xla').describe()}")
    print(f"tracing eager, traced/untraced : {t.ratio('eager traced', 'eager').describe()}")
    print(
        f"one-time cost (s)              : compiling {compiling:.1f} in all; first {t.warm} steps: "
        + "; ".join(f"{n} {', '.join(f'{s:.2f}' for s in t.first_steps(n))}" for n in NAMES)
    )
    print("one-time cost (s), Tracers     : " + ", ".join(f"{k} {v:.2f}" for k, v in once.items()))
    print(
        "host syncs per traced xla step : "
        + ", ".join(
            f"step {s}: {g} graph{'s' * (g != 1)}, {r} reads{f', {c} compiled' if c else ''}" for s, g, r, c in per_step
        )
    )


if __name__ == "__main__":
    sys.exit(main())
