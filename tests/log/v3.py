"""Format-v3 TENSOR_BLOCK payloads taken apart and put back together, as `[step, rows, 9 column byte strings]` (the
shape a v2 block's msgpack array has), so that tests can rewrite a block's fields and columns and frame it validly:
the heads are rebuilt with matching CRCs, so the rewritten block reaches the content checks."""

from __future__ import annotations

import struct
import zlib
from binascii import crc_hqx

from tracer.log.checked_block import HEAD_SIZE, ROW_SEED, BlockHead
from tracer.log.codec import BLOCK_COLUMNS

HEAD = struct.Struct(f"<IQI{len(BLOCK_COLUMNS)}B")  # the spec's head, less its CRC


def split_block(payload: bytes) -> list:
    """`[step, rows, *columns]` of a v3 block payload, from its first head copy."""
    fields = HEAD.unpack_from(payload)
    head = BlockHead(fields[0], fields[1], fields[2], fields[3:])
    return [head.step, head.rows, *(bytes(c) for c in head.columns(payload))]


def join_block(block: list, *, head_length: int | None = None) -> bytes:
    """A v3 block payload of `[step, rows, *columns]`: each column's width is its length over `rows`; both head
    copies check; the row checks are those of the rows as the columns hold them (zeros where they do not divide)."""
    step, rows, columns = block[0], block[1], block[2:]
    widths = [len(c) // rows if rows else 0 for c in columns]
    checks = [0] * min(rows, 16)  # rows that the columns do not hold: the head disagrees with the payload anyway
    if rows and all(len(c) == w * rows for c, w in zip(columns, widths)):
        checks = [
            crc_hqx(b"".join(c[i * w : (i + 1) * w] for c, w in zip(columns, widths)), ROW_SEED) for i in range(rows)
        ]
    body = b"".join(columns) + struct.pack(f"<{len(checks)}H", *checks)
    length = 2 * HEAD_SIZE + len(body) if head_length is None else head_length
    head = HEAD.pack(length, step % 2**64, rows % 2**32, *(w % 256 for w in widths))
    head += struct.pack("<I", zlib.crc32(head, zlib.crc32(b"\x06")))
    return head + head + body
