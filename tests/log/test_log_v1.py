"""Format v1 (a TENSOR record per tensor) still reads: a log the v1 writer wrote, and logs framed the same way."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest

from tests.log.conftest import records
from tests.log.v1 import FIXTURE, format_version, write_v1_log
from tracer.log import FORMAT_VERSION, LogReader, Phase, RunHeader, TensorRecord, read_segment_columns


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


@pytest.fixture
def header(header: RunHeader) -> RunHeader:
    """The header the v1 writer wrote: of schema 1, as every log of its time."""
    return dataclasses.replace(header, schema_version=1)


def stored(n: int) -> list:
    """`records(n)` as a log holds them: l2 and absmax as float32."""
    return [
        dataclasses.replace(r, l2=f32(r.l2), absmax=f32(r.absmax)) if isinstance(r, TensorRecord) else r
        for r in records(n)
    ]


def test_a_log_the_v1_writer_wrote_still_reads(header: RunHeader) -> None:
    (path,) = LogReader(FIXTURE).segments
    assert format_version(path) == 1
    reader = LogReader(FIXTURE)
    assert reader.header == header
    assert list(reader.records()) == stored(60)
    assert reader.status.complete and reader.status.end.records == 66 and not reader.status.corruptions

    cols = read_segment_columns(path.read_bytes(), str(path), last=True)
    tensors = [r for r in stored(60) if isinstance(r, TensorRecord)]
    t = cols.tensors
    assert [
        (
            int(t.step[i]),
            int(t.microbatch[i]),
            t.strings[t.name[i]],
            Phase(int(t.phase[i])),
            int(t.fingerprint[i]),
            float(t.l2[i]),
            float(t.absmax[i]),
            int(t.nan[i]),
            int(t.inf[i]),
            t.strings[t.meta[i]],
        )
        for i in range(len(t))
    ] == [dataclasses.astuple(r) for r in tensors]
    assert t.offset.tolist() == [e.offset for e in LogReader(FIXTURE).entries() if isinstance(e.record, TensorRecord)]
    assert [e.record for e in cols.events] == [r for r in stored(60) if not isinstance(r, TensorRecord)]
    assert cols.status.complete and not cols.status.corruptions


def test_v1_log_framed_by_hand_is_what_the_v1_writer_wrote(tmp_path: Path, header: RunHeader) -> None:
    # So that the v1 logs the recovery tests make by hand stand for the v1 writer's.
    written = write_v1_log(tmp_path / "v1", header, records(60))
    assert (written / "000000.sdclog").read_bytes() == (FIXTURE / "000000.sdclog").read_bytes()


def test_the_writer_writes_the_current_format(make_log) -> None:
    assert FORMAT_VERSION == 3
    assert {format_version(p) for p in make_log(300, segment_bytes=1024).glob("*.sdclog")} == {FORMAT_VERSION}
