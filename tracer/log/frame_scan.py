"""Find a segment's frames and check their CRCs with whole-array operations: the fast path of
`tracer.log.columns`.

    chain = frame_chain(raw, start)          # (offsets, stops) of the frames tiling raw[start:], or None
    ok = (crcs(raw, view, offsets + FRAME_SIZE - 1, stops) == u32le(raw, offsets + 4)).all()

Neither judges a bad segment: a None or a CRC mismatch sends the caller to the reference decoder
(`tracer.log.segment.Segment`), which says what is wrong and where.
"""

from __future__ import annotations

import functools
import struct
import zlib
from enum import Enum
from typing import Literal

import numpy as np

from tracer.log.framing import FRAME_SIZE, MAX_RECORD_BYTES, RecordType

_HEADER = int(RecordType.HEADER)
# In this DAG of candidate frames (each points past itself), peeling nodes without an
# in-edge leaves what is reachable from the first frame; a clean segment needs one or
# two rounds. More means long runs of frame-like bytes: the reference decoder copes.
_PEEL_ROUNDS = 16
_VECTOR_CRC_MIN = 512  # spans of one length below which zlib, one call each, is faster
_VECTOR_CRC_MAX = 128  # bytes per span above which zlib is faster (a vector step per byte costs about a gather)
_WALK_BYTES = 512  # frames average at least this many bytes: follow them one by one (`_walk`), else scan


def u32le(raw: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each offset ``at`` of ``raw``."""
    b = [raw[at + k].astype(np.uint32) for k in range(4)]
    return b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)


def crcs(raw: np.ndarray, view: memoryview, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """CRC-32 of each raw[start:stop]; many spans of one length at once, through per-position tables."""
    out = np.empty(len(starts), np.uint32)
    lengths = stops - starts
    sizes, counts = np.unique(lengths, return_counts=True)
    for size, count in zip(sizes.tolist(), counts.tolist()):
        idx = np.flatnonzero(lengths == size)
        if count < _VECTOR_CRC_MIN or size > _VECTOR_CRC_MAX:
            spans = map(slice, starts[idx].tolist(), stops[idx].tolist())
            out[idx] = np.fromiter(map(zlib.crc32, map(view.__getitem__, spans)), np.uint32, count)
            continue
        tables, empty = _crc_tables(size)
        at = starts[idx]
        acc = np.full(count, empty, np.uint32)
        for j in range(size):
            acc ^= tables[j][raw[at + j]]
        out[idx] = acc
    return out


@functools.lru_cache(maxsize=64)
def _crc_tables(size: int) -> tuple[np.ndarray, int]:
    """CRC-32 is affine in the message bits: crc(m) = crc(zeros) ^ XOR_j table[j][m[j]] for a fixed length."""
    empty = zlib.crc32(bytes(size))
    unit = np.zeros((size, 8), np.uint32)  # contribution of bit b of byte j
    for j in range(size):
        for b in range(8):
            m = bytearray(size)
            m[j] = 1 << b
            unit[j, b] = zlib.crc32(m) ^ empty
    tables = np.zeros((size, 256), np.uint32)
    for b in range(8):
        tables[:, (np.arange(256) >> b) & 1 == 1] ^= unit[:, b : b + 1]
    return tables, empty


def frame_chain(raw: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Offsets and ends of the frames that tile raw[start:] exactly (frame checks but the CRC), or None."""
    n = len(raw)
    if start == n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if n - start < FRAME_SIZE:
        return None
    walked = _walk(raw, start, (n - start) // _WALK_BYTES + 1)
    if walked is not _Walk.LONG:
        return walked
    # A frame candidate: known type byte, and a length whose top byte allows <= MAX_RECORD_BYTES.
    cand = np.flatnonzero((raw[start + FRAME_SIZE - 1 :] - np.uint8(_HEADER)) < len(RecordType)).astype(np.int64)
    cand += start
    cand = cand[raw[cand + 3] <= MAX_RECORD_BYTES >> 24]
    length = u32le(raw, cand).astype(np.int64)
    stop = cand + FRAME_SIZE + length
    fits = (length <= MAX_RECORD_BYTES) & (stop <= n)
    cand, stop = cand[fits], stop[fits]
    if len(cand) == 0 or cand[0] != start:
        return None
    nxt = _next_candidate(cand, stop)
    points = nxt < len(cand)
    alive = np.ones(len(cand), bool)
    for _ in range(_PEEL_ROUNDS):
        has_in = np.zeros(len(cand), bool)
        has_in[nxt[alive & points]] = True
        has_in[0] = True
        keep = alive & has_in
        if np.array_equal(keep, alive):
            break
        alive = keep
    else:
        return None
    offsets, stops = cand[alive], stop[alive]
    if stops[-1] != n or not np.array_equal(stops[:-1], offsets[1:]):
        return None
    return offsets, stops


class _Walk(Enum):
    LONG = "more frames than it may follow"  # `_walk`'s answer past `most` frames


_U32LE = struct.Struct("<I").unpack_from


def _walk(raw: np.ndarray, start: int, most: int) -> tuple[np.ndarray, np.ndarray] | None | Literal[_Walk.LONG]:
    """`frame_chain` by following each frame's length from the first: the frames that tile raw[start:], None if
    they do not, or `_Walk.LONG` past `most` frames. A segment of large records (TENSOR_BLOCKs) has a few frames per
    kilobyte: following them costs less than the candidate scan over every byte, which small records need."""
    data, n, kinds = raw.data, len(raw), len(RecordType)
    offsets: list[int] = []
    at = start
    while at < n:
        if len(offsets) == most:
            return _Walk.LONG
        if n - at < FRAME_SIZE or not 0 <= data[at + FRAME_SIZE - 1] - _HEADER < kinds:
            return None
        length = _U32LE(data, at)[0]
        if length > MAX_RECORD_BYTES:
            return None
        offsets.append(at)
        at += FRAME_SIZE + length
    if at != n:
        return None
    found = np.array(offsets, np.int64)
    return found, np.append(found[1:], n)


def _next_candidate(cand: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """Index of the candidate at each candidate's end, or len(cand). Real frames mostly point a step or two
    ahead (past the odd frame-like byte run), so those are tried before a binary search."""
    m = len(cand)
    nxt = np.full(m, m, np.int64)
    todo = np.arange(m)
    for ahead in (1, 2, 3):
        j = np.minimum(todo + ahead, m - 1)
        hit = cand[j] == stop[todo]
        nxt[todo[hit]] = j[hit]
        todo = todo[~hit]
    j = np.minimum(np.searchsorted(cand, stop[todo]), m - 1)
    hit = cand[j] == stop[todo]
    nxt[todo[hit]] = j[hit]
    return nxt
