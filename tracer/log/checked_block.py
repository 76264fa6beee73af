"""TENSOR_BLOCK payloads of format v3: one step's TENSOR records as columns, with checks that localise damage.

The frame's CRC-32 covers the whole payload, as for every record, and is what a reader trusts when it matches.
When it does not (a flipped byte anywhere in the frame), the block's own checks say which records are still good,
so one flipped byte loses at most the one record whose bytes it touched:

    head, twice   length u32 (the payload's, again), step u64, rows u32, the 9 columns' widths u8 each,
                  then CRC-32 of the type byte (6) and those 25 bytes: a flipped byte spoils one copy only
    columns       `BLOCK_COLUMNS` in order, `rows` little-endian values of the column's width each
    row checks    `rows` u16: CRC-16/CCITT (`binascii.crc_hqx`, initial 0xFFFF) of row i's bytes, column by column

    payload = encode_block(step, rows)                  # the writer
    records = decode_block(payload, strings)            # a frame whose CRC matched
    head = find_head(view, at, end)                     # a frame whose CRC did not: is a block there?
    records, lost = salvage_block(view[at:at + head.length], head, strings)

docs/log-format.md ("TENSOR_BLOCK in format v3") is the specification.
"""

from __future__ import annotations

import struct
import zlib
from binascii import crc_hqx
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from tracer.log.codec import BLOCK_COLUMNS, BLOCK_WIDTHS, PayloadError, Row, block_records, float32_column, uint_column
from tracer.log.framing import RecordType
from tracer.log.records import MAX_BLOCK_ROWS, MAX_STEP, TensorRecord

_HEAD = struct.Struct(f"<IQI{len(BLOCK_COLUMNS)}B")  # length, step, rows, widths
_HEAD_CRC = struct.Struct("<I")
HEAD_SIZE = _HEAD.size + _HEAD_CRC.size  # 29 bytes a copy
_HEAD_SEED = zlib.crc32(bytes([RecordType.TENSOR_BLOCK]))  # the head's CRC starts with the type byte, as a frame's
ROW_SEED = 0xFFFF  # CRC-16/CCITT's usual start: a row of zero bytes does not check as 0
_FLOATS = tuple(is_float for _, is_float, _ in BLOCK_COLUMNS)


@dataclass(frozen=True)
class BlockHead:
    """What a block's head says: where its columns and row checks lie in its payload."""

    length: int  # of the payload
    step: int
    rows: int
    widths: tuple[int, ...]  # bytes a value, per column of `BLOCK_COLUMNS`

    @property
    def row_bytes(self) -> int:
        """Bytes of one row, its check included."""
        return sum(self.widths) + 2

    def columns(self, payload: Any) -> list[Any]:
        """Each column's bytes, in `BLOCK_COLUMNS`' order."""
        out, at = [], 2 * HEAD_SIZE
        for w in self.widths:
            out.append(payload[at : at + w * self.rows])
            at += w * self.rows
        return out


def encode_block(step: int, rows: Sequence[Row]) -> bytes:
    """One step's rows (checked by the writer: ints in range, floats) as a v3 TENSOR_BLOCK payload."""
    n = len(rows)
    columns = [float32_column(c) if f else uint_column(c) for f, c in zip(_FLOATS, zip(*rows))]
    widths = tuple(len(c) // n for c in columns)
    size = sum(widths)
    packed = np.concatenate([np.frombuffer(c, np.uint8).reshape(n, w) for c, w in zip(columns, widths) if w], axis=1)
    row_bytes = map(itemgetter(0), _row_struct(size).iter_unpack(packed.tobytes()))  # row-major: each row's bytes
    checks = struct.pack(f"<{n}H", *map(crc_hqx, row_bytes, repeat(ROW_SEED)))
    head = _HEAD.pack(2 * HEAD_SIZE + n * (size + 2), step, n, *widths)
    head += _HEAD_CRC.pack(zlib.crc32(head, _HEAD_SEED))
    return b"".join((head, head, *columns, checks))


@lru_cache(maxsize=64)
def _row_struct(size: int) -> struct.Struct:
    return struct.Struct(f"{size}s")


def find_head(data: Any, at: int, end: int) -> BlockHead | None:
    """The head of a block whose payload starts at `at` (the first copy whose CRC matches, if its fields agree),
    if its whole payload lies before `end`; None: no block there, or one cut short."""
    for copy in (at, at + HEAD_SIZE):
        if copy + HEAD_SIZE > end:
            return None
        head = _head_copy(data, copy)
        if head is not None:
            return head if _problem(head) is None and at + head.length <= end else None
    return None


def _head_copy(data: Any, at: int) -> BlockHead | None:
    """The head copy at `at`, if its CRC matches."""
    fields = _HEAD.unpack_from(data, at)
    (crc,) = _HEAD_CRC.unpack_from(data, at + _HEAD.size)
    if zlib.crc32(data[at : at + _HEAD.size], _HEAD_SEED) != crc:
        return None
    return BlockHead(fields[0], fields[1], fields[2], fields[3:])


def _problem(head: BlockHead) -> str | None:
    """What is wrong with a head whose CRC matched (a writer's bug or a crafted file), or None."""
    if not 0 <= head.step <= MAX_STEP:
        return f"field 'step' must be an int in 0..{MAX_STEP}, found int {head.step}"
    if not 1 <= head.rows <= MAX_BLOCK_ROWS:
        return f"field 'rows' must be an int in 1..{MAX_BLOCK_ROWS}, found int {head.rows}"
    for (field, is_float, _), w in zip(BLOCK_COLUMNS, head.widths):
        if w != 4 if is_float else w not in BLOCK_WIDTHS:
            return f"field {field!r} must be {'4 bytes wide' if is_float else 'of width 0, 1, 2, 4 or 8'}, found {w}"
    if head.length != 2 * HEAD_SIZE + head.rows * head.row_bytes:
        return f"head says {head.length} bytes, its rows and widths {2 * HEAD_SIZE + head.rows * head.row_bytes}"
    return None


def decode_block(payload: Any, strings: Mapping[int, str]) -> list[TensorRecord]:
    """The records of a block whose frame CRC matched (the row checks are not consulted then: the CRC-32 over the
    whole payload is the stronger check), each checked as `decode_tensor` checks a TENSOR."""
    head = _head_of(payload)
    return block_records(head.step, head.rows, head.columns(payload), strings)


def declared_rows(payload: Any) -> int | None:
    """How many records a block's head says it holds; None if no head reads."""
    try:
        return _head_of(payload).rows
    except PayloadError:
        return None


def _head_of(payload: Any) -> BlockHead:
    n = len(payload)
    for copy in (0, HEAD_SIZE):
        head = _head_copy(payload, copy) if copy + HEAD_SIZE <= n else None
        if head is not None:
            problem = _problem(head) or (None if head.length == n else f"head says {head.length} bytes, found {n}")
            if problem:
                raise PayloadError(f"TENSOR_BLOCK {problem}")
            return head
    raise PayloadError(f"TENSOR_BLOCK payload of {n} bytes has no head whose CRC matches (two {HEAD_SIZE}-byte copies)")


def salvage_block(
    payload: Any, head: BlockHead, strings: Mapping[int, str]
) -> tuple[list[tuple[int, TensorRecord]], int]:
    """(row index, record) of each row of a damaged block whose check matches, and how many rows were lost. If
    the good rows do not pass `decode_tensor`'s checks either (a lost STRING), all are lost."""
    n, widths = head.rows, head.widths
    raw = np.frombuffer(payload, np.uint8)
    columns = [m.reshape(n, w) for m, w in zip(head.columns(raw), widths)]  # (rows, width) each
    checks = raw[2 * HEAD_SIZE + n * (head.row_bytes - 2) :].view("<u2")
    rows = np.concatenate(columns, axis=1).tobytes()  # row-major: row i's bytes, column by column
    found = map(crc_hqx, map(itemgetter(0), _row_struct(head.row_bytes - 2).iter_unpack(rows)), repeat(ROW_SEED))
    good = np.flatnonzero(np.fromiter(found, np.uint16, n) == checks)
    if not len(good):
        return [], n
    try:
        records = block_records(head.step, len(good), [c[good].tobytes() for c in columns], strings)
    except PayloadError:
        return [], n
    return list(zip(good.tolist(), records)), n - len(good)
