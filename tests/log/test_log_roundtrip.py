"""Everything written reads back exactly: records, header, rolling, single segments, size."""

from __future__ import annotations

import dataclasses
import random
import struct
from pathlib import Path

import msgpack

from tracer.log import (
    EventRecord,
    LogReader,
    LogWriter,
    Phase,
    RecordType,
    RunHeader,
    TensorRecord,
    list_ranks,
    rank_dir,
    read_segment,
)


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_every_record_kind_round_trips(tmp_path: Path, header: RunHeader) -> None:
    tensors = [
        TensorRecord(0, 0, "embed", Phase.INPUT, 0, 0.0, 0.0, 0, 0, "int64[8,128]"),
        TensorRecord(7, 3, "layers.0.attention", Phase.FORWARD, 2**64 - 1, 1 / 3, 1e30, 5, 2, "float32[8,64,128]"),
        TensorRecord(2**31, 1, "layers.0.attention", Phase.BACKWARD, 2**63, float("inf"), 3.5, 0, 7, "bfloat16[8,64]"),
        TensorRecord(9, 0, "w", Phase.GRAD, 12345, 2.0, 1.0, 0, 0, "float32[]"),
        TensorRecord(9, 0, "w", Phase.PARAM, 1, 1e-20, 7.0, 0, 0, "float32[]"),
    ]
    events = [
        EventRecord("loss", 7, {"loss": 2.718281828459045, "microbatch": 3}),
        EventRecord("step", 8, {"lr": 3e-4, "nested": {"a": [1, 2.5, None, True, "x", b"\x00\xff"]}, "big": 2**64 - 1}),
        EventRecord("checkpoint", 9, {}),
    ]
    with LogWriter(tmp_path / "r", header) as w:
        for t in tensors[:3]:
            w.write_tensor(t)
        for e in events:
            w.write_event(e)
        for t in tensors[3:]:
            w.write_tensor(t)

    reader = LogReader(tmp_path / "r")
    got = list(reader.records())

    assert reader.header == header
    assert reader.header.config["optim"]["lr"] == 3e-4  # float64 in the header: exact
    expected_tensors = [dataclasses.replace(t, l2=f32(t.l2), absmax=f32(t.absmax)) for t in tensors]
    assert got == expected_tensors[:3] + events + expected_tensors[3:]
    assert all(type(r.phase) is Phase for r in got if isinstance(r, TensorRecord))
    assert reader.status.complete and not reader.status.torn_tail
    assert reader.status.end is not None and reader.status.end.status == "complete"
    assert reader.status.records == reader.status.end.records == len(got)
    assert reader.status.skipped_records == 0 and reader.status.corruptions == []


def test_entries_give_a_total_order(make_log) -> None:
    entries = list(LogReader(make_log(200, segment_bytes=1024)).entries())
    positions = [(e.segment, e.offset) for e in entries]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


def test_rolls_into_segments_each_decodable_alone(make_log, frames, header: RunHeader) -> None:
    directory = make_log(300, segment_bytes=1024)
    reader = LogReader(directory)
    whole = list(reader.entries())
    assert len(reader.segments) > 5
    assert reader.status.complete and reader.status.records == 330

    alone = []
    for i, path in enumerate(reader.segments):
        assert path.stat().st_size < 1024 + 200  # rolled once the size reached segment_bytes
        assert frames(path)[0][1] == RecordType.HEADER
        seg_header, seg_entries, status = read_segment(path.read_bytes(), str(path), last=i == len(reader.segments) - 1)
        assert seg_header == header
        got = list(seg_entries)
        assert {e.segment for e in got} == {i}
        assert status.first_record == len(alone)
        alone += got
        assert status.complete == (i == len(reader.segments) - 1)
    assert alone == whole


def test_string_ids_restart_in_every_segment(make_log, frames) -> None:
    directory = make_log(300, segment_bytes=1024)
    segments = LogReader(directory).segments
    for path in segments:
        data = path.read_bytes()
        ids = [msgpack.unpackb(data[o + 9 : o + 9 + n])[0] for o, t, n in frames(path) if t == RecordType.STRING]
        assert ids == list(range(len(ids))) and (ids or path == segments[-1]), path  # the last may hold events only


def test_tensor_records_cost_at_most_32_bytes(tmp_path: Path, header: RunHeader, frames) -> None:
    """A step as the Tracer records it: per microbatch the input, 24 sites forward then backward and a `loss` event;
    then 26 parameters' gradients and values, and the `step` event. Frames included, headers and strings apart."""
    rng = random.Random(0)
    sites = [f"layers.{i}.{k}" for i in range(12) for k in ("attention", "mlp")]
    params = [f"layers.{i}.{k}.weight" for i in range(12) for k in ("wq", "w1")] + ["embed.weight", "norm.weight"]
    n = 0
    with LogWriter(tmp_path / "r", header) as w:

        def tensor(step: int, mb: int, name: str, phase: Phase) -> None:
            nonlocal n
            w.write_tensor(
                TensorRecord(
                    step,
                    mb,
                    name,
                    phase,
                    rng.getrandbits(64),
                    rng.uniform(0, 1e4),
                    rng.uniform(0, 50),
                    0,
                    0,
                    "bfloat16[8,2048,4096]",
                )
            )
            n += 1

        for step in range(200):
            for mb in range(2):
                tensor(step, mb, "input", Phase.INPUT)
                for site in sites:
                    tensor(step, mb, site, Phase.FORWARD)
                for site in reversed(sites):
                    tensor(step, mb, site, Phase.BACKWARD)
                w.write_event(EventRecord("loss", step, {"microbatch": mb, "loss": 2.5}))
            for phase in (Phase.GRAD, Phase.PARAM):
                for name in params:
                    tensor(step, 0, name, phase)
            w.write_event(EventRecord("step", step, {"loss": 5.0, "lr": [1e-3], "wall_s": 0.1, "microbatches": 2}))
    (segment,) = LogReader(tmp_path / "r").segments
    holders = [
        (rtype, 9 + length)
        for _, rtype, length in frames(segment)
        if rtype in (RecordType.TENSOR, RecordType.TENSOR_BLOCK)
    ]
    assert {rtype for rtype, _ in holders} == {RecordType.TENSOR_BLOCK} and n == 200 * (2 * 49 + 52)
    assert sum(size for _, size in holders) / n <= 32, sum(size for _, size in holders) / n
    assert segment.stat().st_size / n <= 32  # the whole file: run header, strings and events too


def test_a_lone_record_is_a_tensor_record_and_blocks_are_bounded(tmp_path: Path, header: RunHeader, frames) -> None:
    # A block of one row would take more bytes than a TENSOR record; a block never holds more than BLOCK_ROWS.
    from tracer.log.writer import BLOCK_ROWS

    t = TensorRecord(0, 0, "w", Phase.GRAD, 7, 1.0, 1.0, 0, 0, "float32[]")
    with LogWriter(tmp_path / "r", header) as w:
        w.write_tensor(t)
        for step in (1, 2):
            for _ in range(BLOCK_ROWS + 1):
                w.write_tensor(dataclasses.replace(t, step=step))
    (segment,) = LogReader(tmp_path / "r").segments
    kinds = [rtype for _, rtype, _ in frames(segment)][3:-1]  # after the file's HEADER and 2 STRINGs, before END
    assert kinds == [RecordType.TENSOR] + [RecordType.TENSOR_BLOCK, RecordType.TENSOR] * 2
    assert list(LogReader(tmp_path / "r").records()) == [t] + [
        dataclasses.replace(t, step=s) for s in (1, 2) for _ in range(BLOCK_ROWS + 1)
    ]


def test_rank_dirs(tmp_path: Path, header: RunHeader) -> None:
    assert list_ranks(tmp_path / "missing") == []
    for rank in (3, 0, 12):
        LogWriter(rank_dir(tmp_path, rank), header).close()
    (tmp_path / "blobs").mkdir()
    assert rank_dir(tmp_path, 3) == tmp_path / "rank-00003"
    assert list_ranks(tmp_path) == [0, 3, 12]
