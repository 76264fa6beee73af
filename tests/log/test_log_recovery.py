"""One test per failure mode, each made by truncating or editing bytes of a real log.

A crash can only cut the last segment short: that is a torn tail (warning, end of log).
Anything else is corruption: an error naming file and byte offset, or, in skip mode, a
resynchronisation at the next valid frame that is counted and recorded.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from tests.log.conftest import DATA_TENSORS, in_frame
from tracer.errors import LogCorruptionError
from tracer.log import EventRecord, LogReader, LostRange, RecordType, TornTailWarning

# Every failure mode that involves a record holding tensors, for every format: v1 (a TENSOR record per tensor), v2
# (TENSOR_BLOCKs of one step's tensors) and v3 (TENSOR_BLOCKs with their head twice and a check per row, which keep
# the records a damaged frame did not touch).
VERSIONS = pytest.mark.parametrize("version", [1, 2, 3])


def read_all(directory: Path, **kw):
    reader = LogReader(directory, **kw)
    return list(reader.entries()), reader.status


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip(path: Path, offset: int) -> None:
    poke(path, offset, bytes([path.read_bytes()[offset] ^ 0x40]))


def middle_tensor(frames, path: Path) -> tuple[int, int, int]:
    """The middle frame holding tensors: a TENSOR record (v1) or a TENSOR_BLOCK (v2, v3)."""
    tensors = [f for f in frames(path) if f[1] in DATA_TENSORS]
    return tensors[len(tensors) // 2]


@pytest.mark.parametrize("cut", [1, 8, 9, 12])  # inside the frame header, or inside the payload
@VERSIONS
def test_torn_tail_ends_the_log_with_a_warning(make_log, frames, cut: int, version: int) -> None:
    directory = make_log(60, close=False, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    offset = frames(path)[-3][0]
    truncate(path, offset + cut)

    with pytest.warns(TornTailWarning, match=f"byte {offset}"):
        entries, status = read_all(directory)

    assert entries == [e for e in intact if e.offset < offset]
    assert status.torn_tail and not status.complete and status.corruptions == []


@pytest.mark.parametrize("size", [0, 10])
def test_torn_file_header_in_the_last_segment(make_log, size: int) -> None:
    directory = make_log(300, segment_bytes=1024, close=False)
    segments = LogReader(directory).segments
    intact, _ = read_all(directory)
    truncate(segments[-1], size)

    with pytest.warns(TornTailWarning, match="header"):
        entries, status = read_all(directory)

    assert entries == [e for e in intact if e.segment < len(segments) - 1]
    assert status.torn_tail


def test_zero_filled_tail_is_a_torn_tail(make_log, frames) -> None:
    # What some file systems show after a power loss: the size grew, the data did not land.
    directory = make_log(60, close=False)
    (path,) = LogReader(directory).segments
    offset = frames(path)[-5][0]
    poke(path, offset, bytes(path.stat().st_size - offset))

    with pytest.warns(TornTailWarning):
        entries, status = read_all(directory)
    assert entries and entries[-1].offset < offset and status.torn_tail


@VERSIONS
def test_truncation_in_a_non_last_segment_is_corruption(make_log, frames, version: int) -> None:
    directory = make_log(300, segment_bytes=1024, version=version)
    segments = LogReader(directory).segments
    path = segments[1]
    offset, _, _ = frames(path)[-2]
    truncate(path, offset + 5)

    with pytest.raises(LogCorruptionError) as err:
        read_all(directory)
    assert (err.value.path, err.value.offset) == (str(path), offset)

    entries, status = read_all(directory, on_corruption="skip")
    assert status.complete and status.skipped_bytes == 5 and status.skipped_records == 1
    assert [c[:2] for c in status.corruptions] == [(str(path), offset)]
    assert {e.segment for e in entries} == set(range(len(segments)))


@VERSIONS
def test_crc_mismatch_names_file_and_offset(make_log, frames, version: int) -> None:
    directory = make_log(60, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    bad = offset, _, length = middle_tensor(frames, path)
    held = [e for e in intact if in_frame(e.offset, bad)]
    flip(path, offset + 9 + length // 2)

    with pytest.raises(LogCorruptionError, match="CRC mismatch") as err:
        read_all(directory)
    assert (err.value.path, err.value.offset) == (str(path), offset)
    assert f"{path}: corrupt record at byte {offset}" in str(err.value)

    entries, status = read_all(directory, on_corruption="skip")
    if version < 3:
        assert entries == [e for e in intact if not in_frame(e.offset, bad)]
        assert (status.skipped_records, status.skipped_bytes) == (1, 9 + length)
    else:  # the block's own checks keep every record but the one whose bytes the flip touched
        (lost,) = [e for e in intact if e not in entries]
        assert in_frame(lost.offset, bad) and len(entries) == len(intact) - 1
        assert status.skipped_records == 1 and status.lost_records == 1
        assert err.value.reason.endswith(f"own checks kept {len(held) - 1} of its {len(held)} records")
    assert status.corruptions == [(str(path), offset, err.value.reason)]
    assert status.complete


@pytest.mark.parametrize(
    ("length", "reason"),
    [
        (lambda n, left: n + 3, "CRC mismatch"),
        (lambda n, left: 0xFFFFFFFF, "exceeds the"),
        (lambda n, left: left + 100, "past the end of the file"),  # not a torn tail: valid frames follow
    ],
)
@VERSIONS
def test_corrupted_length_field(make_log, frames, length, reason: str, version: int) -> None:
    directory = make_log(60, close=False, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    bad = offset, _, n = middle_tensor(frames, path)
    poke(path, offset, struct.pack("<I", length(n, path.stat().st_size - offset)))

    with pytest.raises(LogCorruptionError, match=reason) as err:
        read_all(directory)
    assert err.value.offset == offset

    entries, status = read_all(directory, on_corruption="skip")
    assert not status.torn_tail and len(status.corruptions) == 1
    if version < 3:
        assert entries == [e for e in intact if not in_frame(e.offset, bad)] and status.skipped_records == 1
    else:  # the block's head, written twice, says where it ends: nothing is lost
        assert entries == intact and status.lost == [] and "kept 6 of its 6 records" in err.value.reason


@pytest.mark.parametrize(("version", "rtype"), [(1, 9), (2, 9), (1, RecordType.TENSOR_BLOCK)])
def test_unknown_record_type_is_corruption(make_log, frames, version: int, rtype: int) -> None:
    # TENSOR_BLOCK came with format v2: in a v1 file it is as unknown as any other type.
    directory = make_log(60, version=version)
    (path,) = LogReader(directory).segments
    offset, _, length = middle_tensor(frames, path)
    payload = path.read_bytes()[offset + 9 : offset + 9 + length]
    poke(path, offset + 4, struct.pack("<IB", zlib.crc32(bytes([rtype]) + payload), rtype))  # a CRC that matches

    unknown = rf"unknown record type {rtype} \(format v{version} defines 1\.\."
    with pytest.raises(LogCorruptionError, match=unknown) as err:
        read_all(directory)
    assert err.value.offset == offset


@VERSIONS
def test_tensor_whose_string_was_lost(make_log, frames, version: int) -> None:
    directory = make_log(60, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    strings = [f for f in frames(path) if f[1] == RecordType.STRING]
    offset, _, length = strings[1]  # the meta string: every TENSOR record refers to it
    flip(path, offset + 9 + length - 1)
    holders = [f for f in frames(path) if f[1] in DATA_TENSORS]  # 60 TENSOR records, or 10 blocks
    assert len(holders) == (60 if version == 1 else 10)

    with pytest.raises(LogCorruptionError, match="CRC mismatch"):
        read_all(directory)

    entries, status = read_all(directory, on_corruption="skip")
    lost = [c for c in status.corruptions if "STRING record was lost" in c[2]]
    assert [c[1] for c in lost] == [f[0] for f in holders] and status.skipped_records == 1 + len(holders)
    assert entries == [e for e in intact if isinstance(e.record, EventRecord)]
    # Each block's records are counted; the bad region claims one more, as a bad region always does (at least one).
    assert status.lost_records == 60 + 1


@VERSIONS
def test_missing_end_reads_as_a_crashed_run(make_log, version: int) -> None:
    entries, status = read_all(make_log(60, close=False, version=version))
    assert len(entries) == status.records == 66
    assert not status.complete and status.end is None and not status.torn_tail


def test_missing_segment_is_corruption(make_log) -> None:
    directory = make_log(300, segment_bytes=1024)
    segments = LogReader(directory).segments
    segments[2].unlink()

    with pytest.raises(LogCorruptionError, match="segment file missing") as err:
        read_all(directory)
    assert err.value.path == str(segments[2])

    entries, status = read_all(directory, on_corruption="skip")
    assert 2 not in {e.segment for e in entries} and len(status.corruptions) == 1


@VERSIONS
def test_segment_cut_at_a_record_boundary_is_corruption(make_log, frames, version: int) -> None:
    # No frame is damaged, but the next segment's HEADER says how many records came before.
    directory = make_log(300, segment_bytes=1024, version=version)
    segments = LogReader(directory).segments
    truncate(segments[1], frames(segments[1])[-1][0])

    with pytest.raises(LogCorruptionError, match="records are missing") as err:
        read_all(directory)
    assert (err.value.path, err.value.offset) == (str(segments[2]), 16)


@VERSIONS
def test_record_cut_out_of_the_last_segment_is_corruption(make_log, frames, version: int) -> None:
    directory = make_log(60, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    cut = offset, _, length = middle_tensor(frames, path)
    data = path.read_bytes()
    path.write_bytes(data[:offset] + data[offset + 9 + length :])
    held = sum(in_frame(e.offset, cut) for e in intact)
    assert held == (1 if version == 1 else 6)

    with pytest.raises(LogCorruptionError, match=f"END counts 66 records but the log holds {66 - held}"):
        read_all(directory)


@VERSIONS
def test_record_after_end_is_corruption(make_log, frames, version: int) -> None:
    directory = make_log(60, version=version)
    (path,) = LogReader(directory).segments
    offset, _, length = middle_tensor(frames, path)
    data = path.read_bytes()
    path.write_bytes(data + data[offset : offset + 9 + length])

    with pytest.raises(LogCorruptionError, match="after the END record") as err:
        read_all(directory)
    assert err.value.offset == len(data)


def test_renamed_segment_is_corruption(make_log) -> None:
    directory = make_log(300, segment_bytes=1024)
    one, two = directory / "000001.sdclog", directory / "000002.sdclog"
    one.rename(directory / "tmp")
    two.rename(one)
    (directory / "tmp").rename(two)

    with pytest.raises(LogCorruptionError, match="file header says segment 2 but the file name says 1") as err:
        read_all(directory)
    assert (err.value.path, err.value.offset) == (str(one), 12)


@pytest.mark.parametrize("misplaced", ["HEADER inside a segment", "END before the last segment", "no HEADER first"])
def test_misplaced_records_are_corruption(make_log, frames, misplaced: str) -> None:
    directory = make_log(300, segment_bytes=1024)
    first, last = LogReader(directory).segments[0], LogReader(directory).segments[-1]
    data = first.read_bytes()
    (h_off, _, h_len), (s_off, _, _) = frames(first)[:2]
    if misplaced == "HEADER inside a segment":
        first.write_bytes(data + data[h_off : h_off + 9 + h_len])
        expected = "HEADER record after the first record"
    elif misplaced == "END before the last segment":
        e_off, _, e_len = frames(last)[-1]
        first.write_bytes(data + last.read_bytes()[e_off : e_off + 9 + e_len])
        expected = "END record in a segment that is not the log's last"
    else:
        first.write_bytes(data[:16] + data[s_off:])
        expected = "segment starts with a STRING record, expected HEADER"

    with pytest.raises(LogCorruptionError, match=expected):
        read_all(directory)


def test_lost_header_is_taken_from_the_next_segment(make_log, frames, header) -> None:
    directory = make_log(300, segment_bytes=1024)
    intact, _ = read_all(directory)
    first = LogReader(directory).segments[0]
    _, _, length = frames(first)[0]
    flip(first, 16 + 9 + length // 2)

    with pytest.raises(LogCorruptionError, match="CRC mismatch") as err:
        LogReader(directory)
    assert err.value.offset == 16

    reader = LogReader(directory, on_corruption="skip")
    assert reader.header == header
    assert list(reader.entries()) == intact and len(reader.status.corruptions) == 1


def holding(frames, path: Path, intact: list, record: int) -> tuple[int, int, int]:
    """The frame that holds tensor record number `record` (counting tensor records only)."""
    tensors = [e for e in intact if not isinstance(e.record, EventRecord)]
    return next(f for f in frames(path) if f[1] in DATA_TENSORS and in_frame(tensors[record].offset, f))


@pytest.mark.parametrize(("version", "steps"), [(1, (2, 5)), (2, (2, 6)), (3, (2, 6))])
def test_bytes_cut_out_of_the_middle_are_counted_as_lost_records_and_steps(make_log, frames, version, steps) -> None:
    # Bytes removed mid-log: the frame at the cut fails its CRC and reading resumes past whole steps; END's
    # count says how many records went, the records around the gap which steps they belonged to. (Reading resumes
    # after the frame that held tensor 70: tensor 71, or, in v2, the block of step 6 after 70's and 71's.)
    directory = make_log(120, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    start = holding(frames, path, intact, 30)[0]
    cut, resume = start + 12, holding(frames, path, intact, 70)[0] + 5
    data = path.read_bytes()
    path.write_bytes(data[:cut] + data[resume:])

    entries, status = read_all(directory, on_corruption="skip")
    kept = {e.offset for e in entries}
    lost = len(intact) - len(entries)
    (gap,) = status.lost
    assert gap.records == status.lost_records == lost > 40 and gap.start == start
    before = max(e.record.step for e in intact if e.offset < start)
    after = min(e.record.step for e in entries if e.offset > gap.start)
    assert (gap.first_step, gap.last_step) == (before, after) == steps and after - before >= 3
    assert status.lost_bytes == gap.stop - gap.start and kept


@pytest.mark.parametrize(("version", "held", "steps"), [(1, 1, (2, 2)), (2, 6, (2, 3)), (3, 1, (2, 2))])
def test_flipped_frame_loses_its_records_between_its_neighbours_steps(make_log, frames, version, held, steps) -> None:
    # v1: tensor 30, between tensors 29 and 31 of step 2. v2: the block of tensors 30-35 (step 2), between tensor 29
    # and the block of 36-39 (step 3); END's count says how many records the bad frame held. v3: the one record of
    # that block whose bytes the flip touched, in step 2.
    directory = make_log(60, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    bad = offset, _, length = holding(frames, path, intact, 30)
    assert sum(in_frame(e.offset, bad) for e in intact) == (6 if version == 3 else held)
    flip(path, offset + 9 + length // 2)

    _, status = read_all(directory, on_corruption="skip")
    assert status.lost == [LostRange(str(path), offset, offset + 9 + length, held, *steps)]


def test_garbage_after_a_clean_close_is_corruption_not_a_torn_tail(make_log) -> None:
    directory = make_log(60)
    (path,) = LogReader(directory).segments
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x07garbage")

    with pytest.raises(LogCorruptionError, match="trailing garbage after a clean close: 8 bytes") as err:
        read_all(directory)
    assert err.value.offset == size

    entries, status = read_all(directory, on_corruption="skip")
    assert len(entries) == 66 and not status.torn_tail and status.skipped_bytes == 8 and status.lost == []
    assert [c[:2] for c in status.corruptions] == [(str(path), size)]


@pytest.mark.parametrize(
    ("version", "lost"), [(1, "at least 45 records, steps 2..5"), (2, "at least 46 records, steps 2..6")]
)
def test_inspect_reports_a_mid_log_cut_as_lost_steps_not_a_clean_close(make_log, frames, capsys, version, lost) -> None:
    from sdc.cli import main

    directory = make_log(120, version=version)
    (path,) = LogReader(directory).segments
    intact, _ = read_all(directory)
    data = path.read_bytes()
    cut, resume = holding(frames, path, intact, 30)[0] + 12, holding(frames, path, intact, 70)[0] + 5
    path.write_bytes(data[:cut] + data[resume:])

    assert main(["inspect", str(directory.parent), "--skip-corrupt"]) == 0
    state = next(line for line in capsys.readouterr().out.splitlines() if "state" in line)
    assert "clean close" not in state and "DAMAGED" in state
    assert "lost: " in state and f"{lost} incomplete" in state


def test_inspect_does_not_call_garbage_after_end_a_clean_close(make_log, capsys) -> None:
    from sdc.cli import main

    directory = make_log(60)
    with open(LogReader(directory).segments[0], "ab") as f:
        f.write(b"\x07garbage")

    assert main(["inspect", str(directory.parent), "--skip-corrupt"]) == 0
    state = next(line for line in capsys.readouterr().out.splitlines() if "state" in line)
    assert "DAMAGED" in state and "trailing garbage after a clean close" in state
