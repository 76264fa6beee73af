"""Cost of replaying one step, as a ratio to one recorded (traced) training step.

Targets (issue 16): parameter sync at most 1.5x, lockstep at most 2x, with this
machine as the suspect executor (the real-hardware case). The same replay with an
emulated node (the healthy-node profile: the emulator runs, nothing fires) is
printed alongside; its extra cost is the emulator's, reported by `run.py` too.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from replay.replayer import Replayer
from replay.request import ReplayRequest, Suspect, suspect_from_profile
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord
from workload.reference_config import load_config
from jobs.record import record_run

THIS_MACHINE = Suspect("this-machine", None, 0, {"kind": "machine"})


def bench_replay(steps: int = 8, config: str | None = None) -> dict[str, float]:
    cfg = load_config(config, [f"run.steps={steps + 1}", "run.checkpoint_every=1"])
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
        for who, suspect in (("machine", THIS_MACHINE), ("emulated", suspect_from_profile("healthy-node"))):
            for mode in ("param-sync", "lockstep"):
                # Per-step time inside the replay loop: building the workloads and loading
                # the checkpoint happen once per replay, not once per step.
                out = Path(tmp) / f"{who}-{mode}"
                request = ReplayRequest(golden, out, range(1, steps + 1), suspect, mode=mode, progress=False)
                summary = Replayer(request).run()
                ratios[f"{who} {mode}"] = statistics.median(r.wall_s for r in summary.steps) / recorded
    print(
        f"replay cost        : param-sync {ratios['machine param-sync']:.2f}x, lockstep {ratios['machine lockstep']:.2f}x "
        f"one recorded step ({recorded * 1e3:.0f} ms median; targets <= 1.5x and <= 2x); with the emulator "
        f"(healthy-node): {ratios['emulated param-sync']:.2f}x and {ratios['emulated lockstep']:.2f}x"
    )
    return ratios


if __name__ == "__main__":
    bench_replay()
