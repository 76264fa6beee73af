"""Read a rank's log back, telling a crash's torn tail apart from corruption.

A record cut short at the very end of the last segment is what a crash mid-write
leaves: it ends the log with a `TornTailWarning`. Anything else that fails its length,
type or CRC check is corruption: `LogCorruptionError` with file and byte offset, or,
with ``on_corruption="skip"``, a resynchronisation at the next valid frame, counted
in `LogStatus`. `read_segment` decodes one segment alone, for parallel readers; both decode
through `tracer.log.segment.Segment`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracer.errors import LogError, LogFormatError
from tracer.log.framing import HEADER_SIZE
from tracer.log.layout import list_segments, segment_path
from tracer.log.records import EventRecord, RunHeader, TensorRecord
from tracer.log.segment import Entry, LogStatus, OnCorruption, Segment, load_segment, report_corruption, skip_mode
from tracer.log.sessions import Resumption, Sessions, is_failed_session, resumption


def read_segment(
    data: Any, name: str, *, last: bool, on_corruption: OnCorruption = "raise"
) -> tuple[RunHeader | None, Iterator[Entry], LogStatus]:
    """Decode one segment's bytes (`name` is for messages) without the rest of its log.

    `last`: whether it is its log's last segment, the only one that may end torn.
    The header is None when the segment lost it (torn, or corrupt in skip mode).
    """
    status = LogStatus()
    seg = Segment(data, name, last=last, skip=skip_mode(on_corruption), status=status)
    status.first_record = seg.first_record
    return seg.header, seg.entries, status


class LogReader:
    """Reads one rank's log (a directory of segments) in order."""

    def __init__(self, directory: Path, *, on_corruption: OnCorruption = "raise") -> None:
        self.directory = Path(directory)
        self._skip = skip_mode(on_corruption)
        if not self.directory.is_dir():
            found = "a file" if self.directory.exists() else "nothing"
            raise LogFormatError(
                f"{self.directory}: expected a rank directory of *.sdclog segments, found {found}; "
                "pass <run>/rank-NNNNN"
            )
        self._indexed = list_segments(self.directory)
        if not self._indexed:
            raise LogFormatError(
                f"{self.directory}: holds no log segments (000000.sdclog, ...); pass <run>/rank-NNNNN "
                "of a run directory"
            )
        self.segments = [path for _, path in self._indexed]
        self.status = LogStatus()
        self.header = self._first_header()

    def records(self) -> Iterator[TensorRecord | EventRecord]:
        """Every TENSOR and EVENT record in log order, strings resolved."""
        for entry in self.entries():
            yield entry.record

    def entries(self) -> Iterator[Entry]:
        """Every record with its position; each call reads afresh into a new `status`.

        A resumed log (tracer.log.resume) reads as one timeline: records that a resumption
        after them supersedes are left out (counted in `status.superseded`).
        """
        status = self.status = LogStatus()
        sessions = find_sessions(self.directory)
        expected_index = 0
        expected_first: int | None = 0  # None once records went missing unseen
        last = len(self._indexed) - 1
        prev: Segment | None = None
        prev_first: int | None = None  # where `prev` starts: its HEADER's count, else where the chain says it must
        for i, (index, path) in enumerate(self._indexed):
            name = str(path)
            gap = None
            if index != expected_index:
                gap = str(segment_path(self.directory, expected_index))
                report_corruption(
                    status,
                    self._skip,
                    gap,
                    0,
                    f"segment file missing: expected segment {expected_index}, the next file is segment {index}",
                )
                status._lose(gap, 0, 0, 0)
                expected_first = None
            seg = Segment(
                load_segment(path),
                name,
                last=i == last,
                skip=self._skip,
                status=status,
                session_end=sessions.ends_session(index),
            )
            if prev is not None and prev_first is not None and seg.first_record is not None:
                # The HEADER counts the records before it: what the gap or the bad regions (a lost HEADER too) hid.
                missing = seg.first_record - prev_first - prev.data_records
                if gap is not None:
                    status._attribute(gap, missing - (prev.region_records if prev.lost else 0), 0)
                elif prev.lost:
                    status._attribute(prev.name, missing, prev.region_records)
            if seg.header is not None:
                self._check_same_run(seg.header, name)
            if seg.index is not None and seg.index != index:
                reason = f"file header says segment {seg.index} but the file name says {index}"
                report_corruption(status, self._skip, name, 12, reason)
            if expected_first is not None and seg.first_record is not None and seg.first_record != expected_first:
                report_corruption(
                    status,
                    self._skip,
                    name,
                    HEADER_SIZE,
                    f"segment starts at record {seg.first_record} but the segments before it hold {expected_first}: "
                    "records are missing from the end of the previous segment",
                )
            cutoff = sessions.cutoff(index)
            if cutoff is None:
                yield from seg.entries
            else:
                yield from _superseding(seg.entries, cutoff, status)
            prev, prev_first = seg, seg.first_record if seg.first_record is not None else expected_first
            expected_index = index + 1
            expected_first = None if seg.lost or seg.first_record is None else seg.first_record + seg.data_records

    def _first_header(self) -> RunHeader:
        # Every segment repeats the header: in skip mode a lost one is found in the next.
        scratch = LogStatus()
        for i, (_, path) in enumerate(self._indexed):
            seg = Segment(
                load_segment(path), str(path), last=i == len(self._indexed) - 1, skip=self._skip, status=scratch
            )
            seg.entries.close()  # only the head was wanted: release the mapping now
            if seg.header is not None:
                return seg.header
        raise LogFormatError(
            f"{self.directory}: no segment holds a readable run header (the writer died before writing "
            "one, or every copy is damaged)"
        )

    def _check_same_run(self, header: RunHeader, name: str) -> None:
        if (header.run_id, header.rank) != (self.header.run_id, self.header.rank):
            raise LogFormatError(
                f"{name}: segment of run {header.run_id} rank {header.rank}, but {self.segments[0]} is of run "
                f"{self.header.run_id} rank {self.header.rank}: two logs are mixed in one directory"
            )


def resumption_in(data: Any, name: str, index: int) -> Resumption | None:
    """The resumption that segment `index` starts, if any, from its bytes or a prefix holding its first records."""
    try:
        seg = Segment(data, name, last=False, skip=True, status=LogStatus())
        first = next(seg.entries, None)
        seg.entries.close()
    except LogError:  # not a segment at all: reading it reports that
        return None
    return resumption(first.record if first is not None else None, seg.first_record, index)


def find_sessions(directory: Path) -> Sessions:
    """The resumptions of the log in `directory`, from the head of each segment."""
    found = (resumption_in(load_segment(path), str(path), index) for index, path in list_segments(directory) if index)
    return Sessions(tuple(r for r in found if r is not None))


def _superseding(entries: Iterator[Entry], cutoff: int, status: LogStatus) -> Iterator[Entry]:
    """`entries` before step `cutoff`: a resumption rewrote the later ones."""
    for entry in entries:
        if entry.record.step < cutoff or is_failed_session(entry.record):
            yield entry
        else:
            status.records -= 1
            status.superseded += 1
