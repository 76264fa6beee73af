"""msgpack scalars and block columns read for many records at once: numpy gathers over a segment's bytes.

    r = ByteViews(raw)                       # raw: the segment's bytes as a uint8 array
    values, after = ints(r, at, unsigned=False)   # one msgpack int per record at the offsets `at`; None: not ints

Each reader returns None where a record holds another encoding than the ones the writer packs, so the caller
(tracer/log/columns.py) falls back to the reference decoder for that segment.
"""

from __future__ import annotations

import numpy as np

_I64 = np.iinfo(np.int64)


class ByteViews:
    """Views of a segment's bytes at every byte offset, big-endian (msgpack) or little-endian ("<": block
    columns): one gather reads a field."""

    def __init__(self, raw: np.ndarray) -> None:
        self.buf = np.concatenate([raw, np.zeros(16, np.uint8)])  # lets reads run past a bad payload's end
        self._views = {
            k: np.ndarray((len(self.buf) - 7,), dtype, buffer=self.buf, strides=(1,))
            for k, dtype in (
                ("u2", ">u2"),
                ("u4", ">u4"),
                ("u8", ">u8"),
                ("i2", ">i2"),
                ("i4", ">i4"),
                ("i8", ">i8"),
                ("f4", ">f4"),
                ("<u2", "<u2"),
                ("<u4", "<u4"),
                ("<u8", "<u8"),
                ("<f4", "<f4"),
            )
        }
        self._views["u1"], self._views["<u1"], self._views["i1"] = self.buf, self.buf, self.buf.view(np.int8)

    def read(self, kind: str, at: np.ndarray | slice) -> np.ndarray:
        return self._views[kind][at]


# msgpack int encodings, by tag: (class, bytes after the tag, view to read them with)
_POSFIX, _NEGFIX, _INVALID = 0, 1, 255
_INT_TAGS = {
    0xCC: (1, "u1"),
    0xCD: (2, "u2"),
    0xCE: (4, "u4"),
    0xCF: (8, "u8"),
    0xD0: (1, "i1"),
    0xD1: (2, "i2"),
    0xD2: (4, "i4"),
    0xD3: (8, "i8"),
}
_BIN_TAGS = {0xC4: (1, "u1"), 0xC5: (2, "u2"), 0xC6: (4, "u4")}  # bin 8, 16, 32: bytes of the length after the tag
_TAG_CLASS = np.full(256, _INVALID, np.uint8)
_TAG_CLASS[:0x80], _TAG_CLASS[0xE0:] = _POSFIX, _NEGFIX
for _tag in _INT_TAGS:
    _TAG_CLASS[_tag] = _tag


def ints(r: ByteViews, at: np.ndarray, *, unsigned: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """One msgpack int per record at `at`: (values as int64, or uint64 if `unsigned`; next offsets)."""
    tag = r.buf[at]
    cls = _TAG_CLASS[tag]
    present = np.flatnonzero(np.bincount(cls, minlength=256)).tolist()
    value = np.empty(len(at), np.uint64 if unsigned else np.int64)
    width = np.empty(len(at), np.int64)
    for c in present:
        m: np.ndarray | slice = slice(None) if len(present) == 1 else cls == c
        if c == _POSFIX:
            value[m], width[m] = tag[m], 1
        elif c == _NEGFIX and not unsigned:
            value[m], width[m] = tag[m].astype(np.int64) - 256, 1
        elif c in _INT_TAGS and not (unsigned and _INT_TAGS[c][1].startswith("i")):
            nbytes, kind = _INT_TAGS[c]
            v = r.read(kind, at[m] + 1)
            if kind == "u8" and not unsigned and (v > _I64.max).any():
                return None
            value[m], width[m] = v, 1 + nbytes
        else:
            return None
    return value, at + width


def floats32(r: ByteViews, at: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    if not (r.buf[at] == 0xCA).all():  # float32: what the writer packs
        return None
    return r.read("f4", at + 1).astype(np.float32), at + 5


def bins(r: ByteViews, at: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """One msgpack bin per record at `at`: (offsets of their bytes, lengths)."""
    tag = r.buf[at]
    length = np.empty(len(at), np.int64)
    head = np.empty(len(at), np.int64)
    for t, (size, kind) in _BIN_TAGS.items():
        m = tag == t
        if m.any():
            length[m], head[m] = r.read(kind, at[m] + 1), 1 + size
    if not np.isin(tag, list(_BIN_TAGS)).all():
        return None
    return at + head, length


def block_column(
    r: ByteViews,
    start: np.ndarray,
    width: np.ndarray,
    rows: np.ndarray,
    first_row: np.ndarray,
    index: np.ndarray,
    is_float: bool,
) -> np.ndarray:
    """One column of every block, row by row: a block's row i is at start + width * i. Float32 or unsigned ints
    of the blocks' width (uint64 when widths differ between blocks)."""
    present = np.unique(width).tolist()
    if present == [0]:
        return np.zeros(len(index), np.uint8)
    if len(present) == 1:
        w = present[0]
        return r.read("<f4" if is_float else f"<u{w}", np.repeat(start - w * first_row, rows) + w * index)
    row_width = np.repeat(width, rows)
    at = np.repeat(start - width * first_row, rows) + row_width * index
    out = np.zeros(len(index), np.uint64)
    for w in present:
        if w:
            m = row_width == w
            out[m] = r.read(f"<u{w}", at[m])
    return out
