"""What the reader refuses outright: things that are not a log of this format."""

from __future__ import annotations

import dataclasses
import shutil
import struct
from pathlib import Path

import msgpack
import pytest

from tracer.errors import LogFormatError, UsageError
from tracer.log import FORMAT_VERSION, LogReader, LogWriter, RecordType, RunHeader
from tracer.log.framing import frame


def poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_newer_format_version_asks_for_an_upgrade(make_log) -> None:
    directory = make_log(5)
    poke(directory / "000000.sdclog", 8, struct.pack("<H", FORMAT_VERSION + 1))
    newer = rf"newer sdctrace \(format v{FORMAT_VERSION + 1}, this reader reads <= v{FORMAT_VERSION}\): upgrade"
    with pytest.raises(LogFormatError, match=newer):
        LogReader(directory)


def test_bad_magic(make_log) -> None:
    directory = make_log(5)
    poke(directory / "000000.sdclog", 0, b"PK\x03\x04")
    with pytest.raises(LogFormatError, match="not an sdctrace log segment"):
        LogReader(directory)


def test_nonzero_flags(make_log) -> None:
    directory = make_log(5)
    poke(directory / "000000.sdclog", 10, struct.pack("<H", 1))
    with pytest.raises(LogFormatError, match="flags 0x0001"):
        LogReader(directory)


@pytest.mark.parametrize("what", ["missing", "file", "empty"])
def test_not_a_rank_directory(tmp_path: Path, what: str) -> None:
    path = tmp_path / "rank-00000"
    if what == "file":
        path.write_bytes(b"")
    elif what == "empty":
        path.mkdir()
    with pytest.raises(LogFormatError, match=str(path)):
        LogReader(path)


def test_header_with_a_missing_field_names_file_and_field(make_log, frames) -> None:
    directory = make_log(5)
    path = directory / "000000.sdclog"
    data = path.read_bytes()
    _, _, length = frames(path)[0]
    head = msgpack.unpackb(data[25 : 25 + length])
    del head["run"]["seed"]
    path.write_bytes(data[:16] + frame(RecordType.HEADER, msgpack.packb(head)) + data[25 + length :])
    with pytest.raises(LogFormatError, match=f"{path}: run header lacks field\\(s\\) seed"):
        LogReader(directory)


def test_segments_of_two_runs_are_refused(make_log, tmp_path: Path, header: RunHeader) -> None:
    directory = make_log(300, segment_bytes=1024)
    other = tmp_path / "other"
    LogWriter(other, dataclasses.replace(header, run_id="run-0002")).close()
    shutil.copy(other / "000000.sdclog", directory / "000001.sdclog")
    with pytest.raises(LogFormatError, match="two logs are mixed"):
        list(LogReader(directory).records())


def test_unknown_corruption_mode(make_log) -> None:
    with pytest.raises(UsageError, match="on_corruption"):
        LogReader(make_log(5), on_corruption="ignore")
