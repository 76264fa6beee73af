"""Whole runs in fresh processes, as a user pays for them: the cross-check of the in-process step ratios.

    .venv/bin/python benchmarks/whole_run.py tiny --steps 40 [--traced] [--set model.dim=256 ...]
    .venv/bin/python benchmarks/whole_run.py --kernel-load

A run builds the workload, then its clock starts just before the Tracer starts (the same point in a plain run) and
stops once the Tracer has closed (the last step's end in a plain run): the writer's work, the first step and the
close all inside. It prints one JSON line: wall_s; traced, also start_s, close_s and every step's seconds (steps
are not drained one by one, as in a user's run). ``--kernel-load`` prints the seconds the digest kernel's first load
takes in a fresh process, after the imports.

`process_pairs` runs plain and traced alternately (the order flips each pair, so the machine's drift over the
pairs cancels) and returns the `paired_ratio` of their wall times; `marginal` runs two lengths and returns the
steady cost per step from their difference (`intervals.marginal_ratio`), every one-time cost cancelled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from intervals import Ratio, marginal_ratio, paired_ratio
from timing import OneTime, lifetime


@dataclass(frozen=True)
class Pairs:
    """Wall times of plain and traced whole runs, in pairs; the traced runs' one-time cost."""

    plain_s: tuple[float, ...]
    traced_s: tuple[float, ...]
    one_time: OneTime

    @property
    def ratio(self) -> Ratio:
        return paired_ratio(self.traced_s, self.plain_s)

    def describe(self, target: float | None = None) -> str:
        return (
            f"{self.ratio.describe(target)}; whole runs, mean {statistics.fmean(self.traced_s):.2f} s vs "
            f"{statistics.fmean(self.plain_s):.2f} s"
        )


def run(config: str, overrides: list[str], steps: int, traced: bool) -> dict[str, object]:
    """One run in this process (the script's body)."""
    from tracer.options import RunInfo
    from tracer.tracing import Tracer
    from workload.protocol import run_step
    from workload.reference import build
    from workload.reference_config import load_config

    cfg = load_config(config, overrides)
    w = build(cfg)
    noted: dict[str, float] = {}
    step_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        tracer = (
            Tracer(w.model, w.optimizer, out=Path(tmp) / "run", run=RunInfo("bench", config=cfg.to_dict()), echo=None)
            if traced
            else None
        )
        start = time.perf_counter()
        with lifetime(tracer, noted) if tracer else nullcontext() as t:
            for step in range(steps):
                s = time.perf_counter()
                with t.step(step) if t else nullcontext():
                    run_step(w, step, t)
                step_s.append(time.perf_counter() - s)
        wall = time.perf_counter() - start
    return {"wall_s": wall, "steps": step_s, **noted}


def kernel_load() -> float:
    from tracer.fingerprint import digest_implementation

    s = time.perf_counter()
    digest_implementation()  # the first call loads the kernel
    return time.perf_counter() - s


def _fresh(*args: str) -> dict[str, Any]:  # the child's JSON line
    done = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def fresh_run(config: str, overrides: tuple[str, ...], steps: int, traced: bool) -> dict[str, Any]:
    """One run in a fresh process."""
    sets = [a for o in overrides for a in ("--set", o)]
    return _fresh(config, "--steps", str(steps), *sets, *(["--traced"] if traced else []))


def fresh_kernel_load() -> float:
    """Seconds of the digest kernel's first load, in a fresh process."""
    return float(_fresh("--kernel-load")["kernel_load_s"])


def process_pairs(config: str, overrides: tuple[str, ...], steps: int, pairs: int) -> Pairs:
    """``pairs`` plain and traced runs of ``steps`` steps, each in a fresh process, alternately."""
    plain, traced, runs = [], [], {False: [], True: []}
    for i in range(pairs):
        for is_traced in (False, True) if i % 2 == 0 else (True, False):
            r = fresh_run(config, overrides, steps, is_traced)
            (traced if is_traced else plain).append(float(r["wall_s"]))
            runs[is_traced].append(r)

    def first_step(r: dict[str, Any]) -> float:
        times: list[float] = r["steps"]
        return times[0] - statistics.fmean(times[1:])

    starts = [float(r["start_s"]) for r in runs[True]]
    closes = [float(r["close_s"]) for r in runs[True]]
    first = statistics.fmean(map(first_step, runs[True])) - statistics.fmean(map(first_step, runs[False]))
    return Pairs(tuple(plain), tuple(traced), OneTime(statistics.fmean(starts), first, statistics.fmean(closes)))


def marginal(config: str, overrides: tuple[str, ...], short: int, long: int, pairs: int) -> tuple[Ratio, Ratio]:
    """Traced / untraced cost per step, and traced seconds per step, from runs of ``short`` and ``long`` steps."""
    runs = {n: process_pairs(config, overrides, n, pairs) for n in (short, long)}
    return marginal_ratio(*(list(zip(runs[n].plain_s, runs[n].traced_s)) for n in (short, long)), long - short)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="tiny", help="workload config (default: tiny)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    p.add_argument("--steps", type=int, default=40, help="steps in the run (default 40)")
    p.add_argument("--traced", action="store_true", help="trace the run (default: plain)")
    p.add_argument("--kernel-load", action="store_true", help="only time the digest kernel's first load")
    args = p.parse_args(argv)
    if args.kernel_load:
        print(json.dumps({"kernel_load_s": kernel_load()}))
    else:
        print(json.dumps(run(args.config, args.set, args.steps, args.traced)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
