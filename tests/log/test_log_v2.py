"""Format v2 (TENSOR_BLOCKs as msgpack arrays, checked by their frame alone) still reads: a log the v2 writer wrote,
and logs framed the same way."""

from __future__ import annotations

from pathlib import Path

from tests.log.conftest import records
from tests.log.test_log_v1 import stored
from tests.log.v1 import format_version
from tests.log.v2 import FIXTURE, write_v2_log
from tracer.log import LogReader, RecordType, RunHeader, TensorRecord, read_segment_columns


def test_a_log_the_v2_writer_wrote_still_reads(header: RunHeader, frames) -> None:
    (path,) = LogReader(FIXTURE).segments
    assert format_version(path) == 2
    assert RecordType.TENSOR_BLOCK in {t for _, t, _ in frames(path)}
    reader = LogReader(FIXTURE)
    assert reader.header == header
    assert list(reader.records()) == stored(60)
    assert reader.status.complete and reader.status.end.records == 66 and not reader.status.corruptions

    cols = read_segment_columns(path.read_bytes(), str(path), last=True)
    t = cols.tensors
    tensors = [r for r in stored(60) if isinstance(r, TensorRecord)]
    assert [(t.strings[t.name[i]], int(t.fingerprint[i]), float(t.l2[i])) for i in range(len(t))] == [
        (r.name, r.fingerprint, r.l2) for r in tensors
    ]
    assert t.offset.tolist() == [e.offset for e in LogReader(FIXTURE).entries() if isinstance(e.record, TensorRecord)]
    assert cols.status.complete and not cols.status.corruptions


def test_v2_log_framed_by_hand_is_what_the_v2_writer_wrote(tmp_path: Path, header: RunHeader) -> None:
    # So that the v2 logs the recovery tests make by hand stand for the v2 writer's.
    written = write_v2_log(tmp_path / "v2", header, records(60))
    assert (written / "000000.sdclog").read_bytes() == (FIXTURE / "000000.sdclog").read_bytes()
