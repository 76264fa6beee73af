"""sdctrace benchmarks: every metric of issue 32's table, each a ratio with its bootstrap 95 % interval and its
target's verdict (met only by the interval's upper end), with the machine's load at the start and at the end.

    make bench            # or: .venv/bin/python benchmarks/run.py [--quick] [--steps N] [--pairs P]

The method (benchmarks/timing.py): variants' steps interleaved in one process, in a shuffled order, each traced
step timed until the writer thread has drained it, so nothing the Tracer causes lands in another step; the ratio
of mean step times over every steady step; the first steps, the Tracer's start and close printed apart as
one-time cost in seconds. Cross-check: plain and traced whole runs in fresh processes, alternately
(benchmarks/whole_run.py).

Targets (issue 32, quiet 2-core machine): traced / untraced <= 1.05 on `tiny`, <= 1.03 on `llama3-16l-mini`,
<= 1.02 on ~100 M parameters (bench_tracing.py); fault emulator on, nothing firing, / traced <= 1.08; ABFT on /
traced <= 1.25; replaying a faulty step / a recorded step <= 1.5 (param-sync) and <= 2 (lockstep)
(bench_replay.py); the Beam diff of a 1 M-event pair within 3x of the same join in DuckDB at >= 800 k events/s
(bench_diff.py); CUDA, where there is a device, traced / untraced <= 1.02; `sdc --help` and `sdc query` < 0.5 s
each as whole processes (bench_startup.py). Also: fingerprint throughput >= 0.5 of copy bandwidth, <= 32 bytes a
fingerprint event on disk, a guarded step / a traced one <= 1.02 (bench_guard.py), `sdc watch` within one step
(bench_watch.py), 4-rank tracing (bench_parallel.py), replica agreement per step (bench_replicas.py), 2-rank FSDP2
whole runs <= 1.10 (bench_fsdp2.py), 2-rank pipeline- and expert-parallel whole runs, no target yet
(bench_pp_ep.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

import bench_diff
import bench_startup
import bench_tracing
from bench_abft import bench_abft
from bench_fsdp2 import bench_fsdp2
from bench_guard import bench_guard_overhead
from bench_parallel import bench_parallel
from bench_pp_ep import bench_pp_ep
from bench_replay import bench_replay
from bench_replicas import bench_replicas
from bench_watch import bench_watch
from intervals import Ratio
from timing import interleave, machine_load, traced_step

from faults import FaultEmulator, load_profile
from faults.abft import AbftChecker
from faults.emulator import emulator_implementation
from tracer.log import rank_dir
from tracer.log.reader import LogReader
from tracer.log.records import TensorRecord
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.reference import build
from workload.reference_config import load_config

EMULATOR_TARGET, ABFT_TARGET = 1.08, 1.25
BYTES_TARGET = 32


@dataclass(frozen=True)
class Budget:
    """How many steps, runs and pairs each benchmark takes: the full run, or --quick's check that all runs."""

    steps: int  # steady steps of tiny; other benchmarks scale from it
    pairs: int  # whole-process pairs
    whole_steps: int  # steps of a whole tiny run
    ranks_steps: int  # steps of the multi-rank benchmarks
    fsdp2_runs: int
    fsdp2_steps: int


FULL = Budget(steps=120, pairs=5, whole_steps=40, ranks_steps=30, fsdp2_runs=14, fsdp2_steps=20)
QUICK = Budget(steps=6, pairs=2, whole_steps=6, ranks_steps=4, fsdp2_runs=3, fsdp2_steps=3)


def bench_tracing_overhead(budget: Budget) -> float:
    """Every model size's tracing ratios and the Hugging Face Llama's (bench_tracing.py), and the bytes a fingerprint
    event takes on disk."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        bench_tracing.bench_scaling(budget.steps, budget.pairs, budget.whole_steps, out=out)
        bench_tracing.bench_hf_llama(budget.steps)
        per_event = _tensor_event_bytes(out)
    print(
        f"log size           : {per_event:.1f} bytes per fingerprint event on disk (whole log / tensor records: "
        f"run header, strings and events included; target <= {BYTES_TARGET})"
    )
    return per_event


def bench_interceptor_overhead(steps: int, config: str | None) -> tuple[Ratio, Ratio]:
    """Interleave steps of three identical traced workloads: plain, with the fault emulator
    (healthy-node: every family named, so every forward and backward op of those families, about half
    the step's, reaches it and makes its draw; none is corrupted), with the ABFT checker. The emulator and the
    checker are entered around their own steps only (each is process-wide), inside the time measured: a whole
    traced step with the checker on, drained."""
    cfg = load_config(config)
    names = ("plain", "emulator", "abft")
    workloads = [build(cfg) for _ in names]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        tracers = [
            stack.enter_context(
                Tracer(
                    w.model, w.optimizer, out=Path(tmp) / name, run=RunInfo("bench", config=cfg.to_dict()), echo=None
                )
            )
            for w, name in zip(workloads, names)
        ]
        hooks = [
            {
                "clock": lambda t=t: (t.step_index, t.microbatch_index),
                "sink": lambda kind, fields, t=t: t.event(kind, **fields),
            }
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

        timed = interleave(
            {
                name: inside(mode, traced_step(w, tracer))
                for name, w, tracer, mode in zip(names, workloads, tracers, modes)
            },
            steps,
        )
    gate = "the C++ gate" if emulator_implementation() == "gate" else "Python: the gate is not built"
    print(
        f"fault emulator     : emulator-on/traced = {timed.describe('emulator', 'plain', EMULATOR_TARGET)}; "
        f"healthy-node: no fault fires; decided in {gate}"
    )
    print(f"ABFT checker       : abft-on/traced, whole steps = {timed.describe('abft', 'plain', ABFT_TARGET)}")
    return timed.ratio("emulator", "plain"), timed.ratio("abft", "plain")


def _tensor_event_bytes(run: Path) -> float:
    """Rank 0's whole log on disk, run header, strings and events included, over the fingerprint (TENSOR) records it
    holds: an upper bound on what the records themselves take (tensor blocks have no per-record offset gaps)."""
    reader = LogReader(rank_dir(run, 0))
    records = sum(isinstance(r, TensorRecord) for r in reader.records())
    return sum(p.stat().st_size for p in reader.segments) / records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few steps of everything: checks that every benchmark runs; its figures mean nothing",
    )
    p.add_argument(
        "--steps",
        type=int,
        help=f"steady steps of tiny; the others scale from it (default {FULL.steps}, --quick {QUICK.steps})",
    )
    p.add_argument("--pairs", type=int, help=f"whole-process pairs per cross-check (default {FULL.pairs})")
    p.add_argument(
        "--config", help="workload config of the emulator, ABFT, guard and multi-rank benchmarks (default: tiny)"
    )
    args = p.parse_args(argv)
    budget = QUICK if args.quick else FULL
    budget = Budget(
        args.steps or budget.steps,
        args.pairs or budget.pairs,
        budget.whole_steps,
        budget.ranks_steps,
        budget.fsdp2_runs,
        budget.fsdp2_steps,
    )
    print(machine_load(), flush=True)
    bench_tracing_overhead(budget)
    bench_tracing.bench_throughput()
    bench_tracing.bench_cuda(max(4, budget.steps // 4))
    bench_interceptor_overhead(max(4, budget.steps // 2), args.config)
    bench_abft(args.config)  # the per-call split of the ABFT line above
    bench_guard_overhead(max(4, budget.steps // 2), args.config)
    bench_watch(args.config)
    bench_replay(8 if args.quick else 12, config=args.config)
    # `sdc diff` runs its job in a fresh process, so the diff is measured in one too: in this process, after the
    # torch benchmarks, the same job ran 10-25 % slower (benchmarks/bench_diff.py alone: 2.3-2.7x DuckDB). `sdc`'s
    # start-up is a whole process by definition.
    whole_processes = {
        bench_diff.__file__: ["--events", "20000", "--repeat", "3"] if args.quick else [],
        bench_startup.__file__: ["--runs", "3"] if args.quick else [],
    }
    for script, extra in whole_processes.items():
        sys.stdout.flush()
        subprocess.run([sys.executable, script, *extra], check=True)
    bench_parallel(budget.ranks_steps, config=args.config)
    bench_replicas(budget.ranks_steps, config=args.config)
    bench_fsdp2(budget.fsdp2_runs, budget.fsdp2_steps)
    bench_pp_ep(budget.fsdp2_runs, budget.fsdp2_steps)
    print(machine_load(when="after the run"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
