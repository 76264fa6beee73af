"""Bytes of a segment file: the file header and the checksummed frame around each record.

What a payload means is codec.py's job; this module only knows lengths, types and
CRCs. docs/log-format.md is the byte-level specification.
"""

from __future__ import annotations

import re
import struct
import zlib
from enum import IntEnum

MAGIC = b"SDCTRACE"
# Version of the byte layout (this module and codec.py). Readers refuse newer ones and read every older one.
FORMAT_VERSION = 3

FILE_HEADER = struct.Struct("<8sHHI")  # magic, format version, flags (0), segment index
FRAME = struct.Struct("<IIB")  # payload length, CRC32 of type byte + payload, record type
HEADER_SIZE = FILE_HEADER.size  # 16
FRAME_SIZE = FRAME.size  # 9
MAX_RECORD_BYTES = 256 << 20  # a longer declared payload is corruption, not data


class RecordType(IntEnum):
    HEADER = 1
    STRING = 2
    TENSOR = 3
    EVENT = 4
    END = 5
    TENSOR_BLOCK = 6  # format v2: TENSOR records of one step, as columns; v3: with a check per row


# The record types each format version defines; any other type is corruption.
RECORD_TYPES = {
    1: frozenset(RecordType) - {RecordType.TENSOR_BLOCK},
    2: frozenset(RecordType),
    3: frozenset(RecordType),
}
# Starting value that makes zlib.crc32(payload, seed) the CRC of type byte + payload.
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in RecordType}

# Where a frame could start: the top byte of a length <= MAX_RECORD_BYTES is <= 0x10 and
# the type is one of RecordType. A regex finds candidates at C speed; the CRC then confirms them.
_CANDIDATE = re.compile(rb"(?=.{3}[\x00-\x10].{4}[\x01-%c])" % max(RecordType), re.DOTALL)


def file_header(segment_index: int) -> bytes:
    return FILE_HEADER.pack(MAGIC, FORMAT_VERSION, 0, segment_index)


def frame(rtype: RecordType, payload: bytes) -> bytes:
    """The record as stored: frame header, then payload."""
    return FRAME.pack(len(payload), zlib.crc32(payload, _TYPE_CRC[rtype]), rtype) + payload


def next_frame(data: memoryview, start: int) -> int:
    """Offset of the first valid frame (known type, plausible length, matching CRC)
    at or after `start`, or len(data) if there is none: where a reader resumes after
    a bad region."""
    end = len(data)
    for m in _CANDIDATE.finditer(data, start):
        pos = m.start()
        length, crc, _ = FRAME.unpack_from(data, pos)
        stop = pos + FRAME_SIZE + length
        if length <= MAX_RECORD_BYTES and stop <= end and zlib.crc32(data[pos + FRAME_SIZE - 1 : stop]) == crc:
            return pos
    return end
