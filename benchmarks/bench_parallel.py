"""Tracing overhead of a 4-rank run (dp=2 x tp=2, sequence parallel), traced / untraced step time.

    .venv/bin/python benchmarks/bench_parallel.py [STEPS]

Every rank builds two identical workloads and interleaves untraced and traced steps of them (`timing.side_by_side`:
every rank draws the same order; each traced step drained), so both are measured side by side under the same load;
each rank's step time includes its waits in collectives; a barrier after every step, outside the clock, keeps a
rank's wait for another's writer out of the next step. A step of the job takes as long as its slowest rank: the
ratio is that of the mean of the per-step maxima over ranks, with its 95 % interval over the steps; the first steps
are one-time cost. Four ranks share this machine's cores (one thread each), so absolute times are not those of a
real node.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch.distributed as dist
from intervals import Ratio
from timing import WARMUP, Interleaved, side_by_side

from jobs.launch import launch
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.reference import build
from workload.reference_config import Config, load_config

LAYOUT = ["parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "train.threads=1"]


def steps_side_by_side(config: dict[str, Any], steps: int, out: str) -> dict[str, list[float]]:
    """One rank: interleave untraced and traced steps; every step's seconds, warm-up steps first."""
    cfg = Config.from_dict(config)
    plain, traced = build(cfg), build(cfg)
    with Tracer(
        traced.model,
        traced.optimizer,
        out=out,
        run=RunInfo("bench", config=cfg.to_dict()),
        parallel=traced.layout,
        echo=None,
    ) as tracer:
        timed = side_by_side(plain, traced, tracer, steps, between=dist.barrier)
    return {name: [*timed.warmup[name], *timed.seconds[name]] for name in ("untraced", "traced")}


def slowest_rank(results: list[dict[str, list[float]]]) -> Interleaved:
    """Each step's time as the job's: the slowest rank's, per variant."""
    job = {name: [max(times) for times in zip(*(r[name] for r in results))] for name in results[0]}
    return Interleaved({n: tuple(t[WARMUP:]) for n, t in job.items()}, {n: tuple(t[:WARMUP]) for n, t in job.items()})


def bench_parallel(steps: int = 30, config: str | None = None) -> Ratio:
    cfg = load_config(config, LAYOUT)
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        results = launch(
            "bench_parallel:steps_side_by_side",
            {"config": cfg.to_dict(), "steps": steps, "out": str(Path(tmp) / "run")},
            4,
        )
    timed = slowest_rank(results)
    print(
        f"4-rank tracing     : traced/untraced, dp=2 x tp=2 with sp, the slowest rank's step = "
        f"{timed.describe('traced', 'untraced')}"
    )
    return timed.ratio("traced", "untraced")


if __name__ == "__main__":
    bench_parallel(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
