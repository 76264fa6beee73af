"""Tracing overhead of pipeline- and expert-parallel jobs on 2 ranks, traced / untraced whole-run wall time.

    .venv/bin/python benchmarks/bench_pp_ep.py [RUNS [STEPS]]

Two gloo ranks (`jobs.launch`) train each example workload through the workload protocol (`run_step`), as `sdc
record` does: examples/torchrun_pipeline.py (one stage per rank, 1F1B over 4 microbatches, send/recv observed) and
examples/torchrun_moe.py (experts split over the ranks, tokens exchanged by all-to-all, each expert a site). Each
run builds a fresh workload, seeded alike, then times STEPS steps from a barrier before the Tracer is made (its
hooks, its I/O thread, the first step) to a barrier after it is closed (the log written and flushed): the slower
rank counts and every one-time cost of a run is inside it. RUNS runs of each variant after `timing.WARMUP` warm-up
runs, in an order shuffled each time (`timing.interleave`; both ranks draw the same order). Printed per job: the
ratio of mean run times with its 95 % interval over the runs, and what the warm-up runs took over steady ones.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from intervals import Ratio
from timing import Interleaved, interleave, machine_load

from jobs.launch import launch
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer
from workload.protocol import build_workload, run_step

sys.path.append(str(Path(__file__).resolve().parents[1]))  # examples/ is not installed: the repository root

# name -> (workload entry, config overrides, the sites its docstring records)
JOBS: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "pipeline (1F1B)": ("examples.torchrun_pipeline:build", {"parallel": {"schedule": "1F1B"}}, None),
    "experts (all-to-all)": ("examples.torchrun_moe:build", {}, r"blocks\.\d+\.moe\.experts\.\d+"),
}


def whole_run(entry: str, config: dict[str, Any], sites: str | None, steps: int, out: Path | None):  # noqa: ANN201
    """A variant for `interleave`: one whole run of ``steps`` steps on a fresh workload, traced into ``out/run-N``
    (untraced where ``out`` is None); returns its wall time, barrier to barrier."""

    def run(index: int) -> float:
        w = build_workload(entry, config, torch.device("cpu"))
        dist.barrier()
        start = time.perf_counter()
        tracer = (
            None
            if out is None
            else Tracer(
                w.model,
                w.optimizer,
                out=out / f"run-{index}",
                run=RunInfo("bench-pp-ep", config=dict(w.config), seed=w.seed),
                options=TraceOptions(sites=sites),
                parallel=w.layout,
                echo=None,
            )
        )
        with tracer or nullcontext():
            for step in range(steps):
                with tracer.step(step) if tracer else nullcontext():
                    run_step(w, step, tracer)
        dist.barrier()
        return time.perf_counter() - start

    return run


def runs_side_by_side(job: str, runs: int, steps: int, out: str) -> dict[str, Any]:
    """One rank: ``runs`` untraced and traced runs of ``job`` after the warm-up runs, interleaved; each run's
    seconds."""
    entry, config, sites = JOBS[job]
    variants = {
        "untraced": whole_run(entry, config, sites, steps, None),
        "traced": whole_run(entry, config, sites, steps, Path(out)),
    }
    timed = interleave(variants, runs)
    return {
        "seconds": {n: list(t) for n, t in timed.seconds.items()},
        "warmup": {n: list(t) for n, t in timed.warmup.items()},
    }


def bench_pp_ep(runs: int = 10, steps: int = 10) -> dict[str, Ratio]:
    """Each job's traced / untraced ratio of whole-run times on 2 ranks, printed with its interval."""
    here = str(Path(__file__).resolve().parent)
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, root, os.environ.get("PYTHONPATH")]))
    ratios = {}
    for job in JOBS:
        with tempfile.TemporaryDirectory() as tmp:
            results = launch("bench_pp_ep:runs_side_by_side", {"job": job, "runs": runs, "steps": steps, "out": tmp}, 2)
        r = results[0]  # after a barrier: the job's time
        timed = Interleaved(
            {n: tuple(t) for n, t in r["seconds"].items()}, {n: tuple(t) for n, t in r["warmup"].items()}
        )
        described = timed.describe("traced", "untraced", item="run")
        print(f"2-rank {job:20s}: traced/untraced whole runs of {steps} steps = {described}", flush=True)
        ratios[job] = timed.ratio("traced", "untraced")
    return ratios


if __name__ == "__main__":
    print(machine_load(), flush=True)
    bench_pp_ep(*(int(a) for a in sys.argv[1:3]))
