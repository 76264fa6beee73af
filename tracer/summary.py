"""What a run holds, at a glance: the facts behind ``sdc inspect``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tracer.checkpoint.step import list_step_checkpoints
from tracer.errors import LogFormatError
from tracer.log import list_ranks, rank_dir
from tracer.log.reader import LogReader
from tracer.log.records import EventRecord, Phase, RunHeader, TensorRecord
from tracer.log.segment import LogStatus
from tracer.log.sessions import NO_SPACE, RESUME


@dataclass
class RankSummary:
    rank: int
    header: RunHeader
    status: LogStatus
    segments: int
    bytes: int
    tensors: Counter[str] = field(default_factory=Counter)  # by phase name
    events: Counter[str] = field(default_factory=Counter)  # by kind
    steps: set[int] = field(default_factory=set)
    sites: list[str] = field(default_factory=list)  # forward sites in first-seen order
    parameters: int = 0
    checkpoints: list[int] = field(default_factory=list)  # steps with this rank's checkpoint, plain or sharded
    out_of_space: int | None = None  # the step a session stopped in for lack of space (its ``no_space`` event)

    @property
    def records(self) -> int:
        return sum(self.tensors.values()) + sum(self.events.values())

    @property
    def bytes_per_record(self) -> float:
        return self.bytes / self.records if self.records else 0.0


def summarize_run(run: str | Path, on_corruption: Literal["raise", "skip"] = "raise") -> list[RankSummary]:
    """Read every rank of ``run`` completely and count what is there."""
    run = Path(run)
    if not run.exists():
        raise LogFormatError(f"{run}: no such run directory")
    if not run.is_dir():
        raise LogFormatError(f"{run}: not a directory; pass a run directory made by `sdc record`")
    ranks = list_ranks(run)
    if not ranks:
        raise LogFormatError(f"{run}: holds no rank-NNNNN log directory; is it a run made by `sdc record`?")
    out = []
    for rank in ranks:
        reader = LogReader(rank_dir(run, rank), on_corruption=on_corruption)
        s = RankSummary(
            rank=rank,
            header=reader.header,
            status=reader.status,
            segments=len(reader.segments),
            bytes=sum(p.stat().st_size for p in reader.segments),
            checkpoints=list_step_checkpoints(run, rank),  # plain or sharded (DCP)
        )
        seen_sites: dict[str, None] = {}
        params: set[str] = set()
        for rec in reader.records():
            if isinstance(rec, TensorRecord):
                s.tensors[Phase(rec.phase).name.lower()] += 1
                s.steps.add(rec.step)
                if rec.phase == Phase.FORWARD:
                    seen_sites.setdefault(rec.name)
                elif rec.phase == Phase.PARAM:
                    params.add(rec.name)
            elif isinstance(rec, EventRecord):
                s.events[rec.kind] += 1
                if rec.kind == "step":
                    s.steps.add(rec.step)
                elif rec.kind in (NO_SPACE, RESUME):  # a later session started: it says how it ended
                    s.out_of_space = rec.step if rec.kind == NO_SPACE else None
        s.status = reader.status
        s.sites = list(seen_sites)
        s.parameters = len(params)
        out.append(s)
    return out
