"""XLA CPU against eager CPU, traced and untraced, in one process (torch 2.9 + torch-xla).

    make bench-xla        # or: PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/bench_xla.py [--steps N]

Four identical workloads take turns step by step: eager and XLA, each untraced and
traced. Medians skip the first steps, which compile (step 0 builds the optimizer's
state, so it is a graph of its own). It also counts, per traced XLA step, the graphs
run and the host reads (torch_xla's metrics). No target: it reports what XLA costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch_xla  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402

from tracer.options import RunInfo  # noqa: E402
from tracer.tracing import Tracer  # noqa: E402
from workload.reference_config import load_config  # noqa: E402
from workload.protocol import run_step
from workload.reference import build  # noqa: E402


def counts() -> tuple[int, int, int, float]:
    """Graphs run, host reads, compilations, seconds compiling so far (after pending work ends)."""
    torch_xla._XLAC._xla_wait_device_ops([])
    execute, transfer, compile_ = (met.metric_data(n) for n in ("ExecuteTime", "TransferFromDeviceTime", "CompileTime"))
    return (execute[0] if execute else 0, transfer[0] if transfer else 0, compile_[0] if compile_ else 0,
            compile_[1] / 1e9 if compile_ else 0.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="steps per workload (default 12)")
    p.add_argument("--warm", type=int, default=3, help="first steps left out of the medians (default 3)")
    p.add_argument("--config", help="workload config (default: tiny)")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    names = ("eager", "eager traced", "xla", "xla traced")
    devices = ("cpu", "cpu", torch_xla.device(), torch_xla.device())
    workloads = [build(cfg, d) for d in devices]
    times: dict[str, list[float]] = {n: [] for n in names}
    per_step: list[tuple[int, int, int, int]] = []  # traced XLA steps: step, graphs, reads, compilations
    with tempfile.TemporaryDirectory() as tmp:
        tracers = {
            n: Tracer(w.model, w.optimizer, out=Path(tmp) / n.replace(" ", "-"),
                      run=RunInfo("bench", config=cfg.to_dict()), echo=None)
            for n, w in zip(names, workloads) if n.endswith("traced")
        }
        for tracer in tracers.values():
            tracer.__enter__()
        try:
            for step in range(args.steps):
                for name, w in zip(names, workloads):
                    tracer = tracers.get(name)
                    before = counts()  # also waits: no XLA work overlaps the next step
                    s = time.perf_counter()
                    if tracer is None:
                        run_step(w, step)
                    else:
                        with tracer.step(step):
                            run_step(w, step, tracer)
                    times[name].append(time.perf_counter() - s)
                    if name == "xla traced":
                        after = counts()
                        per_step.append((step, *(a - b for a, b in zip(after[:3], before[:3]))))
        finally:
            for tracer in tracers.values():
                tracer.__exit__(None, None, None)
    med = {n: statistics.median(t[args.warm:]) for n, t in times.items()}
    ms = {n: f"{v * 1e3:.1f} ms" for n, v in med.items()}
    print(f"xla / eager step time, untraced : {med['xla'] / med['eager']:.2f}  ({ms['xla']} vs {ms['eager']})")
    print(f"xla / eager step time, traced   : {med['xla traced'] / med['eager traced']:.2f}  "
          f"({ms['xla traced']} vs {ms['eager traced']})")
    print(f"tracing overhead on xla         : traced/untraced = {med['xla traced'] / med['xla']:.2f}")
    print(f"tracing overhead eager          : traced/untraced = {med['eager traced'] / med['eager']:.2f}")
    print(f"compiling                       : {counts()[3]:.1f} s in all; first xla steps "
          f"{', '.join(f'{t:.1f}' for t in times['xla traced'][: args.warm])} s traced, "
          f"{', '.join(f'{t:.1f}' for t in times['xla'][: args.warm])} s untraced")
    print("host syncs per traced xla step  : " + ", ".join(
        f"step {s}: {g} graph{'s' * (g != 1)}, {r} reads{f', {c} compiled' if c else ''}" for s, g, r, c in per_step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
