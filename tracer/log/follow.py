"""Follow one rank's log while it is written: each record once it is on disk, never one whose CRC fails.

    follower = LogFollower(rank_dir(run, 0), on_corruption="skip")
    for item in follower.follow(idle_timeout_s=600):   # or poll() in a loop of your own
        ...  # an Entry, a LostRange (corruption it passed over) or Resumed (the writer restarted)
    follower.state                                     # "finished", "crashed", ...

Reading: each `poll` decodes what was appended since the last one, at most
`POLL_BYTES` of it (plus one record, if a record is larger), with LogReader's own
decoder (`tracer.log.segment.Segment` in live mode), so the two agree on every record. A writer
only appends, and writes its buffer in chunks that may end inside a record: bytes on
disk are final, but the last record may be incomplete. So at a problem that no valid
frame follows (a frame cut short, a CRC that fails over the bytes there so far), the
follower waits: it is a record being written. A problem that a valid frame follows
is corruption, reported as LogReader reports it (a `LostRange` in skip mode). Once a
segment is final, LogReader's rules judge its end: when the next segment has bytes
(the writer finishes a segment before it writes the next), or when the writer is
gone (its lock released: `runlock`); a cut-short tail is then a crash's torn tail.

A run is finished at its END record and crashed when its writer's lock is free and
the log has no END. A crashed run may go on: a writer that resumes it (`sdc record
--resume`, `tracer.log.resume`) appends segments, the first starting with a
``resume`` marker, which the follower yields as `Resumed`: the records of its step
and later seen so far are superseded by those that follow. Resumptions already on
disk when the follower starts are applied as LogReader applies them: it yields the
log's one timeline. ``from_step`` leaves out the records of earlier steps (a consumer
that reads a log again from a resumption's step). A run written without the lock (a
Tracer in your own script) is never known to have crashed: a consumer's idle timeout
ends the wait.

A `LostRange` is handed out once a record after it shows where it ends; the number of
records it hid may be known only later (from the next segment's HEADER or END), and
`status.lost` then says it, as LogReader's does.

Memory: one segment's string table and at most one poll's records, whatever the
size of the files; segments are memory-mapped, not read into memory.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from tracer.errors import LogFormatError
from tracer.log.framing import FRAME, FRAME_SIZE, HEADER_SIZE
from tracer.log.layout import LOCK_FILE, segment_path
from tracer.log.reader import find_sessions
from tracer.log.records import RunHeader
from tracer.log.segment import Entry, LogStatus, LostRange, OnCorruption, Segment, report_corruption, skip_mode
from tracer.log.sessions import Sessions, resumption
from tracer.regular_files import open_regular

POLL_S = 0.05  # `follow`'s wait between polls when nothing is new: 20 small stat/read calls a second per log
POLL_BYTES = 1 << 20  # log bytes one `poll` decodes at most (~50 000 records): bounds what a poll returns

State = Literal["waiting", "writing", "crashed", "finished"]


@dataclass(frozen=True)
class Resumed:
    """The writer restarted from the checkpoint of `step`: records of `step` and later yielded before are
    superseded by those that follow."""

    segment: int  # the first segment of the new session
    step: int
    last_step: int | None  # the last step the crashed session had completed, as the marker says


FollowItem = Entry | LostRange | Resumed


class LogFollower:
    """Reads one rank's log (``<run>/rank-NNNNN``) while it is written; the run's lock tells whether its writer runs.

    `lock`: the writer's lock file (default: the run directory's); a missing one means "unknown".
    """

    def __init__(
        self,
        directory: Path,
        *,
        lock: Path | None = None,
        on_corruption: OnCorruption = "raise",
        poll_bytes: int = POLL_BYTES,
        from_step: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self._from_step = from_step  # records of earlier steps are read, not handed out
        # Resumptions already on disk: their superseded records are left out, as LogReader does, so a follower
        # started late yields the log's timeline; only resumptions that come later are announced (`Resumed`).
        self._sessions = find_sessions(self.directory) if self.directory.is_dir() else Sessions()
        self._lock = Path(lock) if lock is not None else self.directory.parent / LOCK_FILE
        self._skip = skip_mode(on_corruption)
        self._poll_bytes = poll_bytes
        self.status = LogStatus()  # as LogReader's: corruption, lost ranges, END
        self.header: RunHeader | None = None
        self._index = 0  # the segment being read
        self._file: BinaryIO | None = None
        self._seg: Segment | None = None
        self._prev: Segment | None = None  # the segment read before (its counts, for the next HEADER's checks)
        self._first_data = True  # the segment's next data record is its first (a resumption's marker)
        self._expected_first: int | None = 0  # HEADER `first_record` the next segment must have (None: unknown)
        self._settled = False  # the current segment was judged final
        self._emitted = 0  # entries of status.lost already handed out
        self._crashed = False

    @property
    def state(self) -> State:
        """finished (END read), crashed (no END, the writer's lock free; a resumption may follow), writing, or
        waiting (no log and no writer yet)."""
        if self.status.complete:
            return "finished"
        alive = self.writer_alive()
        if self._crashed and not alive:
            return "crashed"
        return "writing" if self.header is not None or alive else "waiting"

    def follow(self, *, poll_s: float = POLL_S, idle_timeout_s: float | None = None) -> Iterator[FollowItem]:
        """Every item until the run is finished, or nothing new came for `idle_timeout_s` (see `state`)."""
        idle_since = time.monotonic()
        while True:
            items = self.poll()
            yield from items
            if self.status.complete:
                return
            now = time.monotonic()
            if items:
                idle_since = now
            elif idle_timeout_s is not None and now - idle_since >= idle_timeout_s:
                return
            time.sleep(poll_s)

    def poll(self) -> list[FollowItem]:
        """What reached the disk since the last call (at most about `poll_bytes` of log); never blocks."""
        items: list[FollowItem] = []
        alive = self.writer_alive()  # before reading: what a writer wrote before it let go is on disk now
        budget = self._poll_bytes
        while budget > 0 and not self.status.complete:
            if self._seg is None and not self._open(alive):
                break
            seg = self._seg
            assert seg is not None
            start = seg.pos
            size = self._decode(items, budget)
            budget -= seg.pos - start
            if not seg.waiting and (seg.pos < size or seg.pos > start):
                continue  # the window ended, or more may have come meanwhile
            if self.status.complete or not self._at_end(items, alive, size):
                break
        self._emit_lost(items, final=self.status.complete or self._crashed)
        return items

    # -- segments --------------------------------------------------------------------
    def _open(self, alive: bool | None) -> bool:
        """Start reading segment `_index` once its head is on disk; False: not yet."""
        path = segment_path(self.directory, self._index)
        if self._file is None:
            if not path.exists():
                return False
            self._file, _ = open_regular(path, "log segment")
        size = os.fstat(self._file.fileno()).st_size
        seg = Segment(_mapped(self._file, size), str(path), last=False, skip=self._skip, status=self.status, live=True)
        if seg.head_pending:
            if alive is False:  # the writer died before the head was out: the segment holds no record
                if _has_bytes(segment_path(self.directory, self._index + 1)):
                    self._next_segment()
                    return self._open(alive)
                self._crashed = True
            return False
        if seg.header is not None:
            if self.header is None:
                self.header = seg.header
            elif (seg.header.run_id, seg.header.rank) != (self.header.run_id, self.header.rank):
                raise LogFormatError(
                    f"{path}: segment of run {seg.header.run_id} rank {seg.header.rank}, but the log began as run "
                    f"{self.header.run_id} rank {self.header.rank}: two logs are mixed in one directory"
                )
        if seg.index is not None and seg.index != self._index:
            report_corruption(
                self.status,
                self._skip,
                str(path),
                12,
                f"file header says segment {seg.index} but the file name says {self._index}",
            )
        prev = self._prev
        if prev is not None and prev.lost and prev.first_record is not None and seg.first_record is not None:
            # The HEADER counts the records before it: what the previous segment's bad regions hid.
            self.status._attribute(
                prev.name, seg.first_record - prev.first_record - prev.data_records, prev.region_records
            )
        expected = self._expected_first
        if expected is not None and seg.first_record is not None and seg.first_record != expected:
            report_corruption(
                self.status,
                self._skip,
                str(path),
                HEADER_SIZE,
                f"segment starts at record {seg.first_record} but the segments before it hold {expected}: "
                "records are missing from the end of the previous segment",
            )
        self._seg, self._first_data, self._settled, self._crashed = seg, True, False, False
        self.status.torn_tail = False  # a torn tail before a resumption ended a session, not the log
        return True

    def _decode(self, items: list[FollowItem], budget: int) -> int:
        """Decode from where the segment stopped, through about `budget` bytes; the file's size."""
        seg, f = self._seg, self._file
        assert seg is not None and f is not None
        size = os.fstat(f.fileno()).st_size
        if size <= seg.pos:
            return size
        data = _mapped(f, size)
        stop = min(size, seg.pos + max(budget, _frame_end(data, seg.pos)))
        self._take(seg.more(memoryview(data)[:stop]), items)
        if seg.waiting and stop < size:  # the window, not the file, ended inside a record or a bad region
            self._take(seg.more(data), items)
        return size

    def _take(self, entries: Iterator[Entry], items: list[FollowItem]) -> None:
        cutoff = self._sessions.cutoff(self._index)
        for entry in entries:
            self._emit_lost(items)
            if self._first_data:
                self._first_data = False
                assert self._seg is not None
                r = resumption(entry.record, self._seg.first_record, self._index)
                if r is not None:
                    if r not in self._sessions.resumptions:
                        items.append(Resumed(r.segment, r.step, r.last_step))
                    continue
            step = entry.record.step
            if step >= self._from_step and (cutoff is None or step < cutoff):
                items.append(entry)

    def _at_end(self, items: list[FollowItem], alive: bool | None, size: int) -> bool:
        """At the end of what the segment holds now: move to the next one or judge this one's end once it is
        final. True: reading can go on now."""
        seg = self._seg
        assert seg is not None
        nxt = segment_path(self.directory, self._index + 1)
        if not _has_bytes(nxt):  # the writer may still append here (it writes a segment out before the next)
            if alive is not False or self._settled:
                return False
            self._settle(items, last=True, session_end=False)
            self._crashed = not self.status.complete
            return False
        if seg.pos < size or seg.waiting:  # bytes that are no record: the next segment says what they were
            ready, resumed = _starts_session(nxt, self._index + 1)
            if not ready and alive is not False:
                return False
            self._settle(items, last=False, session_end=resumed)
        self._expected_first = None if seg.lost or seg.first_record is None else seg.first_record + seg.data_records
        self._prev = seg
        self._next_segment()
        return True

    def _settle(self, items: list[FollowItem], *, last: bool, session_end: bool) -> None:
        """The segment is final: judge what is left at its end as LogReader would."""
        seg, f = self._seg, self._file
        assert seg is not None and f is not None
        seg.settle(last=last, session_end=session_end)
        self._take(seg.more(_mapped(f, os.fstat(f.fileno()).st_size)), items)
        self._settled = True

    def _next_segment(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._seg = None, None
        self._index += 1

    def _emit_lost(self, items: list[FollowItem], final: bool = False) -> None:
        """Hand out the lost ranges whose end is known (a record after them), or all of them once the log ends."""
        lost = self.status.lost
        closed = len(lost) if final else len(lost) - self.status._open
        if closed > self._emitted:
            items.extend(lost[self._emitted : closed])
            self._emitted = closed

    def writer_alive(self) -> bool | None:
        """Whether a process holds the run's writer lock; None if there is no lock file (unknown)."""
        try:
            fd = os.open(self._lock, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            # A shared lock, taken and dropped at once: RunLock.acquire retries past so short a hold.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # drops the shared lock, if taken
        return False

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._seg = None, None

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _starts_session(path: Path, index: int) -> tuple[bool, bool]:
    """(whether segment `index` shows its first data record yet, whether that record is a resumption's marker)."""
    f, size = open_regular(path, "log segment")
    with f:
        seg = Segment(_mapped(f, size), str(path), last=False, skip=True, status=LogStatus(), live=True)
        first = next(seg.entries, None)
        seg.entries.close()
    if first is None:
        return False, False
    return True, resumption(first.record, seg.first_record, index) is not None


def _has_bytes(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _mapped(f: BinaryIO, size: int) -> Any:
    """The file's first `size` bytes, memory-mapped (pages are read as decoding touches them)."""
    return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""


def _frame_end(data: Any, pos: int) -> int:
    """How many bytes from `pos` the frame there takes, as its header says (0 if that is not on disk yet)."""
    if len(data) - pos < FRAME_SIZE:
        return 0
    length, _, _ = FRAME.unpack_from(data, pos)
    return FRAME_SIZE + length
