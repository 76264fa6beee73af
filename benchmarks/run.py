"""sdctrace benchmarks: each prints a ratio measured side by side in one run.

    make bench            # or: .venv/bin/python benchmarks/run.py [--steps N]

Targets (issue 16, on a quiet 2-core machine): traced / untraced step time <= 1.05 on
`tiny` (stretch 1.03) and <= 1.03 on `llama3-16l-mini`, with every site, gradient and
parameter fingerprinted each step, printed beside the other model sizes
(bench_tracing.py); fingerprint throughput >= 0.5 of memory copy bandwidth; <= 32 bytes
per fingerprint event on disk; fault emulator on, nothing firing, <= 1.10 and ABFT on
<= 1.30 a traced step; replaying one step <= 1.5x (parameter sync) and <= 2x
(lockstep) a recorded step (bench_replay.py); the Beam diff of a 1 000 000-event pair
within 3x of the same join in DuckDB at >= 800 000 events/s (bench_diff.py); on CUDA,
where there is a device, traced / untraced <= 1.02; a guarded step, nothing firing, <= 1.02
a traced one (bench_guard.py); `sdc watch` reports a divergence within one step of the suspect
writing it (bench_watch.py). A 4-rank run (dp=2 x tp=2,
sequence parallel) reports its own traced / untraced ratio (bench_parallel.py), and 2 data-parallel
ranks the replica agreement check's time per step (bench_replicas.py). A 2-rank FSDP2 job, traced / untraced
whole-run wall time <= 1.10 on CPU (bench_fsdp2.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path

import bench_diff
import bench_tracing
from bench_abft import bench_abft
from bench_fsdp2 import bench_fsdp2
from bench_guard import bench_guard_overhead
from bench_parallel import bench_parallel
from bench_replay import bench_replay
from bench_replicas import bench_replicas
from bench_watch import bench_watch
from timing import interleave, machine_load, traced_step

from faults import FaultEmulator, load_profile
from faults.abft import AbftChecker
from faults.emulator import emulator_implementation
from tracer.log import rank_dir
from tracer.log.reader import LogReader
from tracer.log.records import TensorRecord
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.reference_config import load_config
from workload.protocol import run_step
from workload.reference import build


def bench_tracing_overhead(steps: int, config: str | None) -> tuple[float, float]:
    """Interleave untraced and traced steps of two identical workloads; their ratio, and the log's size."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        r = bench_tracing.tracing_overhead(config or "tiny", (), steps, out=out)
        per_event = _tensor_event_bytes(out)
    print(f"tracing overhead   : traced/untraced step time = {r.describe()}, target <= 1.05, stretch 1.03)")
    print(f"log size           : {per_event:.1f} bytes per fingerprint event on disk (whole log / tensor records: "
          "run header, strings and events included; target <= 32)")
    return r.ratio, per_event


def bench_interceptor_overhead(steps: int, config: str | None) -> tuple[float, float]:
    """Interleave steps of three identical traced workloads: plain, with the fault emulator
    (healthy-node: every family named, so every forward and backward op of those families, about half
    the step's, reaches it and makes its draw; none is corrupted), with the ABFT checker. The emulator and the
    checker are entered around their own steps only (each is process-wide), outside the time measured."""
    cfg = load_config(config)
    names = ("plain", "emulator", "abft")
    workloads = [build(cfg) for _ in names]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        tracers = [
            stack.enter_context(
                Tracer(w.model, w.optimizer, out=Path(tmp) / name, run=RunInfo("bench", config=cfg.to_dict()),
                       echo=None)
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
        def inside(mode: AbstractContextManager, step: Callable[[int], float]) -> Callable[[int], float]:
            def run(index: int) -> float:
                with mode:
                    return step(index)

            return run

        timed = interleave({name: inside(mode, traced_step(w, tracer))
                            for name, w, tracer, mode in zip(names, workloads, tracers, modes)}, steps)
    gate = "the C++ gate" if emulator_implementation() == "gate" else "Python: the gate is not built"
    print(f"fault emulator     : emulator-on/traced step time = {timed.describe('emulator', 'plain')}; healthy-node: "
          f"no fault fires; decided in {gate}; target <= 1.10)")
    print(f"ABFT checker       : abft-on/traced step time = {timed.describe('abft', 'plain')}, target <= 1.30)")
    return timed.ratio("emulator", "plain"), timed.ratio("abft", "plain")


def _tensor_event_bytes(run: Path) -> float:
    """Rank 0's whole log on disk, run header, strings and events included, over the fingerprint (TENSOR) records it
    holds: an upper bound on what the records themselves take (tensor blocks have no per-record offset gaps)."""
    reader = LogReader(rank_dir(run, 0))
    records = sum(isinstance(r, TensorRecord) for r in reader.records())
    return sum(p.stat().st_size for p in reader.segments) / records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="steps per measurement (default 40)")
    p.add_argument("--config", help="workload config (default: tiny)")
    args = p.parse_args(argv)
    print(machine_load(), flush=True)
    bench_tracing_overhead(args.steps, args.config)
    bench_tracing.bench_throughput()
    bench_tracing.bench_scaling(max(10, args.steps // 2))
    bench_tracing.bench_cuda(max(10, args.steps // 2))
    bench_guard_overhead(args.steps, args.config)
    bench_watch(args.config)
    bench_interceptor_overhead(args.steps, args.config)
    bench_abft(args.config)
    bench_replay(config=args.config)
    # `sdc diff` runs its job in a fresh process, so the diff is measured in one too: in this process, after the
    # torch benchmarks, the same job ran 10-25 % slower (benchmarks/bench_diff.py alone: 2.3-2.7x DuckDB).
    sys.stdout.flush()
    subprocess.run([sys.executable, bench_diff.__file__], check=True)
    bench_parallel(config=args.config)
    bench_replicas(config=args.config)
    bench_fsdp2()
    return 0


if __name__ == "__main__":
    sys.exit(main())
