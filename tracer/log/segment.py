"""One log segment decoded: `Segment` turns a segment's bytes into entries, reporting what it finds in a
`LogStatus`.

Every reader of the format decodes through it, so all of them agree on every record: `tracer.log.reader`
(a rank's whole log, and one segment alone), `tracer.log.columns` (a segment as arrays), `tracer.log.follow`
(a log while it is written, ``live=True``) and `tracer.log.resume`::

    status = LogStatus()
    seg = Segment(load_segment(path), str(path), last=True, skip=skip_mode("raise"), status=status)
    seg.header, seg.first_record            # read on construction
    for entry in seg.entries: ...           # Entry(segment, offset, record)

A record cut short at the very end of the last segment is a crash's torn tail (`TornTailWarning`); anything
else that fails its checks is corruption, raised (`LogCorruptionError`) or, in skip mode, counted in the
status with what it hid (`LostRange`).
"""

from __future__ import annotations

import mmap
import warnings
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any, Literal, NamedTuple

from tracer.errors import LogCorruptionError, LogFormatError, UsageError
from tracer.log.checked_block import BlockHead, declared_rows, decode_block, find_head, salvage_block
from tracer.log.codec import (
    PayloadError,
    block_rows,
    decode_end,
    decode_event,
    decode_header,
    decode_string,
    decode_tensor,
    decode_tensor_block,
)
from tracer.log.framing import (
    FILE_HEADER,
    FORMAT_VERSION,
    FRAME,
    FRAME_SIZE,
    HEADER_SIZE,
    MAGIC,
    MAX_RECORD_BYTES,
    RECORD_TYPES,
    RecordType,
    next_frame,
)
from tracer.log.records import EndRecord, EventRecord, RunHeader, TensorRecord
from tracer.regular_files import open_regular

OnCorruption = Literal["raise", "skip"]

# Plain ints for the per-record dispatch, in RecordType's order.
_HEADER, _STRING, _TENSOR, _EVENT, _END, _BLOCK = (int(t) for t in RecordType)
_SALVAGED = 0  # no record type: a v3 TENSOR_BLOCK in a damaged frame, whose own checks say which rows are good


class TornTailWarning(UserWarning):
    """The log ends inside a record: the writer crashed mid-write. Records before it are intact."""


class Entry(NamedTuple):
    """A record and where it sits; (segment, offset) orders a rank's records totally."""

    segment: int
    # Byte offset of the record's frame in its segment file; for the i-th record of a TENSOR_BLOCK, the block's
    # offset + i (a block holds more bytes than records: that stays below the next frame's offset).
    offset: int
    record: TensorRecord | EventRecord


@dataclass(frozen=True)
class LostRange:
    """Bytes a skip-mode reader passed over, and what they held as far as the framing tells.

    Corruption is never data: a reader that skips it says what was lost, so that no one
    reads the gap as a difference between runs.
    """

    file: str
    start: int  # byte offset of the first byte skipped
    stop: int  # byte offset where reading resumed (the next valid frame, or the end of the file)
    records: int  # TENSOR and EVENT records lost here, at least (exact when END or the next HEADER counts them)
    # Steps missing or incomplete, a best estimate from the records around the gap (every step ends
    # with a `step` event). first_step None: no record before the gap in what was read (the previous
    # segment knows); last_step None: no record after it (the gap runs to the end of what was read).
    first_step: int | None
    last_step: int | None

    @property
    def bytes(self) -> int:
        return self.stop - self.start


@dataclass
class LogStatus:
    """What reading found; filled while iterating, final once iteration ends."""

    complete: bool = False  # an END record was found (clean close)
    end: EndRecord | None = None
    torn_tail: bool = False  # the last segment ended inside a record (crash mid-write)
    records: int = 0  # TENSOR and EVENT records returned
    superseded: int = 0  # records a resumption wrote again, left out (tracer.log.resume)
    skipped_records: int = 0  # bad frames and undecodable records passed over in skip mode
    skipped_bytes: int = 0
    corruptions: list[tuple[str, int, str]] = field(default_factory=list)  # (file, byte offset, reason)
    # Records written before this segment, from its HEADER (None if that was lost); with
    # `records` it lets a parallel reader check that consecutive segments chain. 0 for a log.
    first_record: int | None = 0
    lost: list[LostRange] = field(default_factory=list)  # what skipped corruption hid, in log order
    # Where reading stands, for the step estimates of `lost`: the last data record's step, whether it
    # was a `step` event (the step's end marker), and how many trailing `lost` ranges await a next record.
    _last_step: int | None = field(default=None, repr=False)
    _after_marker: bool = field(default=False, repr=False)
    _open: int = field(default=0, repr=False)

    @property
    def lost_bytes(self) -> int:
        return sum(r.bytes for r in self.lost)

    @property
    def lost_records(self) -> int:
        """Records lost to corruption, at least."""
        return sum(r.records for r in self.lost)

    @property
    def lost_steps(self) -> tuple[int | None, int | None] | None:
        """(first, last) step missing or incomplete over every lost range (None: unknown, or open-ended); None if
        nothing was lost."""
        if not self.lost:
            return None
        firsts = [r.first_step for r in self.lost if r.first_step is not None]
        lasts = [r.last_step for r in self.lost if r.last_step is not None]
        n = len(self.lost)
        return (min(firsts) if len(firsts) == n else None, max(lasts) if len(lasts) == n else None)

    def _lose(self, file: str, start: int, stop: int, records: int) -> LostRange:
        """Add a gap; one that starts where the previous open one stopped extends it."""
        if self._open and self.lost[-1].file == file and self.lost[-1].stop == start:
            last = self.lost[-1]
            self.lost[-1] = replace(last, stop=stop, records=last.records + records)
            return self.lost[-1]
        first = None if self._last_step is None else self._last_step + 1 if self._after_marker else self._last_step
        self.lost.append(LostRange(file, start, stop, records, first, None))
        self._open += 1
        return self.lost[-1]

    def _resume(self, step: int, marker: bool) -> None:
        """A data record was read: it closes the open gaps (its step is the last one they touch)."""
        if self._open:
            for i in range(len(self.lost) - self._open, len(self.lost)):
                self.lost[i] = replace(self.lost[i], last_step=step)
            self._open = 0
        self._last_step, self._after_marker = step, marker

    def _attribute(self, file: str, missing: int, counted: int) -> None:
        """`missing` records of `file` are known lost (from a count), `counted` of them are in its ranges: the
        rest went with its last range."""
        if missing <= counted:
            return
        for i in range(len(self.lost) - 1, -1, -1):
            if self.lost[i].file == file:
                self.lost[i] = replace(self.lost[i], records=self.lost[i].records + missing - counted)
                return


class Segment:
    """Decodes one segment's bytes into entries, reporting problems into a shared LogStatus.

    Constructing it reads the file header and the HEADER record; `entries` does the rest.
    """

    def __init__(
        self,
        data: Any,
        name: str,
        *,
        last: bool,
        skip: bool,
        status: LogStatus,
        session_end: bool = False,
        live: bool = False,
    ) -> None:
        self._view = memoryview(data)
        self.name = name
        self._last = last
        # A resumption follows this segment (tracer.log.resume): a crash may have cut it short, silently.
        self._session_end = session_end
        # `data` is a file being written (tracer.log.follow): a problem that no valid frame follows may be a
        # record still being written, so decoding stops there (`waiting`) instead of judging it.
        self._live = live
        self.waiting = False
        self.pos = 0  # where decoding stopped: the next frame to read (live reading continues here)
        self._skip = skip
        self._status = status
        self._strings: dict[int, str] = {}
        self.index: int | None = None  # from the file header
        self.version = FORMAT_VERSION  # from the file header: which record types are defined, how blocks read
        # The head and the frame's problem of the v3 block `_frames` yields as _SALVAGED, for `_salvage`.
        self._salvaged: tuple[BlockHead, str] | None = None
        self.header: RunHeader | None = None
        self.first_record: int | None = None
        self.data_records = 0  # TENSOR and EVENT records in frames with a valid CRC, decodable or not
        self.lost = False  # a bad region hid an unknown number of records
        self.region_records = 0  # records the lost ranges of bad regions claim (at least one each)
        self._ended = False  # the END record was read: any bad byte after it is trailing garbage
        self.entries = self._records(self._head())

    def _head(self) -> Iterator[tuple[int, int, memoryview]]:
        """Read the file header and the HEADER record; the frames after them."""
        frames = self._frames(HEADER_SIZE) if self._file_header_ok() else iter(())
        first = next(frames, None)
        if first is not None and first[0] == HEADER_SIZE:  # the segment's first record
            if first[1] == _HEADER:
                try:
                    self.header, self.first_record = decode_header(first[2], self.name)
                except PayloadError as e:
                    self._bad_record(first[0], first[2], str(e))
            else:
                found = RecordType(first[1]).name if first[1] != _SALVAGED else "damaged TENSOR_BLOCK"
                self._bad_record(first[0], first[2], f"segment starts with a {found} record, expected HEADER")
            first = None
        return frames if first is None else chain((first,), frames)

    def more(self, data: Any) -> Iterator[Entry]:
        """Live reading: the entries of `data` (the same file, grown) from where decoding stopped."""
        self._view = memoryview(data)
        self.waiting = False
        return self._records(self._frames(self.pos))

    def settle(self, *, last: bool, session_end: bool) -> None:
        """Stop reading live: the file is final, so the next `more` judges a problem at its end as LogReader does."""
        self._live, self._last, self._session_end = False, last, session_end

    @property
    def head_pending(self) -> bool:
        """Live reading stopped before the HEADER: the file is too new to say which run it belongs to."""
        return self._live and self.header is None and self.pos <= HEADER_SIZE

    def _records(self, frames: Iterator[tuple[int, int, memoryview]]) -> Generator[Entry]:
        status, strings = self._status, self._strings
        index = self.index if self.index is not None else -1  # every frame follows the file header, which sets it
        for pos, rtype, payload in frames:
            if self._ended:
                self._bad_record(pos, payload, "record after the END record")
                continue
            try:
                if rtype == _TENSOR:
                    rec: Any = decode_tensor(payload, strings)
                elif rtype == _BLOCK:
                    rec = decode_block(payload, strings) if self.version >= 3 else decode_tensor_block(payload, strings)
                elif rtype == _SALVAGED:
                    yield from self._salvage(pos, payload)
                    continue
                elif rtype == _STRING:
                    string_id, text = decode_string(payload)
                    strings[string_id] = text
                    continue
                elif rtype == _EVENT:
                    rec = decode_event(payload)
                elif rtype == _END:
                    if not (self._last or self._live):  # a live segment may be the last: END says it is
                        self._bad_record(pos, payload, "END record in a segment that is not the log's last")
                    else:
                        self._end(pos, decode_end(payload))
                        self._ended = True
                    continue
                else:
                    self._bad_record(pos, payload, "HEADER record after the first record")
                    continue
            except PayloadError as e:
                self._bad_record(pos, payload, str(e))
                if rtype in (_TENSOR, _EVENT, _BLOCK):  # data records, framed but unreadable: lost
                    self._lose_records(pos, payload, self._block_rows(payload) if rtype == _BLOCK else 1)
                continue
            if rtype == _BLOCK:
                self.data_records += len(rec)
                status.records += len(rec)
                status._resume(rec[0].step, False)
                yield from (Entry(index, pos + i, row) for i, row in enumerate(rec))
                continue
            self.data_records += 1
            status.records += 1
            status._resume(rec.step, rtype == _EVENT and rec.kind == "step")
            yield Entry(index, pos, rec)

    def _block_rows(self, payload: memoryview) -> int | None:
        return declared_rows(payload) if self.version >= 3 else block_rows(payload)

    def _salvage(self, pos: int, payload: memoryview) -> Iterator[Entry]:
        """A v3 block whose frame failed its checks: the rows whose own check matches, and the others lost."""
        assert self._salvaged is not None, "_frames sets the head of each block it yields as _SALVAGED"
        (head, reason), self._salvaged = self._salvaged, None
        good, lost = salvage_block(payload, head, self._strings)
        self.report_corruption(
            pos, f"{reason}; the TENSOR_BLOCK's own checks kept {len(good)} of its {head.rows} records"
        )
        self.data_records += head.rows
        if lost:
            self._status.skipped_records += 1
            self._status.skipped_bytes += lost * head.row_bytes
            self._status._lose(self.name, pos, pos + FRAME_SIZE + head.length, lost)
        if good:
            self._status.records += len(good)
            self._status._resume(head.step, False)
        index = self.index if self.index is not None else -1
        return (Entry(index, pos + i, rec) for i, rec in good)

    def _file_header_ok(self) -> bool:
        """Check magic and version; False when no records can follow (torn or too short)."""
        view, n = self._view, len(self._view)
        if n < HEADER_SIZE:
            if not MAGIC.startswith(view[: len(MAGIC)].tobytes()) and not _all_zero(view):
                raise self._not_a_segment(view[: len(MAGIC)].tobytes())
            reason = f"file is {n} bytes, shorter than its {HEADER_SIZE}-byte header"
            if self._live:
                self.waiting = True
            elif self._last or self._session_end:
                self._torn(0, reason)
            else:
                self._bad_region(0, n, reason)
            return False
        magic, version, flags, self.index = FILE_HEADER.unpack_from(view)
        if magic != MAGIC:
            if self._live and _all_zero(view):
                self.waiting = True
                return False
            if (self._last or self._session_end) and _all_zero(view):
                self._torn(0, "file is all zero bytes")
                return False
            raise self._not_a_segment(magic)
        if version > FORMAT_VERSION:
            raise LogFormatError(
                f"{self.name}: written by a newer sdctrace (format v{version}, this reader reads "
                f"<= v{FORMAT_VERSION}): upgrade sdctrace"
            )
        if version == 0 or flags:
            raise LogFormatError(
                f"{self.name}: file header has format v{version} and flags {flags:#06x}; expected "
                f"v1..v{FORMAT_VERSION} and flags 0: the header is damaged or the file was not written by sdctrace"
            )
        self.version = version
        return True

    def _frames(self, pos: int) -> Iterator[tuple[int, int, memoryview]]:
        """(offset, type, payload) of each valid frame from `pos`; bad regions are torn tails or corruption."""
        view, end = self._view, len(self._view)
        unpack, types = FRAME.unpack_from, RECORD_TYPES[self.version]
        self.pos = pos
        while pos < end:
            truncated = False
            if end - pos < FRAME_SIZE:
                reason, truncated = f"{end - pos} bytes left, a record frame needs {FRAME_SIZE}", True
            else:
                length, crc, rtype = unpack(view, pos)
                stop = pos + FRAME_SIZE + length
                if length > MAX_RECORD_BYTES:
                    reason = f"declared payload length {length} exceeds the {MAX_RECORD_BYTES}-byte limit"
                elif stop > end:
                    reason = f"declared payload length {length} runs {stop - end} bytes past the end of the file"
                    truncated = True
                elif (actual := zlib.crc32(view[pos + FRAME_SIZE - 1 : stop])) != crc:
                    reason = f"CRC mismatch: stored {crc:#010x}, computed {actual:#010x}"
                elif rtype not in types:
                    reason = f"unknown record type {rtype} (format v{self.version} defines 1..{max(types)})"
                else:
                    self.pos = stop
                    yield pos, rtype, view[pos + FRAME_SIZE : stop]
                    pos = stop
                    continue
            # A v3 TENSOR_BLOCK carries its head twice and a check per row: it may be read past a bad frame (read live,
            # not while it is the file's last bytes: they may still be landing, as for any record).
            head = find_head(view, pos + FRAME_SIZE, end) if self.version >= 3 and not self._ended else None
            if head is not None and not (self._live and pos + FRAME_SIZE + head.length == end):
                stop = pos + FRAME_SIZE + head.length
                self._salvaged, self.pos = (head, reason), stop
                yield pos, _SALVAGED, view[pos + FRAME_SIZE : stop]
                pos = stop
                continue
            resume = next_frame(view, pos + 1)
            if self._live and resume == end and not self._ended:
                self.pos, self.waiting = pos, True
                return
            if self._ended:  # close() fsyncs after END: nothing can follow it but corruption
                self.report_corruption(
                    pos, f"trailing garbage after a clean close: {end - pos} bytes after the END record ({reason})"
                )
                self._status.skipped_bytes += end - pos
                self.pos = end
                return
            # A crash can only cut the log short (or leave zeros where the file system had
            # not written data yet); a valid frame after the problem means it is not the tail.
            if (self._last or self._session_end) and resume == end and (truncated or _all_zero(view[pos:])):
                self._torn(pos, reason)
                self.pos = end
                return
            self._bad_region(pos, resume, reason)
            pos = self.pos = resume

    def _lose_records(self, pos: int, payload: memoryview, records: int | None) -> None:
        """A data frame that passed its CRC but does not decode: its records (None: an unknown number) are lost."""
        if records is None:  # like a bad region: END or the next HEADER may tell how many
            self.lost = True
            self.region_records += 1
            records = 1
        else:
            self.data_records += records
        self._status._lose(self.name, pos, pos + FRAME_SIZE + len(payload), records)

    def _end(self, pos: int, end: EndRecord) -> None:
        if self.first_record is not None and self.lost:  # END counts what the bad regions hid
            self._status._attribute(self.name, end.records - self.first_record - self.data_records, self.region_records)
        if self.first_record is not None and not self.lost and end.records != self.first_record + self.data_records:
            self.report_corruption(
                pos,
                f"END counts {end.records} records but the log holds {self.first_record + self.data_records}: "
                "records are missing",
            )
        self._status.complete, self._status.end = True, end

    def _torn(self, pos: int, reason: str) -> None:
        if not self._last:  # a crashed session's end: the resumption after it supersedes what the tear held
            return
        warnings.warn(
            f"{self.name}: the log ends inside a record at byte {pos} ({reason}): treating it as the torn "
            "tail of a crashed write; every record before it was read",
            TornTailWarning,
            stacklevel=2,
        )
        self._status.torn_tail = True

    def _bad_region(self, pos: int, resume: int, reason: str) -> None:
        self.report_corruption(pos, reason)
        self.lost = True
        self._status.skipped_records += 1
        self._status.skipped_bytes += resume - pos
        records = 1 if pos > HEADER_SIZE else 0  # at the head, the bytes held the HEADER at least
        self.region_records += records
        self._status._lose(self.name, pos, resume, records)

    def _bad_record(self, pos: int, payload: memoryview, reason: str) -> None:
        self.report_corruption(pos, reason)
        self._status.skipped_records += 1
        self._status.skipped_bytes += FRAME_SIZE + len(payload)

    def report_corruption(self, pos: int, reason: str) -> None:
        report_corruption(self._status, self._skip, self.name, pos, reason)

    def _not_a_segment(self, magic: bytes) -> LogFormatError:
        return LogFormatError(
            f"{self.name}: not an sdctrace log segment: expected magic {MAGIC!r} at byte 0, found {magic!r}"
        )


def report_corruption(status: LogStatus, skip: bool, path: str, offset: int, reason: str) -> None:
    """Raise the corruption at ``path``:``offset``, or in skip mode note it in ``status``."""
    if not skip:
        raise LogCorruptionError(path, offset, reason)
    status.corruptions.append((path, offset, reason))


def skip_mode(on_corruption: str) -> bool:
    """Whether ``on_corruption`` (`OnCorruption`) says to skip corruption rather than raise it."""
    if on_corruption not in ("raise", "skip"):
        raise UsageError(f"on_corruption must be 'raise' or 'skip', got {on_corruption!r}")
    return on_corruption == "skip"


def _all_zero(view: memoryview) -> bool:
    return not view.tobytes().strip(b"\0")


def load_segment(path: Path) -> Any:
    """The segment's bytes, memory-mapped: opening a log reads only what is decoded. Only a regular
    file is a segment (a FIFO would block, /dev/zero never end); the mapping is its stat'ed size."""
    f, size = open_regular(path, "log segment")
    with f:
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
