"""Decode one segment into column arrays at numpy speed, for parallel readers (the Beam pipelines).

`read_segment_columns` returns what `read_segment` returns, with TENSOR records as
parallel arrays instead of objects. A clean segment (every frame valid, every record
where the format puts it, TENSOR payloads in the encodings msgpack picks) is decoded
with whole-array operations: about 1 µs a record instead of 4. Anything else
(corruption, a torn tail, an unusual but valid encoding) goes through the reference
decoder, so both paths agree on every record, warning and reported problem by
construction. `check_chain` then does for segments decoded apart what `LogReader`
does while it walks a log in order: gaps and broken record counts between segments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from tracer.log.checked_block import HEAD_SIZE
from tracer.log.codec import BLOCK_COLUMNS, BLOCK_WIDTHS, PayloadError, decode_end, decode_event, decode_string
from tracer.log.frame_scan import crcs, frame_chain, u32le
from tracer.log.framing import FRAME_SIZE, HEADER_SIZE, RecordType
from tracer.log.msgpack_columns import ByteViews, bins, block_column, floats32, ints
from tracer.log.records import (
    MAX_BLOCK_ROWS,
    MAX_ELEMENTS,
    MAX_MICROBATCH,
    MAX_STEP,
    EndRecord,
    EventRecord,
    Phase,
    RunHeader,
    TensorRecord,
)
from tracer.log.segment import Entry, LogStatus, LostRange, OnCorruption, Segment, report_corruption, skip_mode
from tracer.log.sessions import is_failed_session

_HEADER, _STRING, _TENSOR, _EVENT, _END, _BLOCK = (int(t) for t in RecordType)
_I64 = np.iinfo(np.int64)
_U64_MAX = int(np.iinfo(np.uint64).max)


@dataclass(frozen=True)
class TensorColumns:
    """One segment's TENSOR records as parallel arrays, in log order."""

    offset: np.ndarray  # int64: `Entry.offset`: the record's frame in its segment file (a block's + row index)
    step: np.ndarray  # int64
    microbatch: np.ndarray  # int64
    name: np.ndarray  # int32: index into `strings`
    phase: np.ndarray  # int8: `Phase` values
    fingerprint: np.ndarray  # uint64
    l2: np.ndarray  # float32
    absmax: np.ndarray  # float32
    nan: np.ndarray  # int64
    inf: np.ndarray  # int64
    meta: np.ndarray  # int32: index into `strings`
    strings: list[str]

    def __len__(self) -> int:
        return len(self.offset)


@dataclass
class SegmentColumns:
    """A decoded segment: run header (None if lost), TENSOR columns, EVENT entries, what reading found."""

    header: RunHeader | None
    index: int | None  # from the file header; None if that was unreadable
    tensors: TensorColumns
    events: list[Entry]
    status: LogStatus
    data_records: int  # TENSOR and EVENT records in frames with a valid CRC, decodable or not
    lost: bool  # a bad region hid an unknown number of records
    region_records: int = 0  # records the bad regions' lost ranges claim

    def summary(self, index: int, path: str) -> SegmentSummary:
        """What `check_chain` and `chain_lost` need; `index` and `path` name the file."""
        positions = [(int(self.tensors.offset[0]), int(self.tensors.step[0]), False)] if len(self.tensors) else []
        positions += [(int(self.tensors.offset[-1]), int(self.tensors.step[-1]), False)] if len(self.tensors) else []
        if self.events:
            first, last = self.events[0], self.events[-1]
            positions += [
                (e.offset, e.record.step, isinstance(e.record, EventRecord) and e.record.kind == "step")
                for e in (first, last)
            ]
        head, tail = (min(positions), max(positions)) if positions else (None, None)
        return SegmentSummary(
            index,
            path,
            self.index,
            self.status.first_record,
            self.data_records,
            self.lost,
            tuple(self.status.lost),
            head[1] if head else None,
            tail[1] if tail else None,
            bool(tail and tail[2]),
            self.region_records,
        )


@dataclass(frozen=True)
class SegmentSummary:
    """What `check_chain` and `chain_lost` need to know about one decoded segment."""

    index: int  # from the file name
    path: str
    header_index: int | None  # from the file header
    first_record: int | None  # from the HEADER record
    data_records: int
    lost: bool
    lost_ranges: tuple[LostRange, ...] = ()  # the segment's own `LogStatus.lost`, read alone
    first_step: int | None = None  # step of its first data record
    last_step: int | None = None  # step of its last data record
    last_is_marker: bool = False  # that record is a `step` event (its step is complete)
    region_records: int = 0


def read_segment_columns(
    data: Any,
    name: str,
    *,
    last: bool,
    on_corruption: OnCorruption = "raise",
    session_end: bool = False,
    cutoff: int | None = None,
) -> SegmentColumns:
    """Decode one segment's bytes (`name` is for messages), as `read_segment` does, into columns.

    Values that do not fit the columns (an int beyond int64, a fingerprint beyond uint64)
    are reported as corrupt records: the writer never produces them. In a resumed log
    (`tracer.log.sessions`), `session_end` and `cutoff` are what `Sessions` says of the
    segment: it may end torn; its records from step `cutoff` on are superseded, left out.
    """
    skip = skip_mode(on_corruption)
    status = LogStatus()
    seg = Segment(data, name, last=last, skip=skip, status=status, session_end=session_end)
    status.first_record = seg.first_record
    clean = seg.header is not None and not status.corruptions and not status.torn_tail
    fast = decode_clean(data, seg, last) if clean else None
    if fast is None:
        tensors, events = _from_entries(seg, name, skip, status)
    else:
        seg.entries.close()
        tensors, events, end = fast
        seg.data_records = status.records = len(tensors) + len(events)
        if end is not None:
            status.complete, status.end = True, end
    if cutoff is not None:
        tensors, events = _before(tensors, events, cutoff, status)
    return SegmentColumns(
        seg.header, seg.index, tensors, events, status, seg.data_records, seg.lost, seg.region_records
    )


def _before(
    tensors: TensorColumns, events: list[Entry], cutoff: int, status: LogStatus
) -> tuple[TensorColumns, list[Entry]]:
    """The records of steps before `cutoff`: a resumption wrote the later ones again."""
    keep = tensors.step < cutoff
    kept = [e for e in events if e.record.step < cutoff or is_failed_session(e.record)]
    dropped = int((~keep).sum()) + len(events) - len(kept)
    status.records -= dropped
    status.superseded += dropped
    cols = {f.name: getattr(tensors, f.name) for f in fields(tensors) if f.name != "strings"}
    return TensorColumns(**{k: v[keep] for k, v in cols.items()}, strings=tensors.strings), kept


def check_chain(segments: Iterable[SegmentSummary], missing_path: Callable[[int], str]) -> list[tuple[str, int, str]]:
    """(file, byte offset, reason) of each problem `LogReader` would report between one rank's segments.

    `missing_path(index)` names a segment file that is absent, for the report.
    """
    problems: list[tuple[str, int, str]] = []
    expected_index = 0
    expected_first: int | None = 0  # None once records went missing unseen
    for s in sorted(segments, key=lambda s: s.index):
        if s.index != expected_index:
            reason = f"segment file missing: expected segment {expected_index}, the next file is segment {s.index}"
            problems.append((missing_path(expected_index), 0, reason))
            expected_first = None
        if s.header_index is not None and s.header_index != s.index:
            problems.append((s.path, 12, f"file header says segment {s.header_index} but the file name says {s.index}"))
        if expected_first is not None and s.first_record is not None and s.first_record != expected_first:
            problems.append(
                (
                    s.path,
                    HEADER_SIZE,
                    f"segment starts at record {s.first_record} but the segments before it hold {expected_first}: "
                    "records are missing from the end of the previous segment",
                )
            )
        expected_index = s.index + 1
        expected_first = None if s.lost or s.first_record is None else s.first_record + s.data_records
    return problems


def chain_lost(segments: Iterable[SegmentSummary], missing_path: Callable[[int], str]) -> list[LostRange]:
    """The `LogStatus.lost` that `LogReader` would report for one rank, from its segments decoded apart.

    A segment read alone does not know the steps before its first record or after its last: the
    neighbouring segments do. A missing segment file is a gap of unknown bytes; the next segment's
    HEADER counts the records it and the previous segment's bad regions hid.
    """
    out: list[LostRange] = []
    prev: SegmentSummary | None = None
    prev_first: int | None = None  # where `prev` starts: its HEADER's count, else where the chain says it must
    expected_index, last_step, marker = 0, None, False
    expected_first: int | None = 0
    for s in sorted(segments, key=lambda s: s.index):
        before = None if last_step is None else last_step + 1 if marker else last_step
        gap = None
        if s.index != expected_index:
            gap = missing_path(expected_index)
            out.append(LostRange(gap, 0, 0, 0, before, None))
            expected_first = None
        if s.first_step is not None:
            out = [replace(r, last_step=s.first_step) if r.last_step is None else r for r in out]
        if prev is not None and prev_first is not None and s.first_record is not None:
            missing = s.first_record - prev_first - prev.data_records
            if gap is not None:
                _attribute(out, gap, missing - (prev.region_records if prev.lost else 0), 0)
            elif prev.lost:
                _attribute(out, prev.path, missing, prev.region_records)
        out += [replace(r, first_step=before) if r.first_step is None else r for r in s.lost_ranges]
        if s.last_step is not None:
            last_step, marker = s.last_step, s.last_is_marker
        prev, prev_first = s, s.first_record if s.first_record is not None else expected_first
        expected_index = s.index + 1
        expected_first = None if s.lost or s.first_record is None else s.first_record + s.data_records
    return out


def _attribute(ranges: list[LostRange], file: str, missing: int, counted: int) -> None:
    status = LogStatus(lost=ranges)
    status._attribute(file, missing, counted)


# -- the reference path ------------------------------------------------------------------------


def _from_entries(seg: Segment, name: str, skip: bool, status: LogStatus) -> tuple[TensorColumns, list[Entry]]:
    records: list[tuple[int, TensorRecord]] = []
    events: list[Entry] = []
    for entry in seg.entries:
        rec = entry.record
        if not isinstance(rec, TensorRecord):
            events.append(entry)
        elif _fits(rec):
            records.append((entry.offset, rec))
        else:
            report_corruption(
                status,
                skip,
                name,
                entry.offset,
                "TENSOR value out of range: step, microbatch, nan and inf must fit int64 and the fingerprint uint64",
            )
            status.records -= 1
            status.skipped_records += 1
    strings: dict[str, int] = {}
    intern = lambda s: strings.setdefault(s, len(strings))  # noqa: E731
    cols = TensorColumns(
        offset=np.array([o for o, _ in records], np.int64),
        step=np.array([r.step for _, r in records], np.int64),
        microbatch=np.array([r.microbatch for _, r in records], np.int64),
        name=np.array([intern(r.name) for _, r in records], np.int32),
        phase=np.array([int(r.phase) for _, r in records], np.int8),
        fingerprint=np.array([r.fingerprint for _, r in records], np.uint64),
        l2=np.array([r.l2 for _, r in records], np.float32),
        absmax=np.array([r.absmax for _, r in records], np.float32),
        nan=np.array([r.nan for _, r in records], np.int64),
        inf=np.array([r.inf for _, r in records], np.int64),
        meta=np.array([intern(r.meta) for _, r in records], np.int32),
        strings=list(strings),
    )
    return cols, events


def _fits(r: TensorRecord) -> bool:
    counts = (r.step, r.microbatch, r.nan, r.inf)
    return all(_I64.min <= v <= _I64.max for v in counts) and 0 <= r.fingerprint <= _U64_MAX


# -- the fast path -----------------------------------------------------------------------------


def decode_clean(data: Any, seg: Segment, last: bool) -> tuple[TensorColumns, list[Entry], EndRecord | None] | None:
    """Decode the records after the HEADER with array operations; None if the segment is not clean."""
    index = seg.index
    if index is None:  # no file header read: not clean
        return None
    raw = np.frombuffer(data, np.uint8)
    start = HEADER_SIZE + FRAME_SIZE + int(u32le(raw, np.array([HEADER_SIZE]))[0])
    chain = frame_chain(raw, start)
    if chain is None:
        return None
    offsets, stops = chain
    view = memoryview(data)
    if not np.array_equal(crcs(raw, view, offsets + FRAME_SIZE - 1, stops), u32le(raw, offsets + 4)):
        return None
    types = raw[offsets + FRAME_SIZE - 1]
    if (types == _HEADER).any():
        return None
    end: EndRecord | None = None
    is_end = types == _END
    if is_end.any():
        if not last or is_end.sum() > 1 or not is_end[-1]:
            return None
        try:
            end = decode_end(view[int(offsets[-1]) + FRAME_SIZE : int(stops[-1])])
        except PayloadError:
            return None
    try:
        strings = _strings(view, offsets[types == _STRING], stops[types == _STRING])
        events = [
            Entry(index, o, decode_event(view[o + FRAME_SIZE : s]))
            for o, s in zip(offsets[types == _EVENT].tolist(), stops[types == _EVENT].tolist())
        ]
    except PayloadError:
        return None
    if strings is None:
        return None
    r = ByteViews(raw)
    is_tensor, is_block = types == _TENSOR, types == _BLOCK
    if is_block.any() and seg.version < 2:
        return None
    tensors = _tensors(r, offsets[is_tensor], stops[is_tensor], *strings)
    if tensors is None:
        return None
    if is_block.any():
        heads = (
            _v2_heads(r, offsets[is_block], stops[is_block])
            if seg.version < 3
            else _v3_heads(r, view, offsets[is_block], stops[is_block])
        )
        blocks = None if heads is None else _blocks(r, offsets[is_block], heads, *strings)
        if blocks is None:
            return None
        tensors = _in_log_order(tensors, blocks) if len(tensors) else blocks
    if (
        end is not None
        and seg.first_record is not None
        and end.records != seg.first_record + len(tensors) + len(events)
    ):
        return None
    return tensors, events, end


def _strings(
    view: memoryview, offsets: np.ndarray, stops: np.ndarray
) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """(texts, id -> position in texts or -1, id -> offset of its STRING record); None if an id repeats."""
    texts: list[str] = []
    by_id: dict[int, tuple[int, int]] = {}
    for o, s in zip(offsets.tolist(), stops.tolist()):
        string_id, text = decode_string(view[o + FRAME_SIZE : s])
        if string_id in by_id or not 0 <= string_id < 1 << 31:
            return None
        by_id[string_id] = (len(texts), o)
        texts.append(text)
    size = max(by_id, default=-1) + 1
    position = np.full(size, -1, np.int64)
    defined_at = np.zeros(size, np.int64)
    for string_id, (pos, o) in by_id.items():
        position[string_id], defined_at[string_id] = pos, o
    return texts, position, defined_at


def _tensors(
    r: ByteViews,
    offsets: np.ndarray,
    stops: np.ndarray,
    texts: list[str],
    position: np.ndarray,
    defined_at: np.ndarray,
) -> TensorColumns | None:
    """Vectorised msgpack decoding of TENSOR records,
    `[step, microbatch, name_id, phase, fingerprint, l2, absmax, nan, inf, meta_id]`."""
    at = offsets + FRAME_SIZE
    if not (r.buf[at] == 0x9A).all():  # fixarray of 10
        return None
    at = at + 1
    fields: list[np.ndarray] = []
    for kind in ("int", "int", "int", "int", "uint", "float", "float", "int", "int", "int"):
        got = floats32(r, at) if kind == "float" else ints(r, at, unsigned=kind == "uint")
        if got is None:
            return None
        value, at = got
        if (at > stops).any():
            return None
        fields.append(value)
    if not np.array_equal(at, stops):
        return None
    step, microbatch, name_id, phase, fingerprint, l2, absmax, nan, inf, meta_id = fields
    if len(phase) and not ((phase >= 0) & (phase <= max(Phase))).all():
        return None
    # codec.decode_tensor's ranges; a record outside them goes through it for the error that names the field
    for values, hi in ((step, MAX_STEP), (microbatch, MAX_MICROBATCH), (nan, MAX_ELEMENTS), (inf, MAX_ELEMENTS)):
        if len(values) and not ((values >= 0) & (values <= hi)).all():
            return None
    ids = np.concatenate([name_id, meta_id])
    if len(ids) and not ((ids >= 0) & (ids < len(position))).all():
        return None
    name, meta = position[name_id], position[meta_id]
    if (name < 0).any() or (meta < 0).any():
        return None
    if (defined_at[name_id] > offsets).any() or (defined_at[meta_id] > offsets).any():
        return None
    return TensorColumns(
        offset=offsets,
        step=step,
        microbatch=microbatch,
        name=name.astype(np.int32),
        phase=phase.astype(np.int8),
        fingerprint=fingerprint,
        l2=l2,
        absmax=absmax,
        nan=nan,
        inf=inf,
        meta=meta.astype(np.int32),
        strings=texts,
    )


Heads = tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]  # blocks' steps, rows, column starts, widths


def _v2_heads(r: ByteViews, offsets: np.ndarray, stops: np.ndarray) -> Heads | None:
    """Where the columns of format v2's TENSOR_BLOCKs lie, `[step, rows, 9 bin columns]` in msgpack."""
    at = offsets + FRAME_SIZE
    if not (r.buf[at] == 0x90 + 2 + len(BLOCK_COLUMNS)).all():  # fixarray of 11
        return None
    got = ints(r, at + 1, unsigned=False)
    if got is None:
        return None
    step, at = got
    got = ints(r, at, unsigned=False)
    if got is None:
        return None
    rows, at = got
    if not (((step >= 0) & (step <= MAX_STEP)).all() and ((rows >= 1) & (rows <= MAX_BLOCK_ROWS)).all()):
        return None
    starts, widths = [], []
    for _, is_float, _ in BLOCK_COLUMNS:
        got = bins(r, at)
        if got is None:
            return None
        start, length = got
        at = start + length
        width, extra = np.divmod(length, rows)
        if (at > stops).any() or extra.any() or not (width == 4 if is_float else np.isin(width, BLOCK_WIDTHS)).all():
            return None
        starts.append(start)
        widths.append(width)
    if not np.array_equal(at, stops):
        return None
    return step, rows, starts, widths


def _v3_heads(r: ByteViews, view: memoryview, offsets: np.ndarray, stops: np.ndarray) -> Heads | None:
    """Where the columns of format v3's TENSOR_BLOCKs lie (`tracer.log.checked_block`): each block's first head
    copy, which must check and agree with the frame, as it does in every block a writer wrote."""
    at = offsets + FRAME_SIZE
    if (stops - at < 2 * HEAD_SIZE).any():
        return None
    check = at + HEAD_SIZE - 4
    if not np.array_equal(crcs(r.buf, view, at - 1, check), r.read("<u4", check)):  # from the type byte, which is 6
        return None
    length, step, rows = r.read("<u4", at).astype(np.int64), r.read("<u8", at + 4), r.read("<u4", at + 12)
    if not ((step <= MAX_STEP).all() and ((rows >= 1) & (rows <= MAX_BLOCK_ROWS)).all()):
        return None
    step, rows = step.astype(np.int64), rows.astype(np.int64)
    widths = [r.buf[at + 16 + k].astype(np.int64) for k in range(len(BLOCK_COLUMNS))]
    for (_, is_float, _), width in zip(BLOCK_COLUMNS, widths):
        if not (width == 4 if is_float else np.isin(width, BLOCK_WIDTHS)).all():
            return None
    if not (np.array_equal(length, stops - at) and np.array_equal(length, 2 * HEAD_SIZE + rows * (sum(widths) + 2))):
        return None
    starts = list(at + 2 * HEAD_SIZE + np.cumsum([np.zeros_like(rows)] + [w * rows for w in widths[:-1]], axis=0))
    return step, rows, starts, widths


def _blocks(
    r: ByteViews,
    offsets: np.ndarray,
    heads: Heads,
    texts: list[str],
    position: np.ndarray,
    defined_at: np.ndarray,
) -> TensorColumns | None:
    """Vectorised decoding of the TENSOR_BLOCKs at `offsets`, all blocks at once, from where their columns lie."""
    step, rows, starts, widths = heads
    first_row = np.cumsum(rows) - rows  # of each block, counting all blocks' rows
    index = np.arange(int(rows.sum()))  # of each row, likewise
    columns = []
    for (_, is_float, top), start, width in zip(BLOCK_COLUMNS, starts, widths):
        values = block_column(r, start, width, rows, first_row, index, is_float)
        if top is not None and len(values) and int(values.max()) > top:  # codec.decode_tensor_block's ranges
            return None
        columns.append(values)
    microbatch, name_id, phase, fingerprint, l2, absmax, nan, inf, meta_id = columns
    if len(index) and max(int(name_id.max()), int(meta_id.max())) >= len(position):
        return None
    name, meta = position[name_id], position[meta_id]
    block_at = np.repeat(offsets, rows)
    if (
        (name < 0).any()
        or (meta < 0).any()
        or (defined_at[name_id] > block_at).any()
        or (defined_at[meta_id] > block_at).any()
    ):
        return None
    return TensorColumns(
        offset=np.repeat(offsets - first_row, rows) + index,
        step=np.repeat(step, rows),
        microbatch=microbatch.astype(np.int64),
        name=name.astype(np.int32),
        phase=phase.astype(np.int8),
        fingerprint=fingerprint.astype(np.uint64),
        l2=l2.astype(np.float32),
        absmax=absmax.astype(np.float32),
        nan=nan.astype(np.int64),
        inf=inf.astype(np.int64),
        meta=meta.astype(np.int32),
        strings=texts,
    )


def _in_log_order(a: TensorColumns, b: TensorColumns) -> TensorColumns:
    """TENSOR records and block rows of one segment, merged by offset (the strings are the same list)."""
    order = np.argsort(np.concatenate([a.offset, b.offset]), kind="stable")
    merged = {
        f.name: np.concatenate([getattr(a, f.name), getattr(b, f.name)])[order]
        for f in fields(TensorColumns)
        if f.name != "strings"
    }
    return TensorColumns(**merged, strings=a.strings)
