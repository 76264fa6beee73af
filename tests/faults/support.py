"""Shared by the fault emulator and ABFT tests: the shipped profile names, events of a run."""

from __future__ import annotations

from pathlib import Path

from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord

SHIPPED = {"healthy-node", "bursty-mismatch", "rare-huge", "loss-spike", "softmax-norm"}


def events(run: Path, kind: str) -> list[EventRecord]:
    return [r for r in LogReader(rank_dir(run, 0)).records() if isinstance(r, EventRecord) and r.kind == kind]
