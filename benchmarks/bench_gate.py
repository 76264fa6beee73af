"""What the fault emulator adds to each op call it sees when nothing fires: the C++ gate against the Python kernel.

    .venv/bin/python benchmarks/bench_gate.py [--calls 20000] [--rounds 12]

One process per implementation: this one (the gate, where faults' native kernel is built) and a child with
``SDCTRACE_FAULTS_NATIVE=torch`` (every call through the emulator's Python kernel; the kernel is loaded once per
process, so the two cannot share one). In each, ``--calls`` calls of ``torch.mul`` on 8 float32 elements with grad
enabled (the forward phase, as inside a training step) run without the emulator and then under it, with the
`healthy-node` profile (every family named, ``p_call = 0``: each call makes its draw, none is hit), round after
round. Printed per implementation: the time of a call without the emulator, and the emulator's cost per call, the
mean over rounds of (with - without) with its bootstrap 95 % interval (`intervals.mean_interval`).

The cost of a call in a loop is a lower bound: inside a training step the same Python runs between large ops, with
cold caches, and costs more (benchmarks/run.py's emulator line measures a whole step). No target: docs/faults.md
quotes these figures (the emulator's gate, Overhead).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch
from intervals import mean_interval
from timing import machine_load
from torch import nn

from faults import FaultEmulator, load_profile
from faults.emulator import emulator_implementation
from faults.scope import NATIVE_ENV


def per_call(calls: int, a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        torch.mul(a, b)
    return (time.perf_counter() - start) / calls


def measure(calls: int, rounds: int) -> None:
    """This process's implementation: a call's time without the emulator and the emulator's cost per call."""
    torch.set_num_threads(1)
    a = torch.randn(8, requires_grad=True)
    b = torch.randn(8)
    emulator = FaultEmulator(
        load_profile("healthy-node"), nn.Linear(8, 8), clock=lambda: (1, 0), sink=lambda kind, fields: None
    )
    plain, extra = [], []
    per_call(calls, a, b)  # warm-up: first-call allocation, the kernel's load
    with emulator:
        per_call(calls, a, b)
    for _ in range(rounds):
        without = per_call(calls, a, b)
        with emulator:
            with_emulator = per_call(calls, a, b)
        plain.append(without)
        extra.append(with_emulator - without)
    us = 1e6
    cost = mean_interval([x * us for x in extra])
    where = "C++ gate" if emulator_implementation() == "gate" else "Python kernel"
    print(
        f"emulator per call  : {where:<13}: +{cost.describe(unit=' us')} a call over "
        f"{sum(plain) / len(plain) * us:.2f} us without the emulator (torch.mul, 8 elements, healthy-node, "
        f"nothing fires; {rounds} rounds x {calls} calls)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000, help="calls per round (default 20000)")
    p.add_argument("--rounds", type=int, default=12, help="rounds of each variant (default 12)")
    p.add_argument("--here", action="store_true", help="measure this process's implementation only")
    args = p.parse_args(argv)
    if args.here:
        measure(args.calls, args.rounds)
        return 0
    print(machine_load(), flush=True)
    measure(args.calls, args.rounds)
    sys.stdout.flush()
    child = [sys.executable, __file__, "--here", "--calls", str(args.calls), "--rounds", str(args.rounds)]
    subprocess.run(child, check=True, env={**os.environ, NATIVE_ENV: "torch"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
