"""Where a traced step's time goes: Python's profile of traced steps, the Tracer's own functions first.

    .venv/bin/python benchmarks/profile_step.py [--config tiny] [--steps 40] [--top 30]

Runs a few warm-up steps, then ``--steps`` traced steps under cProfile, each drained (`Tracer.sync()`), and prints
the Python calls a step (in all, and in tracer/ with any `torch.compiler.disable` wrapper, which compiled code calls
around its hooks) and their own time (tottime) a step: the call counts do not depend on the machine's load, the
times do. Then those functions by cumulative time per step, beside the step's whole time. What cProfile cannot see:
the cost of the fingerprint kernels' memory reads to the model's own ops (caches), and the writer thread (its CPU
time is printed apart).
Not part of `make bench`: it explains a ratio that `benchmarks/bench_tracing.py` measures, it does not measure one.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import load_config


def thread_cpu_seconds(name: str) -> float:
    """CPU seconds so far of this process's thread called ``name`` (0 where /proc is not there)."""
    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            try:
                fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                return 0.0
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


OWN = ("/tracer/", "eval_frame.py")  # the tracer's functions, and the torch.compiler.disable wrapper's


def calls_per_step(
    stats: pstats.Stats, steps: int, own: tuple[str, ...] = OWN, label: str = "tracer/ and the compile wrapper"
) -> str:
    """Python calls a step and their tottime a step: in all, and in the functions whose file names hold one of
    ``own`` (`OWN`: the tracer's), called ``label``."""
    calls = tottime = own_calls = own_tottime = 0.0
    for (filename, _, _), (_, ncalls, tt, _, _) in stats.stats.items():  # type: ignore[attr-defined]  # not in pstats' stub
        calls, tottime = calls + ncalls, tottime + tt
        if any(part in filename for part in own):
            own_calls, own_tottime = own_calls + ncalls, own_tottime + tt
    return (
        f"Python calls a step: {calls / steps:.0f} in all ({tottime / steps * 1e3:.2f} ms tottime), "
        f"{own_calls / steps:.0f} in {label} ({own_tottime / steps * 1e3:.2f} ms tottime)"
    )


def profile(config: str, steps: int, top: int) -> None:
    cfg = load_config(config)
    w = build(cfg)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Tracer(
            w.model, w.optimizer, out=Path(tmp) / "run", run=RunInfo("profile", config=cfg.to_dict()), echo=None
        ) as t,
    ):
        for step in range(3):
            with t.step(step):
                run_step(w, step, t)
        t.sync()
        io_before, profiler = thread_cpu_seconds("sdctrace-io"), cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for step in range(3, 3 + steps):
            with t.step(step):
                run_step(w, step, t)
            t.sync()
        profiler.disable()
        wall = time.perf_counter() - start
        io_cpu = thread_cpu_seconds("sdctrace-io") - io_before
    out = io.StringIO()
    print(calls_per_step(pstats.Stats(profiler), steps))
    pstats.Stats(profiler, stream=out).sort_stats("cumtime").print_stats(r"tracer/|eval_frame", top)
    print(
        f"{config}: {steps} traced steps, {wall / steps * 1e3:.1f} ms a step under the profiler (which slows "
        f"Python); the I/O thread's CPU {io_cpu / steps * 1e3:.2f} ms a step (clock ticks: 0 means under one tick "
        "in all). cumtime / steps is a function's share of a step:"
    )
    print(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny", help="workload config (default: tiny)")
    p.add_argument("--steps", type=int, default=40, help="profiled steps (default 40)")
    p.add_argument("--top", type=int, default=30, help="functions printed (default 30)")
    args = p.parse_args(argv)
    profile(args.config, args.steps, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
