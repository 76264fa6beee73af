"""Tracing overhead of a 4-rank run (dp=2 x tp=2, sequence parallel), traced / untraced step time.

Every rank builds two identical workloads and interleaves untraced and traced
steps of them, so both are measured side by side under the same load; each rank's
step time includes its waits in collectives. Printed: the median over ranks of each
rank's median per-step traced / untraced ratio. Four ranks share this machine's cores
(one thread each), so absolute times are not those of a real node.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from timing import side_by_side

from jobs.launch import launch
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.reference_config import Config, load_config
from workload.reference import build

LAYOUT = ["parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "train.threads=1"]


def steps_side_by_side(config: dict[str, Any], steps: int, out: str) -> dict[str, float]:
    """One rank: interleave untraced and traced steps; median step times and the median per-step ratio."""
    cfg = Config.from_dict(config)
    plain, traced = build(cfg), build(cfg)
    with Tracer(traced.model, traced.optimizer, out=out, run=RunInfo("bench", config=cfg.to_dict()),
                parallel=traced.layout, echo=None) as tracer:
        timed = side_by_side(plain, traced, tracer, steps)
    return {"plain": timed.median("untraced"), "traced": timed.median("traced"),
            "ratio": timed.ratio("traced", "untraced"), "steps": len(timed.seconds["traced"])}


def bench_parallel(steps: int = 10, config: str | None = None) -> float:
    cfg = load_config(config, LAYOUT)
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        results = launch("bench_parallel:steps_side_by_side",
                         {"config": cfg.to_dict(), "steps": steps, "out": str(Path(tmp) / "run")}, 4)
    ratios = [r["ratio"] for r in results]
    ratio = statistics.median(ratios)
    print(
        f"4-rank tracing     : traced/untraced step time = {ratio:.3f}  (dp=2 x tp=2 with sp, per rank "
        f"{', '.join(f'{x:.2f}' for x in ratios)}; rank 0 median {results[0]['traced'] * 1e3:.0f} ms vs "
        f"{results[0]['plain'] * 1e3:.0f} ms, {results[0]['steps']} steps)"
    )
    return ratio


if __name__ == "__main__":
    bench_parallel(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
