"""The columnar segment reader agrees with the reference reader, record for record and problem for problem."""

from __future__ import annotations

import math
import random
import struct
import warnings
from pathlib import Path

import msgpack
import numpy as np
import pytest

from tests.log.v3 import join_block, split_block
from tests.support import reframe
from tracer.errors import LogCorruptionError
from tracer.log import (
    EventRecord,
    LogReader,
    LogWriter,
    LostRange,
    Phase,
    RecordType,
    RunHeader,
    SegmentSummary,
    TensorRecord,
    chain_lost,
    check_chain,
    frame_scan,
    read_segment,
    read_segment_columns,
)
from tracer.log.columns import decode_clean
from tracer.log.framing import FRAME_SIZE, HEADER_SIZE
from tracer.log.layout import list_segments, segment_path
from tracer.log.records import MAX_MICROBATCH, MAX_STEP
from tracer.log.segment import LogStatus, Segment


def columnar(directory: Path, mode: str = "skip") -> tuple[list[tuple], list[tuple], list[tuple], bool, bool]:
    """(tensor records, events, problems, torn, complete) of a log read segment by segment into columns."""
    tensors, events, problems, summaries = [], [], [], []
    torn = complete = False
    segments = list_segments(directory)
    for i, (index, path) in enumerate(segments):
        seg = read_segment_columns(path.read_bytes(), str(path), last=i == len(segments) - 1, on_corruption=mode)
        t = seg.tensors
        for j in range(len(t)):
            tensors.append(
                (
                    index,
                    int(t.offset[j]),
                    int(t.step[j]),
                    int(t.microbatch[j]),
                    t.strings[t.name[j]],
                    Phase(int(t.phase[j])),
                    int(t.fingerprint[j]),
                    _f(t.l2[j]),
                    _f(t.absmax[j]),
                    int(t.nan[j]),
                    int(t.inf[j]),
                    t.strings[t.meta[j]],
                )
            )
        events += [(index, e.offset, e.record) for e in seg.events]
        problems += seg.status.corruptions
        torn, complete = seg.status.torn_tail, seg.status.complete
        summaries.append(
            SegmentSummary(index, str(path), seg.index, seg.status.first_record, seg.data_records, seg.lost)
        )
    problems += check_chain(summaries, lambda i: str(segment_path(directory, i)))
    return tensors, events, sorted(problems), torn, complete


def reference(directory: Path) -> tuple[list[tuple], list[tuple], list[tuple], bool, bool]:
    reader = LogReader(directory, on_corruption="skip")
    tensors, events = [], []
    for e in reader.entries():
        r = e.record
        if isinstance(r, TensorRecord):
            tensors.append(
                (
                    e.segment,
                    e.offset,
                    r.step,
                    r.microbatch,
                    r.name,
                    r.phase,
                    r.fingerprint,
                    _f(r.l2),
                    _f(r.absmax),
                    r.nan,
                    r.inf,
                    r.meta,
                )
            )
        else:
            events.append((e.segment, e.offset, r))
    s = reader.status
    return tensors, events, sorted(s.corruptions), s.torn_tail, s.complete


def _f(x: float) -> float | str:
    return "nan" if math.isnan(x) else float(x)


def same(directory: Path) -> tuple[list[tuple], list[tuple], list[tuple], bool, bool]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, got = reference(directory), columnar(directory)
        assert lost_apart(directory) == lost_in_order(directory)
    assert got == expected
    return got


def lost_in_order(directory: Path) -> list[LostRange]:
    reader = LogReader(directory, on_corruption="skip")
    for _ in reader.entries():
        pass
    return reader.status.lost


def lost_apart(directory: Path) -> list[LostRange]:
    """What corruption hid, from segments decoded apart and put together by `chain_lost`."""
    segments = list_segments(directory)
    summaries = [
        read_segment_columns(path.read_bytes(), str(path), last=i == len(segments) - 1, on_corruption="skip").summary(
            index, str(path)
        )
        for i, (index, path) in enumerate(segments)
    ]
    return chain_lost(summaries, lambda i: str(segment_path(directory, i)))


def test_what_corruption_hid_agrees_across_segments(make_log, frames) -> None:
    # A bad region at the head of a segment and a missing segment file: only the neighbouring
    # segments know the steps and, through their HEADERs, the records lost.
    log = make_log(600, segment_bytes=4_000)
    (log / "000003.sdclog").unlink()
    seg = log / "000001.sdclog"
    pos = frames(seg)[1][0]  # its first STRING, then the records using it
    data = bytearray(seg.read_bytes())
    data[pos + 10] ^= 0x01
    seg.write_bytes(bytes(data))
    same(log)
    lost = lost_in_order(log)
    gap = next(r for r in lost if r.file.endswith("000003.sdclog"))
    assert gap.records > 0 and None not in (gap.first_step, gap.last_step) and gap.first_step <= gap.last_step


@pytest.mark.parametrize("version", [1, 2, 3])
def test_clean_multi_segment_log_matches_the_reference(make_log, version: int) -> None:
    log = make_log(3000, segment_bytes=20_000, version=version)
    tensors, events, problems, torn, complete = same(log)
    assert len(tensors) == 3000 and len(events) == 300 and not problems and complete and not torn
    for i, (_, path) in enumerate(segments := list_segments(log)):  # each clean segment takes the array path
        data = path.read_bytes()
        status = LogStatus()
        seg = Segment(data, str(path), last=i == len(segments) - 1, skip=False, status=status)
        assert decode_clean(data, seg, last=i == len(segments) - 1) is not None, path


def test_every_encoding_the_writer_can_produce(tmp_path: Path, header: RunHeader, frames) -> None:
    """Blocks of one record (a TENSOR record) to hundreds; columns of every width (all zero, 1, 2, 4 and 8 bytes) up to
    the bounds; steps up to MAX_STEP, tiny and huge fingerprints, special floats, repeated and unicode names."""
    rng = random.Random(3)
    values = [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1]
    step, wide = 0, True
    with LogWriter(tmp_path / "rank-00000", header) as w:
        for i in range(3000):
            if rng.random() < 0.1:  # a new step: a new block, of 10 records on average
                step, wide = rng.choice([v for v in values if v <= MAX_STEP] + [MAX_STEP]), rng.random() < 0.5
            w.write_tensor(
                TensorRecord(
                    step=step,
                    microbatch=rng.choice([v for v in values if v <= MAX_MICROBATCH] + [MAX_MICROBATCH]) if wide else 0,
                    name=rng.choice(["layers.0.attention", "ünïcode.site", "x" * 300]),
                    phase=Phase(rng.randrange(5)) if wide else Phase.FORWARD,
                    fingerprint=rng.choice(values + [2**64 - 1, rng.getrandbits(64)]) if wide else rng.randrange(256),
                    l2=rng.choice([0.0, -0.0, 1.5, float("inf"), float("nan"), 3.4e38, 1e-45, 1e39, -1e300]),
                    absmax=rng.uniform(-1e6, 1e6),
                    nan=rng.choice(values) if wide else 0,
                    inf=rng.choice(values) if wide else 0,
                    meta=rng.choice(["bfloat16[8,64,128]", "float32[]"]),
                )
            )
            if i % 97 == 0:
                w.write_event(EventRecord("step", i, {"loss": None, "lr": [1e-3], "nested": {"a": [1, 2]}}))
    log = tmp_path / "rank-00000"
    tensors, events, problems, _, complete = same(log)
    assert len(tensors) == 3000 and len(events) == 31 and not problems and complete
    assert {t[7] for t in tensors} >= {math.inf, -math.inf, "nan"}  # beyond float32: inf, as msgpack's float32 did
    types = {rtype for _, rtype, _ in frames(log / "000000.sdclog")}
    assert {RecordType.TENSOR, RecordType.TENSOR_BLOCK} <= types


def test_flipped_payload_byte_is_reported_with_file_and_offset(make_log, frames) -> None:
    log = make_log(400, segment_bytes=8_000)
    seg = log / "000001.sdclog"
    pos, _, _ = frames(seg)[10]
    data = bytearray(seg.read_bytes())
    data[pos + 12] ^= 0x40
    seg.write_bytes(bytes(data))
    _, _, problems, _, _ = same(log)
    assert problems[0][:2] == (str(seg), pos) and "CRC mismatch" in problems[0][2]
    with pytest.raises(LogCorruptionError) as err:
        read_segment_columns(seg.read_bytes(), str(seg), last=False)
    assert (err.value.path, err.value.offset) == (str(seg), pos)


def test_lost_string_record(make_log, frames) -> None:
    log = make_log(100)
    seg = log / "000000.sdclog"
    pos = next(p for p, rtype, _ in frames(seg) if rtype == 2)
    data = bytearray(seg.read_bytes())
    data[pos + 10] ^= 0x01
    seg.write_bytes(bytes(data))
    _, _, problems, _, _ = same(log)
    assert len(problems) > 1  # the STRING record, then each record that used its id


def test_torn_tail(make_log, frames) -> None:
    log = make_log(200, close=False)
    seg = log / "000000.sdclog"
    seg.write_bytes(seg.read_bytes()[: frames(seg)[-1][0] + 5])
    tensors, events, problems, torn, complete = same(log)
    assert torn and not complete and not problems and (len(tensors), len(events)) == (200, 19)


def test_missing_and_truncated_segments_are_found_between_segments(make_log, frames) -> None:
    log = make_log(600, segment_bytes=3_000)
    (log / "000002.sdclog").unlink()
    seg = log / "000004.sdclog"
    seg.write_bytes(seg.read_bytes()[: frames(seg)[-3][0]])  # cut exactly at a record boundary
    _, _, problems, _, _ = same(log)
    reasons = " ".join(p[2] for p in problems)
    assert "segment file missing" in reasons and "records are missing from the end" in reasons


def test_values_beyond_the_bounds_are_reported_by_both_readers(tmp_path: Path, header: RunHeader, frames) -> None:
    with LogWriter(tmp_path / "rank-00000", header) as w:
        for step, fp in ((1, 1), (2, 2), (3, 5)):  # a record per step: TENSOR records
            w.write_tensor(TensorRecord(step, 0, "a", Phase.FORWARD, fp, 0.0, 0.0, 0, 0, "m"))
    path = tmp_path / "rank-00000" / "000000.sdclog"
    first, second = [f[0] for f in frames(path) if f[1] == RecordType.TENSOR][:2]
    reframe(path, second, msgpack.packb([1, 0, 0, 0, -1, 0.0, 0.0, 0, 0, 1], use_single_float=True))
    reframe(path, first, msgpack.packb([2**63, 0, 0, 0, 1, 0.0, 0.0, 0, 0, 1], use_single_float=True))
    seg = read_segment_columns(path.read_bytes(), str(path), last=True, on_corruption="skip")
    assert len(seg.tensors) == 1 and int(seg.tensors.fingerprint[0]) == 5
    reasons = [reason for _, _, reason in seg.status.corruptions]
    assert reasons[0].startswith(f"TENSOR field 'step' must be an int in 0..{MAX_STEP}, found int 9223372036854775808")
    assert reasons[1].startswith("TENSOR field 'fingerprint' must be an unsigned 64-bit int, found int -1")
    _, entries, status = read_segment(path.read_bytes(), str(path), last=True, on_corruption="skip")
    assert len(list(entries)) == 1 and [r for _, _, r in status.corruptions] == reasons


def test_block_values_beyond_the_bounds_are_reported_by_both_readers(tmp_path: Path, header: RunHeader, frames):
    with LogWriter(tmp_path / "rank-00000", header) as w:
        for step in (1, 2):
            for fp in range(3):
                w.write_tensor(TensorRecord(step, 0, "a", Phase.FORWARD, fp, 0.0, 0.0, 0, 0, "m"))
    path = tmp_path / "rank-00000" / "000000.sdclog"
    first = next(f[0] for f in frames(path) if f[1] == RecordType.TENSOR_BLOCK)
    data = path.read_bytes()
    block = split_block(data[first + 9 : first + 9 + struct.unpack_from("<I", data, first)[0]])
    block[8] = struct.pack("<3Q", 0, 2**63, 0)  # nan: beyond int64
    reframe(path, first, join_block(block))
    seg = read_segment_columns(path.read_bytes(), str(path), last=True, on_corruption="skip")
    assert seg.tensors.step.tolist() == [2, 2, 2] and seg.tensors.fingerprint.tolist() == [0, 1, 2]
    reasons = [reason for _, _, reason in seg.status.corruptions]
    assert reasons == [f"TENSOR_BLOCK field 'nan' must be an int in 0..{2**63 - 1}, found {2**63} in row 1"]
    (lost,) = seg.status.lost
    assert (lost.start, lost.records) == (first, 3)
    _, entries, status = read_segment(path.read_bytes(), str(path), last=True, on_corruption="skip")
    assert len(list(entries)) == 3 and [r for _, _, r in status.corruptions] == reasons and status.lost == [lost]


def chains(directory: Path) -> list:
    """Per segment, `frame_scan.frame_chain` after its HEADER: offsets and ends as lists, or None."""
    out = []
    for _, path in list_segments(directory):
        raw = np.frombuffer(path.read_bytes(), np.uint8)
        start = HEADER_SIZE + FRAME_SIZE + int.from_bytes(raw[HEADER_SIZE : HEADER_SIZE + 4].tobytes(), "little")
        found = frame_scan.frame_chain(raw, start)
        out.append(None if found is None else [a.tolist() for a in found])
    return out


def test_both_ways_to_find_the_frames_agree(make_log, frames, monkeypatch) -> None:
    """Frames followed one by one (`_walk`, for large records) and the scan over every byte find the same frames
    in clean and damaged segments, and the reader agrees with the reference either way."""
    logs = [make_log(500, segment_bytes=6_000, version=version, name=f"clean-v{version}") for version in (1, 2)]
    damaged = make_log(600, segment_bytes=4_000, name="damaged")
    for segment, frame, byte in (("000000", 5, 1), ("000001", 8, 8), ("000002", 3, 3)):  # length, type, length
        seg = damaged / f"{segment}.sdclog"
        data = bytearray(seg.read_bytes())
        data[frames(seg)[frame][0] + byte] ^= 0x10
        seg.write_bytes(bytes(data))
    torn = make_log(200, close=False, name="torn")
    seg = torn / "000000.sdclog"
    seg.write_bytes(seg.read_bytes()[: frames(seg)[-1][0] + 5])
    logs += [damaged, torn]
    found = {}
    for walk_bytes in (1, 1 << 40):  # every chain followed / every chain scanned
        monkeypatch.setattr(frame_scan, "_WALK_BYTES", walk_bytes)
        found[walk_bytes] = [chains(log) for log in logs]
        results = [same(log) for log in logs]
        assert results[2][2] and results[3][3]  # problems in the damaged log, a torn tail
    assert found[1] == found[1 << 40]
    assert None in found[1][2] and None in found[1][3] and None not in found[1][0] + found[1][1]


@pytest.mark.parametrize("cut", [8, 20, "header-record"])
def test_a_first_segment_whose_header_is_cut_counts_its_records_from_the_next_header(make_log, frames, cut) -> None:
    """Issue 31, case 5: segment 0's HEADER lost (the file cut inside its file header or its HEADER record damaged),
    `--skip-corrupt` said "at least 0 records lost"; segment 1's HEADER counts the records before it, and segment 0
    starts at record 0 by definition, so the loss is exact, the same read in order and read apart."""
    log = make_log(600, segment_bytes=4_000)
    first, second = list_segments(log)[0][1], list_segments(log)[1][1]
    held = sum(1 for e in LogReader(log).entries() if e.segment == 0)
    data = bytearray(first.read_bytes())
    if cut == "header-record":
        data[16 + 9 + frames(first)[0][2] // 2] ^= 0x01  # inside the HEADER record's payload
        first.write_bytes(bytes(data))
    else:
        first.write_bytes(bytes(data[:cut]))
    read = sum(1 for e in LogReader(log, on_corruption="skip").entries() if e.segment == 0)
    assert held > 80 and second.exists() and (read == 0) == (cut != "header-record")
    for lost in (lost_in_order(log), lost_apart(log)):
        assert sum(r.records for r in lost if r.file == str(first)) == held - read, lost
