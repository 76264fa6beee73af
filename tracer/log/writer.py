"""Append records to one rank's log: segments, string interning, tensor blocks, the END marker.

Consecutive TENSOR records of one step are held and written as one TENSOR_BLOCK, at
most `BLOCK_ROWS` of them, before any other record and at every flush: the log keeps
the order in which records were written. Writes are buffered (the caller flushes per
batch), so a crash loses or tears only the tail, which the reader recognises. A full
segment is fsynced before the next one is created: only the last segment can ever end
torn. `HeaderAtFirstFlush` opens a LogWriter late, for a header that is final only
once recording has begun.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from tracer.errors import LogFormatError, UsageError
from tracer.log.checked_block import encode_block
from tracer.log.codec import (
    Row,
    decode_event,
    decode_header,
    encode_end,
    encode_event,
    encode_header,
    encode_string,
    encode_tensor,
    reads_back,
)
from tracer.log.framing import MAX_RECORD_BYTES, RecordType, file_header, frame
from tracer.log.layout import list_segments, segment_path
from tracer.log.records import (
    END_STATUSES,
    MAX_ELEMENTS,
    MAX_MICROBATCH,
    MAX_STEP,
    U64_MAX,
    EndRecord,
    EndStatus,
    EventRecord,
    Phase,
    RunHeader,
    TensorRecord,
)
from tracer.log.sessions import Resumption, marker

DEFAULT_SEGMENT_BYTES = 64 << 20
BLOCK_ROWS = 4096  # TENSOR records held for one block at most: bounds the writer's memory and a block's size
_ROW_BYTES = 24  # about what a row takes on disk: the held block's share when deciding to roll a segment
_PHASES = frozenset(Phase)
_BUFFER_BYTES = 1 << 20
# What msgpack raises for values it cannot pack, and PayloadError (a ValueError) for
# values that pack but would not read back (e.g. int dict keys).
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError)


class SegmentFile(Protocol):
    """What a `LogWriter` writes a segment file through: the file it opens itself, or an ``open_file``'s (a
    `tracer.io_thread.AsyncFile`, whose ``fsync`` the writer calls where it has one)."""

    def write(self, data: bytes, /) -> int: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class LogWriter:
    """Writes one rank's log into `directory`, which must not hold a log yet.

    Not thread-safe: drive it from one thread. Each segment starts with the run header
    and has its own string table, so any one segment decodes alone. ``open_file`` lets
    the tracer hand the system calls to another thread (`tracer.io_thread.AsyncFile`);
    it must create the file exclusively and return an object with ``write``, ``flush``,
    ``close`` and either ``fsync`` or ``fileno``.
    """

    def __init__(
        self,
        directory: Path,
        header: RunHeader,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        open_file: Callable[[Path], SegmentFile] | None = None,
        resume: Resumption | None = None,
    ) -> None:
        self.directory = _claim(directory, header, segment_bytes, resume)
        self._header = header
        self._open_file = open_file or (lambda path: open(path, "xb", buffering=_BUFFER_BYTES))
        self._segment_bytes = segment_bytes
        self._rows: list[Row] = []  # the block being filled: TENSOR records of step `_block_step`
        self._block_step = -1
        self.bytes_written = 0  # all segments, framing included
        self.records_written = resume.records if resume else 0  # TENSOR and EVENT records, the log's whole
        self.segment_index = 0
        self._closed = False
        if resume is None:
            self._open_segment(0)
            return
        # The marker goes first and to the disk at once: a session whose first segment lacks it cannot be told
        # apart from a continuation of the crashed one.
        self._open_segment(resume.segment)
        self.write_event(marker(resume.step, header.rank, resume.last_step))
        self._file.flush()
        _fsync(self._file)
        _fsync_dir(self.directory)

    # -- records ---------------------------------------------------------------------
    def write_tensor(self, rec: TensorRecord) -> None:
        """Append one fingerprint to the block being filled; interns its name and meta in the current segment."""
        if self._closed:
            raise self._closed_error()
        step, mb, fp, l2, absmax, nan, inf = (
            rec.step,
            rec.microbatch,
            rec.fingerprint,
            rec.l2,
            rec.absmax,
            rec.nan,
            rec.inf,
        )
        if not (
            type(step) is int
            and 0 <= step <= MAX_STEP
            and type(mb) is int
            and 0 <= mb <= MAX_MICROBATCH
            and type(fp) is int
            and 0 <= fp <= U64_MAX
            and type(l2) is float
            and type(absmax) is float
            and type(nan) is int
            and 0 <= nan <= MAX_ELEMENTS
            and type(inf) is int
            and 0 <= inf <= MAX_ELEMENTS
            and rec.phase in _PHASES
        ):
            raise UsageError(
                f"cannot store {rec!r:.300}: step must be an int in 0..{MAX_STEP}, microbatch in 0..{MAX_MICROBATCH}, "
                "phase a Phase, fingerprint an int of unsigned 64 bits, l2 and absmax floats, nan and inf counts "
                "ints >= 0 (readers refuse anything else as corruption)"
            )
        if step != self._block_step or len(self._rows) >= BLOCK_ROWS:
            self._write_block()
            self._block_step = step
        if self._segment_size + len(self._rows) * _ROW_BYTES >= self._segment_bytes:
            self._roll()
        strings = self._strings
        name_id = strings.get(rec.name)
        if name_id is None:
            name_id = self._intern(rec.name)
        meta_id = strings.get(rec.meta)
        if meta_id is None:
            meta_id = self._intern(rec.meta)
        self._rows.append((mb, name_id, rec.phase, fp, l2, absmax, nan, inf, meta_id))
        self.records_written += 1

    def write_event(self, rec: EventRecord) -> None:
        """Append one event; refuses fields that would not read back."""
        if self._closed:
            raise self._closed_error()
        payload = _encoded_event(rec)
        self._write_block()
        if self._segment_size >= self._segment_bytes:
            self._roll()
        self._write(RecordType.EVENT, payload)
        self.records_written += 1

    # -- lifecycle -------------------------------------------------------------------
    def flush(self, fsync: bool = False) -> None:
        """Hand buffered records to the OS (a process crash then loses nothing); with
        `fsync`, to the disk (a power loss then loses nothing)."""
        if self._closed:
            raise self._closed_error()
        self._write_block()
        self._file.flush()
        if fsync:
            _fsync(self._file)

    def close(self, status: EndStatus = "complete", detail: str = "") -> None:
        """Write the END marker and make the log durable. Idempotent."""
        if self._closed:
            return
        if status not in END_STATUSES or not isinstance(detail, str):
            raise UsageError(f"close() takes status in {END_STATUSES} and a str detail, got {status!r}, {detail!r:.80}")
        try:
            self._write_block()
            self._write(RecordType.END, encode_end(EndRecord(status, self.records_written, detail)))
            self._file.flush()
            _fsync(self._file)
            _fsync_dir(self.directory)
        finally:
            self._file.close()
            self._closed = True

    def abandon(self) -> None:
        """Stop without an END marker, so the log reads as a crashed run. Idempotent."""
        if self._closed:
            return
        try:
            self._write_block()
            self._file.flush()
        finally:
            self._file.close()
            self._closed = True

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.close("failed", f"{type(exc).__name__}: {exc}")

    # -- internals -------------------------------------------------------------------
    def _open_segment(self, index: int) -> None:
        self._file = self._open_file(segment_path(self.directory, index))
        self.segment_index = index
        self._segment_size = 0
        self._strings: dict[str, int] = {}
        self._put(file_header(index))
        self._write(RecordType.HEADER, encode_header(self._header, self.records_written))

    def _roll(self) -> None:
        self._write_block()
        self._file.flush()
        _fsync(self._file)
        self._file.close()
        self._open_segment(self.segment_index + 1)

    def _intern(self, text: Any) -> int:
        if not isinstance(text, str):
            raise UsageError(f"TensorRecord name and meta must be str, found {type(text).__name__} {text!r:.80}")
        string_id = len(self._strings)
        self._strings[text] = string_id
        self._write(RecordType.STRING, encode_string(string_id, text))
        return string_id

    def _write_block(self) -> None:
        """Write the block being filled, if any: before any other record, so the log keeps the writing order.
        One row alone is smaller as a TENSOR record."""
        rows = self._rows
        if len(rows) > 1:
            self._rows = []
            self._write(RecordType.TENSOR_BLOCK, encode_block(self._block_step, rows))
        elif rows:
            self._rows = []
            self._write(RecordType.TENSOR, encode_tensor(self._block_step, rows[0]))

    def _write(self, rtype: RecordType, payload: bytes) -> None:
        if len(payload) > MAX_RECORD_BYTES:
            raise UsageError(
                f"{rtype.name} record of {len(payload)} bytes exceeds the {MAX_RECORD_BYTES}-byte limit: "
                "store big values in the blob store and log their key"
            )
        self._put(frame(rtype, payload))

    def _put(self, data: bytes) -> None:
        self._file.write(data)
        self._segment_size += len(data)
        self.bytes_written += len(data)

    def _closed_error(self) -> UsageError:
        return UsageError(f"the log writer for {self.directory} is closed; open a new run to write more")


def _claim(directory: Path, header: RunHeader, segment_bytes: int, resume: Resumption | None = None) -> Path:
    """Check a new log's segment size and header (it must read back as written), then create its
    directory; refuse one that already holds a log, unless it continues it (`resume`)."""
    if segment_bytes <= 0:
        raise UsageError(f"segment_bytes must be > 0, got {segment_bytes}")
    try:
        decode_header(encode_header(header, 0), source="the RunHeader given to LogWriter")
    except LogFormatError as e:
        raise UsageError(str(e)) from e
    except _ENCODE_ERRORS as e:
        raise UsageError(
            f"the run header cannot be stored ({e}): config, versions, determinism and extra "
            "must hold only None, bool, int, float, str, bytes, lists and str-keyed dicts"
        ) from e
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    existing = list_segments(directory)
    if resume is not None:
        if not existing or existing[-1][0] + 1 != resume.segment:
            found = f"segments up to {existing[-1][0]}" if existing else "no log"
            raise UsageError(
                f"{directory}: a resumption starting at segment {resume.segment} cannot continue this "
                f"log: it holds {found}; resume from what `tracer.log.resume.log_end` says"
            )
        return directory
    if existing:
        raise UsageError(
            f"{directory}: already holds a log ({len(existing)} segment(s)); a log is written "
            "once: choose a new run directory or delete this one"
        )
    return directory


class HeaderAtFirstFlush:
    """A `LogWriter` opened at the first ``flush`` or ``close``, with the header ``header()`` returns then.

    For a header that holds facts learned only once recording has begun (the Tracer's
    sites that give no input gradient, found at their first forward). Crash safety is
    the LogWriter's: records reach the OS only at a flush in either case, so a crash
    before the first flush loses the same records; it leaves an empty rank directory
    instead of an empty segment file. The directory is claimed and the first header
    checked here, so a taken directory or an unstorable config fails at once.
    """

    def __init__(
        self,
        directory: Path,
        header: Callable[[], RunHeader],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        open_file: Callable[[Path], SegmentFile] | None = None,
        resume: Resumption | None = None,
    ) -> None:
        self._resume = resume
        self.directory = _claim(directory, header(), segment_bytes, self._resume)
        self._header = header
        self._segment_bytes = segment_bytes
        self._open_file = open_file
        self._held: list[TensorRecord | EventRecord] = []
        self.writer: LogWriter | None = None

    def write_tensor(self, rec: TensorRecord) -> None:
        self._held.append(rec)

    def write_event(self, rec: EventRecord) -> None:
        _encoded_event(rec)  # a bad event fails where it is logged, not at the flush
        self._held.append(rec)

    def flush(self, fsync: bool = False) -> None:
        self._open().flush(fsync)

    def close(self, status: EndStatus = "complete", detail: str = "") -> None:
        self._open().close(status, detail)

    def abandon(self) -> None:
        """Stop without an END marker; before the first flush there is no log to leave."""
        if self.writer is not None:
            self.writer.abandon()

    def _open(self) -> LogWriter:
        if self.writer is not None:
            return self.writer
        w = LogWriter(
            self.directory,
            self._header(),
            segment_bytes=self._segment_bytes,
            open_file=self._open_file,
            resume=self._resume,
        )
        self.writer = w
        held, self._held = self._held, []
        for rec in held:
            if isinstance(rec, TensorRecord):
                w.write_tensor(rec)
            else:
                w.write_event(rec)
        # From now on every call goes straight to the writer: no indirection on the hot path.
        self.write_tensor, self.write_event = w.write_tensor, w.write_event  # type: ignore[method-assign]  # a shortcut
        self.flush, self.close, self.abandon = w.flush, w.close, w.abandon  # type: ignore[method-assign]  # a shortcut
        return w


def _encoded_event(rec: EventRecord) -> bytes:
    """``rec``'s payload; refuses fields that would not read back."""
    try:
        payload = encode_event(rec)  # packing refuses what msgpack cannot hold (an int past 64 bits, a surrogate)
        if not reads_back(rec):
            decode_event(payload)
    except _ENCODE_ERRORS as e:
        raise UsageError(
            f"event {rec.kind!r} at step {rec.step} cannot be stored ({e}): kind must be str, step int, "
            "and fields a dict of None, bool, int, float, str, bytes, lists and str-keyed dicts"
        ) from e
    return payload


def _fsync(f: Any) -> None:
    if hasattr(f, "fsync"):
        f.fsync()
    else:
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    """Make new segment names durable, not only their contents (POSIX)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
