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


class HandFramed:
    """Segment files of one log framed by hand as a writer of format `version` framed them: each starts with the file
    header and a HEADER counting the records before it, and interns its own strings."""

    def __init__(self, directory: Path, header: RunHeader, version: int) -> None:
        directory.mkdir(parents=True)
        self.directory, self.header, self.version = directory, header, version
        self.data = bytearray()
        self.index, self.written = -1, 0
        self.strings: dict[str, int] = {}
        self.roll()

    def put(self, rtype: RecordType, payload: bytes) -> None:
        self.data.extend(frame(rtype, payload))

    def roll(self) -> None:
        if self.index >= 0:
            self.save()
        self.index += 1
        self.data[:] = FILE_HEADER.pack(MAGIC, self.version, 0, self.index)
        self.strings.clear()
        self.put(RecordType.HEADER, encode_header(self.header, self.written))

    def intern(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = len(self.strings)
            self.put(RecordType.STRING, encode_string(self.strings[text], text))
        return self.strings[text]

    def close(self, end: bool) -> Path:
        """Write the last segment, with END if `end`."""
        if end:
            self.put(RecordType.END, encode_end(EndRecord("complete", self.written, "")))
        self.save()
        return self.directory

    def save(self) -> None:
        (self.directory / f"{self.index:06d}.sdclog").write_bytes(self.data)


def write_v1_log(
    directory: Path,
    header: RunHeader,
    records: Iterable[TensorRecord | EventRecord],
    *,
    segment_bytes: int = 64 << 20,
    close: bool = True,
) -> Path:
    """A v1 log of `records` in `directory`: segments rolled at `segment_bytes`, END unless `close` is False."""
    log = HandFramed(directory, header, 1)
    for rec in records:
        if len(log.data) >= segment_bytes:
            log.roll()
        if isinstance(rec, TensorRecord):
            name_id, meta_id = log.intern(rec.name), log.intern(rec.meta)
            log.put(
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
            log.put(RecordType.EVENT, encode_event(rec))
        log.written += 1
    return log.close(close)


def format_version(path: Path) -> int:
    return struct.unpack_from("<H", path.read_bytes(), 8)[0]
