"""The writing sessions of a resumed log: the marker that starts one, and the one timeline readers make of them.

A writer killed mid-run leaves a log without END, its last segment perhaps cut short.
Training restarts from a checkpoint (the state before step *c*) and the same log goes
on (`tracer.log.resume`): the new writer appends segment files after the last one,
never rewriting a byte, and the first of them holds, right after its HEADER, a
``resume`` EVENT at step *c*. Records of step *c* and later that the log holds before
that marker are superseded: the restarted training writes them again. `Sessions` says
which records those are, so `LogReader` yields one timeline, as if the run had never
stopped, and which segments end a session, so may end torn (docs/log-format.md,
"Resumed logs").

A resumed session that fails (a checkpoint that does not verify, a full disk) must not
make the log worse than the crash it continued: `abandon_failed` records why in a
``resume_failed`` EVENT and stops without END, so the log still reads as a crashed run
and the next ``--resume``, once the cause is fixed, continues it. A first session that
stops for lack of space (a full file system, a file-size limit) is left the same way,
with a ``no_space`` EVENT: what it recorded before is kept for a resume once there is
room. Readers keep both events in the timeline even where a later resumption
supersedes their step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

from tracer.log.records import EventRecord

RESUME = "resume"  # the event kind of the marker
RESUME_FAILED = "resume_failed"  # the event kind that records a resumed session's failure
NO_SPACE = "no_space"  # the event kind that records a first session stopped for lack of space (left resumable)
_DETAIL_CHARS = 2000


class _Log(Protocol):
    def write_event(self, rec: EventRecord) -> None: ...
    def flush(self, fsync: bool = False) -> None: ...
    def abandon(self) -> None: ...


@dataclass(frozen=True)
class Resumption:
    """A writing session that continues a log: where it starts and what it restarts from."""

    segment: int  # index of its first segment file
    step: int  # the checkpoint it restarted from: records of this step and later before it are superseded
    records: int  # TENSOR and EVENT records the log held before it (its first segment's HEADER `first_record`)
    last_step: int | None = None  # the last step the crashed session had completed, as the marker says


@dataclass(frozen=True)
class Sessions:
    """The resumptions of one log, in log order: which records they supersede, which segments may end torn."""

    resumptions: tuple[Resumption, ...] = ()

    def cutoff(self, segment: int) -> int | None:
        """Records of `segment` at this step or later are superseded (None: none are)."""
        later = [r.step for r in self.resumptions if r.segment > segment]
        return min(later) if later else None

    def ends_session(self, segment: int) -> bool:
        """A resumption starts right after `segment`: its writer crashed, so it may end torn."""
        return any(r.segment == segment + 1 for r in self.resumptions)


def marker(step: int, rank: int, last_step: int | None) -> EventRecord:
    """The ``resume`` event: restarted from the checkpoint of `step`; the log had completed `last_step`."""
    return EventRecord(RESUME, step, {"rank": rank, "last_step": last_step})


def resumption(first: EventRecord | object, first_record: int | None, index: int) -> Resumption | None:
    """The resumption that segment `index` starts, given its first data record and HEADER `first_record`."""
    if index == 0 or first_record is None or not (isinstance(first, EventRecord) and first.kind == RESUME):
        return None
    last = first.fields.get("last_step")
    return Resumption(index, first.step, first_record, last if type(last) is int else None)


def abandon_failed(log: _Log, step: int, rank: int, exc: BaseException, kind: str = RESUME_FAILED) -> None:
    """End a session that failed with ``exc`` and must stay resumable: a ``kind`` event at ``step`` (a resumption's
    own step for ``resume_failed``; the step it stopped in for ``no_space``), as far as the disk takes it, then no
    END. Never raises: the training error stays the one the user sees."""
    detail = f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
    with contextlib.suppress(Exception):
        log.write_event(EventRecord(kind, step, {"rank": rank, "detail": detail}))
        log.flush(fsync=True)
    with contextlib.suppress(Exception):
        log.abandon()


def is_failed_session(record: object) -> bool:
    """Whether ``record`` is a ``resume_failed`` or ``no_space`` event, which no later resumption supersedes."""
    return isinstance(record, EventRecord) and record.kind in (RESUME_FAILED, NO_SPACE)
