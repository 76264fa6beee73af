"""sdctrace benchmarks: each prints a ratio measured side by side in one run.

    make bench            # or: .venv/bin/python benchmarks/run.py [--steps N]

Targets (from the issues): traced / untraced step time <= 1.10 with every site,
gradient and parameter fingerprinted each step; <= 64 bytes per fingerprint event.
The fault emulator (on, no fault firing) and the ABFT checker are each reported
against a plain traced step; they have no target. Replaying one step costs at most
2x (parameter sync) and 3x (lockstep) a recorded step (bench_replay.py). The Beam
diff of a 1 000 000-event pair runs at >= 800 000 events/s and within 3x of the
same join in DuckDB (bench_diff.py). A 4-rank run (dp=2 x tp=2, sequence parallel)
reports its own traced / untraced ratio (bench_parallel.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path

import bench_diff
from bench_parallel import bench_parallel
from bench_replay import bench_replay
from timing import side_by_side, warmup

from faults import FaultEmulator, load_profile
from faults.abft import AbftChecker
from tracer.log import rank_dir
from tracer.log.reader import LogReader
from tracer.log.records import TensorRecord
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.config import load_config
from workload.protocol import run_step
from workload.reference import build


def bench_tracing_overhead(steps: int, config: str | None) -> tuple[float, float]:
    """Interleave untraced and traced steps of two identical workloads; median step times."""
    cfg = load_config(config)
    plain, traced = build(cfg), build(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        with Tracer(traced.model, traced.optimizer, out=out, run=RunInfo("bench", config=cfg.to_dict())) as tracer:
            plain_s, traced_s = side_by_side(plain, traced, tracer, steps)
        ratio = traced_s / plain_s
        per_event = _tensor_event_bytes(out)
    print(
        f"tracing overhead   : traced/untraced step time = {ratio:.3f}  "
        f"(median {traced_s * 1e3:.1f} ms vs {plain_s * 1e3:.1f} ms, {steps - warmup(steps)} steps, target <= 1.10)"
    )
    print(f"log size           : {per_event:.1f} bytes per fingerprint event on disk (target <= 64)")
    return ratio, per_event


def bench_interceptor_overhead(steps: int, config: str | None) -> tuple[float, float]:
    """Interleave steps of three identical traced workloads: plain, with the fault emulator
    (healthy-node: every op goes through it, none is corrupted), with the ABFT checker."""
    cfg = load_config(config)
    names = ("plain", "emulator", "abft")
    workloads = [build(cfg) for _ in names]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        tracers = [
            stack.enter_context(
                Tracer(w.model, w.optimizer, out=Path(tmp) / name, run=RunInfo("bench", config=cfg.to_dict()))
            )
            for w, name in zip(workloads, names)
        ]
        hooks = [
            {"clock": lambda t=t: (t.step_index, t.microbatch_index),
             "sink": lambda kind, fields, t=t: t.event(kind, **fields)}
            for t in tracers
        ]
        modes: list[AbstractContextManager] = [
            nullcontext(),
            FaultEmulator(load_profile("healthy-node"), workloads[1].model, **hooks[1]),
            AbftChecker(workloads[2].model, **hooks[2]),
        ]
        times: list[list[float]] = [[] for _ in names]
        for step in range(steps):
            for w, tracer, mode, t in zip(workloads, tracers, modes, times):
                with mode:
                    s = time.perf_counter()
                    with tracer.step(step):
                        run_step(w, step, tracer)
                    t.append(time.perf_counter() - s)
    warm = max(1, steps // 5)
    plain, emulator, abft = (statistics.median(t[warm:]) for t in times)
    print(
        f"fault emulator     : emulator-on/traced step time = {emulator / plain:.3f}  "
        f"(median {emulator * 1e3:.1f} ms vs {plain * 1e3:.1f} ms; healthy-node profile: no fault fires)"
    )
    print(
        f"ABFT checker       : abft-on/traced step time = {abft / plain:.3f}  "
        f"(median {abft * 1e3:.1f} ms vs {plain * 1e3:.1f} ms, {steps - warm} steps)"
    )
    return emulator / plain, abft / plain


def _tensor_event_bytes(run: Path) -> float:
    """Exact on-disk size of fingerprint records, from the gaps between their offsets."""
    sizes = []
    prev = None
    for e in LogReader(rank_dir(run, 0)).entries():
        if prev is not None and isinstance(prev.record, TensorRecord) and isinstance(e.record, TensorRecord) \
                and prev.segment == e.segment:
            sizes.append(e.offset - prev.offset)
        prev = e
    return statistics.mean(sizes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="steps per measurement (default 30)")
    p.add_argument("--config", help="workload config (default: tiny)")
    args = p.parse_args(argv)
    bench_tracing_overhead(args.steps, args.config)
    bench_interceptor_overhead(args.steps, args.config)
    bench_replay(config=args.config)
    bench_diff.main([])
    bench_parallel(config=args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
