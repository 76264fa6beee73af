"""Format-v2 logs, framed by hand as the v2 writer framed them (TENSOR_BLOCKs as msgpack arrays of columns, with no
check of their own), so that tests can check that the reader keeps reading them. `tests/log/data/v2-log` holds one
the v2 `LogWriter` wrote (sdctrace 04836f4, `make_log(60)`'s records);
`test_v2_log_framed_by_hand_is_what_the_v2_writer_wrote` pins this module to it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgpack

from tests.log.v1 import HandFramed
from tracer.log import EventRecord, RecordType, RunHeader, TensorRecord
from tracer.log.codec import BLOCK_COLUMNS, Row, encode_event, encode_tensor, float32_column, uint_column
from tracer.log.framing import FILE_HEADER, MAGIC, frame

FIXTURE = Path(__file__).parent / "data" / "v2-log"
BLOCK_ROWS = 4096  # the v2 writer's
ROW_BYTES = 24  # what the v2 writer counted a held row at, deciding to roll


def encode_v2_block(step: int, rows: Sequence[Row]) -> bytes:
    """A v2 TENSOR_BLOCK payload: `[step, rows, 9 bin columns]`."""
    columns = [float32_column(c) if f else uint_column(c) for (_, f, _), c in zip(BLOCK_COLUMNS, zip(*rows))]
    return msgpack.packb([step, len(rows), *columns])


def write_v2_log(
    directory: Path,
    header: RunHeader,
    records: Iterable[TensorRecord | EventRecord],
    *,
    segment_bytes: int = 64 << 20,
    close: bool = True,
) -> Path:
    """A v2 log of `records` in `directory`, rolled and blocked as the v2 writer did; END unless `close` is False."""
    log = HandFramed(directory, header, 2)
    rows: list[Row] = []
    block_step = -1

    def flush_block() -> None:
        if len(rows) > 1:
            log.put(RecordType.TENSOR_BLOCK, encode_v2_block(block_step, rows))
        elif rows:
            log.put(RecordType.TENSOR, encode_tensor(block_step, rows[0]))
        rows.clear()

    for rec in records:
        if isinstance(rec, TensorRecord):
            if rec.step != block_step or len(rows) >= BLOCK_ROWS:
                flush_block()
                block_step = rec.step
            if len(log.data) + len(rows) * ROW_BYTES >= segment_bytes:
                flush_block()
                log.roll()
            name_id, meta_id = log.intern(rec.name), log.intern(rec.meta)
            rows.append(
                (rec.microbatch, name_id, rec.phase, rec.fingerprint, rec.l2, rec.absmax, rec.nan, rec.inf, meta_id)
            )
        else:
            flush_block()
            if len(log.data) >= segment_bytes:
                log.roll()
            log.put(RecordType.EVENT, encode_event(rec))
        log.written += 1
    flush_block()
    return log.close(close)


def as_v2(path: Path) -> None:
    """Rewrite a v3 segment file as the v2 writer would have written the same records: each TENSOR_BLOCK as v2's
    msgpack array of its columns, the file header saying v2. A real run's log, in the older format."""
    from tests.log.v3 import split_block

    data = path.read_bytes()
    out, pos = bytearray(FILE_HEADER.pack(MAGIC, 2, 0, struct.unpack_from("<I", data, 12)[0])), 16
    while pos < len(data):
        length, _, rtype = struct.unpack_from("<IIB", data, pos)
        payload = data[pos + 9 : pos + 9 + length]
        if rtype == RecordType.TENSOR_BLOCK:
            payload = msgpack.packb(split_block(payload))
        out += frame(RecordType(rtype), payload)
        pos += 9 + length
    path.write_bytes(bytes(out))
