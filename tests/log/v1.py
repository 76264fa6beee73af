"""Format-v1 logs, framed by hand as the v1 writer framed them (one TENSOR record per tensor), so that tests can
check that the reader keeps reading them. `tests/log/data/v1-log` holds one the v1 `LogWriter` wrote (sdctrace
d101bdd, `make_log(60)`'s records); `test_v1_log_framed_by_hand_is_what_the_v1_writer_wrote` pins this module to it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

import msgpack

from tracer.log import EndRecord, EventRecord, RecordType, RunHeader, TensorRecord
from tracer.log.codec import encode_end, encode_event, encode_header, encode_string
from tracer.log.framing import FILE_HEADER, MAGIC, frame

FIXTURE = Path(__file__).parent / "data" / "v1-log"


def write_v1_log(
    directory: Path,
    header: RunHeader,
    records: Iterable[TensorRecord | EventRecord],
    *,
    segment_bytes: int = 64 << 20,
    close: bool = True,
) -> Path:
    """A v1 log of `records` in `directory`: segments rolled at `segment_bytes`, END unless `close` is False."""
    directory.mkdir(parents=True)
    written, index = 0, -1
    data = bytearray()
    strings: dict[str, int] = {}

    def put(rtype: RecordType, payload: bytes) -> None:
        data.extend(frame(rtype, payload))

    def roll() -> None:
        nonlocal index
        if index >= 0:
            (directory / f"{index:06d}.sdclog").write_bytes(data)
        index += 1
        data[:] = FILE_HEADER.pack(MAGIC, 1, 0, index)
        strings.clear()
        put(RecordType.HEADER, encode_header(header, written))

    def intern(text: str) -> int:
        if text not in strings:
            strings[text] = len(strings)
            put(RecordType.STRING, encode_string(strings[text], text))
        return strings[text]

    roll()
    for rec in records:
        if len(data) >= segment_bytes:
            roll()
        if isinstance(rec, TensorRecord):
            name_id, meta_id = intern(rec.name), intern(rec.meta)
            put(
                RecordType.TENSOR,
                msgpack.packb(
                    [
                        rec.step,
                        rec.microbatch,
                        name_id,
                        int(rec.phase),
                        rec.fingerprint,
                        rec.l2,
                        rec.absmax,
                        rec.nan,
                        rec.inf,
                        meta_id,
                    ],
                    use_single_float=True,
                ),
            )
        else:
            put(RecordType.EVENT, encode_event(rec))
        written += 1
    if close:
        put(RecordType.END, encode_end(EndRecord("complete", written, "")))
    (directory / f"{index:06d}.sdclog").write_bytes(data)
    return directory


def format_version(path: Path) -> int:
    return struct.unpack_from("<H", path.read_bytes(), 8)[0]
