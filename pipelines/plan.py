"""The diff's plan, decided on the launcher before the Beam job starts: the runs, their pairing, the drift tasks.

    plan = plan_diff(request)          # a DiffRequest (pipelines.arguments)
    plan.sides()                       # {"golden": RunLayout, "suspect": ..., "twin": ..., "replay0": ...}

`plan_diff` describes every run (`pipelines.log_source.describe_run`: its segments and
each rank's header), validates the pair (`pipelines.pairing.validate_pair`: it fails
listing every differing field), and lists the checkpoints both runs hold, one
`DriftTask` per rank and step. `DiffPlan.pair_row` is the plan's own row of the
``pairs`` table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from apache_beam.io.filesystems import FileSystems

from pipelines import log_source
from pipelines.arguments import DiffRequest
from pipelines.log_source import RunLayout
from pipelines.loss_and_drift import DriftTask
from pipelines.pairing import pair_id, validate_pair
from pipelines.tolerance import ToleranceMap
from tracer.checkpoint.interface import checkpoint_files


@dataclass(frozen=True)
class DiffPlan:
    """Everything the job needs, decided on the launcher before it starts."""

    golden: RunLayout
    suspect: RunLayout
    replays: tuple[RunLayout, ...]
    pair_id: str
    steps_per_bucket: int
    drift: tuple[DriftTask, ...]
    twin: RunLayout | None = None
    baseline: bool = False  # the suspect is golden's pretraining shuffle-seed twin (pipelines.pairing)
    warnings: tuple[str, ...] = ()  # bit-changing settings that differ without stopping the pair
    tolerance: ToleranceMap | None = None  # places compared within a measured band (pipelines.tolerance)

    def sides(self) -> dict[str, RunLayout]:
        return {
            "golden": self.golden,
            "suspect": self.suspect,
            **({log_source.TWIN: self.twin} if self.twin is not None else {}),
            **{f"replay{i}": r for i, r in enumerate(self.replays)},
        }

    def run_ids(self) -> dict[tuple[str, int], str]:
        return {(side, rank): r.header.run_id for side, run in self.sides().items() for rank, r in run.ranks.items()}

    def pair_row(self) -> dict[str, Any]:
        """The ``pairs`` table's row of this plan."""
        return {
            "golden_path": self.golden.path,
            "suspect_path": self.suspect.path,
            "golden_run_id": self.golden.header.run_id,
            "suspect_run_id": self.suspect.header.run_id,
            "replay_paths": [r.path for r in self.replays],
            "replay_run_ids": [r.header.run_id for r in self.replays],
            "twin_run_id": self.twin.header.run_id if self.twin is not None else None,
            "baseline": self.baseline,
            "world_size": self.golden.header.world_size,
            "ranks": len(self.golden.ranks),
            "steps_per_bucket": self.steps_per_bucket,
            "created_unix": time.time(),
            "sdctrace_version": _version(),
        }


def plan_diff(request: DiffRequest) -> DiffPlan:
    """Describe the runs, validate the pair (and twin) and find the checkpoints both hold."""
    golden, suspect = request.golden, request.suspect
    g, s = log_source.describe_run(golden), log_source.describe_run(suspect)
    rs = tuple(log_source.describe_run(r) for r in request.replays)
    t = log_source.describe_run(request.twin) if request.twin is not None else None
    warnings = validate_pair(g, s, rs, t, baseline=request.baseline)
    g_ckpt, s_ckpt = log_source.list_checkpoints(golden), log_source.list_checkpoints(suspect)
    tasks = []
    for rank in sorted(g.ranks):
        for step in sorted(g_ckpt.get(rank, set()) & s_ckpt.get(rank, set()) - request.left_out_checkpoints):
            rel = checkpoint_files(step, rank)
            tasks.append(
                DriftTask(
                    rank,
                    step,
                    tuple(_join(golden, f) for f in rel),
                    tuple(_join(suspect, f) for f in rel),
                    (g.ranks[rank].header.run_id, s.ranks[rank].header.run_id),
                )
            )
    return DiffPlan(
        g,
        s,
        rs,
        pair_id(g, s),
        request.steps_per_bucket,
        tuple(tasks),
        t,
        request.baseline,
        tuple(warnings),
        request.tolerance,
    )


def _join(run: str, relpath: str) -> str:
    return FileSystems.join(run, *relpath.split("/"))


def _version() -> str:
    try:
        return metadata.version("sdctrace")
    except metadata.PackageNotFoundError:
        return "unknown"
