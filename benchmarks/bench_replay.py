"""Cost of replaying one step, as a ratio to one recorded (traced) training step.

Targets (issue 4): parameter sync at most 2x, lockstep at most 3x.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from replay.engine import Replayer, suspect_from_profile
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord
from tracer.workload.config import load_config
from tracer.workload.train import record_run


def bench_replay(steps: int = 6, config: str | None = None) -> dict[str, float]:
    cfg = load_config(config, [f"run.steps={steps + 1}", "run.checkpoint_every=1"])
    suspect = suspect_from_profile("healthy-node")
    with tempfile.TemporaryDirectory() as tmp:
        golden = Path(tmp) / "golden"
        record_run(cfg, golden, node_label="bench", progress=False)
        walls = [
            r.fields["wall_s"]
            for r in LogReader(rank_dir(golden, 0)).records()
            if isinstance(r, EventRecord) and r.kind == "step"
        ]
        recorded = statistics.median(walls[1:])
        ratios = {}
        for mode in ("param-sync", "lockstep"):
            # Per-step time inside the replay loop: building the workloads and loading the
            # checkpoint happen once per replay, not once per step.
            summary = Replayer(golden, suspect, range(1, steps + 1), mode, Path(tmp) / mode, progress=False).run()
            ratios[mode] = statistics.median(r.wall_s for r in summary.steps) / recorded
    print(
        f"replay cost        : param-sync {ratios['param-sync']:.2f}x, lockstep {ratios['lockstep']:.2f}x one recorded "
        f"step ({recorded * 1e3:.0f} ms median; targets <= 2x and <= 3x)"
    )
    return ratios


if __name__ == "__main__":
    bench_replay()
