"""The guard on healthy runs: what it costs when nothing fires, and how close its detectors come to firing.

    .venv/bin/python benchmarks/bench_guard.py [--steps N]                     # overhead, side by side
    .venv/bin/python benchmarks/bench_guard.py --rates --steps 300 --seeds 3   # detector statistics

Overhead target (issue 15): a guarded traced step <= 1.02x a traced step when nothing fires.
``--rates`` trains healthy runs of the reference workload (one per model seed) under a guard
that never fires, keeps every step's `Evidence`, and prints each detector's statistic (the
loss's robust z-score, the gradient-norm and update-RMS ratios to their running medians) next
to the default threshold: the numbers docs/guard.md quotes for the defaults.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from intervals import Ratio
from timing import WARMUP, interleave, traced_step

from faults import load_profile
from faults.node import emulated_node
from tracer.guard import Evidence, GradNormSpike, Guard, LossSpike, NonFinite, UpdateRmsSpike, default_guard
from tracer.guard.detectors import Alarm, robust_z
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import load_config

TARGET = 1.02


def bench_guard_overhead(steps: int, config: str | None = None) -> Ratio:
    """Interleave traced steps and guarded traced steps (default detectors, healthy: nothing fires) of two
    identical workloads, each drained; the ratio of their mean step times."""
    cfg = load_config(config)
    traced, guarded = build(cfg), build(cfg)
    own: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        run = RunInfo("bench", config=cfg.to_dict())
        with (
            Tracer(traced.model, traced.optimizer, out=Path(tmp) / "traced", run=run, echo=None) as t_plain,
            Tracer(
                guarded.model, guarded.optimizer, out=Path(tmp) / "guarded", run=run, guard=default_guard(), echo=None
            ) as t_guard,
        ):
            timed(t_guard._guard, own)
            steps_timed = interleave(
                {"traced": traced_step(traced, t_plain), "guarded": traced_step(guarded, t_guard)}, steps
            )
    per_step = sum(own[WARMUP * 3 :]) / steps  # three timed calls a step
    print(
        f"guard overhead     : guarded/traced = {steps_timed.describe('guarded', 'traced', TARGET)}; healthy: "
        f"nothing fires; the guard's own work {per_step * 1e6:.0f} us a step = "
        f"{per_step / steps_timed.mean('traced'):.4f} of a traced step"
    )
    return steps_timed.ratio("guarded", "traced")


def timed(guard: object, into: list[float]) -> None:
    """Time the guard's three calls of a step that nothing flags (saving the RNG, the evidence and checks, writing
    the held records out: an upper bound, since the records are written anyway), without changing them."""
    for name in ("begin", "evidence", "accept"):
        call = getattr(guard, name)

        def clocked(*args: object, call: Callable[..., object] = call, **kwargs: object) -> object:
            s = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - s)

        setattr(guard, name, clocked)


@dataclass
class Recorder:
    """A detector that never fires and keeps every step's evidence."""

    seen: list[Evidence] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "recorder"

    def check(self, evidence: Evidence) -> Alarm | None:
        self.seen.append(evidence)
        return None


def run_evidence(
    config: str | None, steps: int, seed: int, profile: str | None = None
) -> tuple[list[Evidence], set[int]]:
    """Every step's evidence of one run (the update RMS included), and the steps the profile's faults hit."""
    cfg = load_config(config, [f"train.seed={seed}", f"run.steps={steps}"])
    w = build(cfg)
    recorder = Recorder()
    guard = Guard(detectors=(recorder, UpdateRmsSpike(factor=1e30)))
    with tempfile.TemporaryDirectory() as tmp:
        tracer = Tracer(
            w.model,
            w.optimizer,
            out=Path(tmp) / "run",
            run=RunInfo("rates", config=cfg.to_dict()),
            guard=guard,
            echo=None,
        )
        node = emulated_node(tracer, w.model, fault_profile=load_profile(profile) if profile else None)
        with tracer, node:
            for step in range(steps):
                with tracer.step(step):
                    run_step(w, step, tracer)
        faulted = {
            r.step
            for r in LogReader(rank_dir(Path(tmp) / "run", 0)).records()
            if isinstance(r, EventRecord) and r.kind == "fault"
        }
    return recorder.seen, faulted


def statistic(d: LossSpike | GradNormSpike | UpdateRmsSpike, e: Evidence) -> float | None:
    """What ``d`` compares with its threshold on ``e``: None while it is quiet for want of history."""
    name = {LossSpike: "loss", GradNormSpike: "grad_norm", UpdateRmsSpike: "update_rms"}[type(d)]
    value, past = getattr(e, name), getattr(e.past, name)[-d.window :]
    if value is None or len(past) < d.min_history:
        return None
    if isinstance(d, LossSpike):
        return robust_z(value, past, d.floor)
    return value / statistics.median(past)


def bench_rates(steps: int, seeds: int, config: str | None = None) -> None:
    detectors = (LossSpike(), GradNormSpike(), UpdateRmsSpike())
    runs = [run_evidence(config, steps, seed)[0] for seed in range(seeds)]
    total = sum(len(r) for r in runs)
    print(f"guard detectors on healthy runs: {config or 'tiny'}, {seeds} model seeds x {steps} steps")
    print(
        f"  {'detector':<18} {'threshold':>9} {'median':>8} {'p99':>8} {'max':>8} {'at step':>7}  {'alarms':>6}"
        "  checked steps"
    )
    for d in detectors:
        stepped = sorted((v, e.step) for run in runs for e in run if (v := statistic(d, e)) is not None)
        values = [v for v, _ in stepped]
        threshold = d.z if isinstance(d, LossSpike) else d.factor
        alarms = sum(v > threshold for v in values)
        p99 = values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]
        print(
            f"  {d.name:<18} {threshold:>9.3g} {statistics.median(values):>8.3f} {p99:>8.3f} {values[-1]:>8.3f} "
            f"{stepped[-1][1]:>7}  {alarms:>6}  {len(values)}"
        )
    nonfinite = sum(NonFinite().check(e) is not None for run in runs for e in run)
    print(f"  {'non_finite':<18} {'-':>9} {'':>8} {'':>8} {'':>8} {'':>7}  {nonfinite:>6}  {total}")


def bench_profiles(steps: int, profiles: list[str], config: str | None = None) -> None:
    """Each detector's statistic on the steps a shipped fault profile hits, against its default threshold: what
    the defaults catch (the healthy runs say what they cost)."""
    detectors = (NonFinite(), LossSpike(), GradNormSpike(), UpdateRmsSpike())
    print(f"guard detectors on faulty runs: {config or 'tiny'}, {steps} steps, fault seed 0 (caught / faulted steps)")
    for profile in profiles:
        seen, faulted = run_evidence(config, steps, 0, profile)
        parts = []
        for d in detectors:
            fired = {e.step for e in seen if d.check(e) is not None}
            parts.append(
                f"{d.name} {len(fired & faulted)}/{len(faulted)}"
                + (f" (+{len(fired - faulted)} unfaulted)" if fired - faulted else "")
            )
        print(f"  {profile:<16} " + ", ".join(parts))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--config", help="workload config (default: tiny)")
    p.add_argument("--rates", action="store_true", help="detector statistics on healthy runs instead of the overhead")
    p.add_argument("--seeds", type=int, default=3, help="--rates: healthy runs, one per model seed (default 3)")
    p.add_argument(
        "--profiles",
        nargs="*",
        default=[],
        metavar="PROFILE",
        help="--rates: also score the defaults on runs of these fault profiles (e.g. loss-spike)",
    )
    args = p.parse_args(argv)
    if args.rates:
        bench_rates(args.steps, args.seeds, args.config)
        if args.profiles:
            bench_profiles(args.steps, args.profiles, args.config)
    else:
        bench_guard_overhead(args.steps, args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
