"""Replica agreement's cost per step on 2 data-parallel ranks (the reference workload, dp=2).

    .venv/bin/python benchmarks/bench_replicas.py [STEPS]

Each rank trains and, after every step, runs the check `Guard(replicas=...)` runs after the optimizer step
(`tracer.guard.replicas.ReplicaCheck.compare`: one all-gather of the step's parameter and gradient fingerprints,
and the comparison) on the digests the Tracer records anyway. Printed: rank 0's mean time of the check with its
95 % interval over the steps, and its mean against an untraced step's (`paired_ratio`, the same steps); the first
`timing.WARMUP` steps apart, as one-time cost.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from intervals import Ratio, mean_interval, paired_ratio
from timing import WARMUP

from jobs.launch import launch
from tracer.fingerprint import digest_many
from tracer.guard import ReplicaAgreement
from tracer.guard.replicas import ReplicaCheck
from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import Config, load_config

LAYOUT = ["parallel.dp=2", "train.threads=1"]


def check_times(config: dict[str, Any], steps: int) -> dict[str, Any]:
    """One rank: per step, the step's time and the replica check's."""
    w = build(Config.from_dict(config))
    check = ReplicaCheck(ReplicaAgreement(), w.layout, w.groups.rank)
    params = list(w.model.named_parameters())
    step_s, check_s, events = [], [], []
    for step in range(steps):
        t0 = time.perf_counter()
        run_step(w, step)
        t1 = time.perf_counter()
        grads = (
            [(n, d) for (n, p), d in zip(params, digest_many([p.grad for _, p in params]))]
            if all(p.grad is not None for _, p in params)
            else []
        )
        digests = digest_many([p for _, p in params])  # what the Tracer records after the step anyway
        t2 = time.perf_counter()
        check.note_gradients(grads)
        check.compare(step, params, digests, lambda kind, **fields: events.append(fields))
        check_s.append(time.perf_counter() - t2)
        step_s.append(t1 - t0)
    return {"step": step_s, "check": check_s, "tensors": 2 * len(params), "alarms": len(events)}


def bench_replicas(steps: int = 30, config: str | None = None) -> Ratio:
    cfg = load_config(config, LAYOUT)
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    results = launch("bench_replicas:check_times", {"config": cfg.to_dict(), "steps": WARMUP + steps}, 2)
    r = results[0]
    checks, step_s = r["check"][WARMUP:], r["step"][WARMUP:]
    check = mean_interval([c * 1e3 for c in checks])
    share = paired_ratio(checks, step_s)
    first = sum(r["check"][:WARMUP]) - WARMUP * check.value / 1e3
    print(
        f"replica agreement  : {check.describe(unit=' ms')} a step (2 ranks, {r['tensors']} fingerprints each, one "
        f"all-gather) = {share.describe()} of an untraced step ({statistics.fmean(step_s) * 1e3:.1f} ms); first "
        f"{WARMUP} checks {first:+.4f} s over steady ones; alarms on healthy steps: {r['alarms']}"
    )
    return share


if __name__ == "__main__":
    bench_replicas(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
