"""The writer's contract: one log per directory, clean and failed closes, no unreadable records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tracer.errors import UsageError
from tracer.log import EventRecord, LogReader, LogWriter, Phase, RunHeader, TensorRecord
from tracer.log.records import MAX_DEPTH, MAX_STEP

T = TensorRecord(1, 0, "layers.0.mlp", Phase.FORWARD, 42, 1.0, 1.0, 0, 0, "float32[4]")


def test_refuses_a_directory_that_holds_a_log(make_log, header: RunHeader) -> None:
    directory = make_log(5)
    with pytest.raises(UsageError, match=str(directory)):
        LogWriter(directory, header)


def test_context_manager_records_a_failed_run(tmp_path: Path, header: RunHeader) -> None:
    with pytest.raises(RuntimeError, match="loss is nan"):
        with LogWriter(tmp_path / "r", header) as w:
            w.write_tensor(T)
            raise RuntimeError("loss is nan")
    reader = LogReader(tmp_path / "r")
    assert list(reader.records()) == [T]
    assert reader.status.complete
    assert reader.status.end is not None
    assert (reader.status.end.status, reader.status.end.detail) == ("failed", "RuntimeError: loss is nan")


def test_flush_makes_records_readable_before_close(tmp_path: Path, header: RunHeader) -> None:
    w = LogWriter(tmp_path / "r", header)
    w.write_tensor(T)
    w.flush(fsync=True)
    reader = LogReader(tmp_path / "r")
    assert list(reader.records()) == [T] and not reader.status.complete
    w.close()


def test_closed_writer_refuses_records_and_closes_idempotently(tmp_path: Path, header: RunHeader) -> None:
    w = LogWriter(tmp_path / "r", header)
    w.close()
    w.close()
    w.abandon()
    with pytest.raises(UsageError, match="closed"):
        w.write_tensor(T)
    with pytest.raises(UsageError, match="closed"):
        w.flush()
    assert LogReader(tmp_path / "r").header == header


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "event",
    [
        EventRecord("loss", 1, {"loss": object()}),
        EventRecord("loss", 1, {1: "int keys do not read back"}),
        EventRecord("loss", 1, {"too_big": 2**64}),
        EventRecord("loss", 1.5, {}),
        EventRecord("loss", 1, ["not", "a", "dict"]),
        EventRecord("loss", True, {}),
        EventRecord("loss", MAX_STEP + 1, {}),
        EventRecord("loss", 1, {"text": "\ud800"}),  # a lone surrogate: not UTF-8
        EventRecord("loss", 1, {"deep": nested(MAX_DEPTH + 1)}),
        EventRecord("loss", 1, {"rows": [{2: "an int key one level down"}]}),
    ],
)
def test_refuses_events_that_would_not_read_back(tmp_path: Path, header: RunHeader, event: EventRecord) -> None:
    with LogWriter(tmp_path / "r", header) as w:
        with pytest.raises(UsageError, match="event 'loss'"):
            w.write_event(event)
        w.write_event(EventRecord("loss", 1, {"loss": 0.5}))  # the writer is still usable
    assert list(LogReader(tmp_path / "r").records()) == [EventRecord("loss", 1, {"loss": 0.5})]


ABFT_EVENT = EventRecord(
    "abft",
    3,
    {
        "microbatch": 0,
        "op": "aten.mm.default",
        "shape": [512, 128, 384],
        "residual": 1e-5,
        "verdict": "ok",
        "bound": float("inf"),
        "none": None,
        "no": False,
    },
)
EDGES = EventRecord("loss", 0, {"loss": -(2**63), "big": 2**64 - 1, "empty": [], "mixed": [1, "a", None, 2.5, True]})
BLOB = EventRecord("blob", 1, {"microbatch": 0, "name": "w", "phase": 1, "fingerprint": 7})


@pytest.mark.parametrize(
    ("event", "undecoded", "read"),
    [
        (ABFT_EVENT, True, ABFT_EVENT),
        (EDGES, True, EDGES),
        (EventRecord("step", MAX_STEP, {}), True, EventRecord("step", MAX_STEP, {})),
        (BLOB, False, BLOB),  # a kind whose fields have a schema: always decoded
        (
            EventRecord("loss", 1, {"pair": (1, 2), "raw": b"\x00"}),
            False,  # decoded: a tuple reads back as a list
            EventRecord("loss", 1, {"pair": [1, 2], "raw": b"\x00"}),
        ),
    ],
)
def test_events_the_writer_does_not_decode_read_back_as_written(
    tmp_path: Path, header: RunHeader, event: EventRecord, undecoded: bool, read: EventRecord
) -> None:
    from tracer.log.codec import reads_back

    assert reads_back(event) is undecoded
    with LogWriter(tmp_path / "r", header) as w:
        w.write_event(event)
    assert list(LogReader(tmp_path / "r").records()) == [read]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dataclasses.replace(T, name=None), "name and meta must be str"),
        (dataclasses.replace(T, meta=b"float32"), "name and meta must be str"),
        (dataclasses.replace(T, fingerprint=2**64), "unsigned 64 bits"),
        (dataclasses.replace(T, fingerprint=-1), "unsigned 64 bits"),
        (dataclasses.replace(T, step=-1), "step must be an int in 0.."),
        (dataclasses.replace(T, step=True), "step must be an int in 0.."),
        (dataclasses.replace(T, microbatch=1.0), "microbatch in 0.."),
        (dataclasses.replace(T, phase=7), "phase a Phase"),
        (dataclasses.replace(T, l2=1), "l2 and absmax floats"),
        (dataclasses.replace(T, absmax="big"), "l2 and absmax floats"),
        (dataclasses.replace(T, nan=-3), "nan and inf counts"),
        (dataclasses.replace(T, inf=2**63), "nan and inf counts"),
    ],
)
def test_refuses_tensor_records_that_cannot_be_stored(tmp_path: Path, header: RunHeader, bad, message: str) -> None:
    # Refused where it is written, not when its block is: the records around it are stored.
    with LogWriter(tmp_path / "r", header) as w:
        w.write_tensor(T)
        with pytest.raises(UsageError, match=message):
            w.write_tensor(bad)
        w.write_tensor(T)
    assert list(LogReader(tmp_path / "r").records()) == [T, T]


def test_blocks_keep_the_order_of_records_through_events_flushes_and_abandon(tmp_path: Path, header: RunHeader):
    t = [dataclasses.replace(T, fingerprint=i, microbatch=i % 3) for i in range(9)]
    e = EventRecord("loss", 1, {"loss": 0.5})
    w = LogWriter(tmp_path / "r", header)
    for rec in (t[0], t[1], e, t[2], t[3], t[4]):
        w.write_event(rec) if rec is e else w.write_tensor(rec)
    w.flush()  # the block being filled is written: a crash from now on loses none of these
    assert list(LogReader(tmp_path / "r").records()) == [t[0], t[1], e, t[2], t[3], t[4]]
    for rec in t[5:]:
        w.write_tensor(rec)
    w.abandon()  # no END, but every record written before
    reader = LogReader(tmp_path / "r")
    assert list(reader.records()) == [t[0], t[1], e, *t[2:]] and not reader.status.complete


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"config": {"steps": {1, 2}}}, "cannot be stored"),
        ({"config": {0: "int key"}}, "cannot be stored"),
        ({"seed": "1234"}, "'seed' must be int"),
    ],
)
def test_refuses_a_header_that_would_not_read_back(tmp_path: Path, header: RunHeader, change, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        LogWriter(tmp_path / "r", dataclasses.replace(header, **change))
    assert not (tmp_path / "r").exists()  # checked before anything is created


def test_counts_what_it_wrote(tmp_path: Path, header: RunHeader) -> None:
    w = LogWriter(tmp_path / "r", header, segment_bytes=512)
    for _ in range(100):
        w.write_tensor(T)
    w.write_event(EventRecord("step", 0, {}))
    w.close()
    reader = LogReader(tmp_path / "r")
    assert w.records_written == 101
    assert w.segment_index == len(reader.segments) - 1 > 0
    assert w.bytes_written == sum(p.stat().st_size for p in reader.segments)


def test_header_at_first_flush_writes_the_header_as_it_stands_then(tmp_path: Path, header: RunHeader) -> None:
    from tracer.log.writer import HeaderAtFirstFlush

    extra: dict = {}
    w = HeaderAtFirstFlush(tmp_path / "r", lambda: dataclasses.replace(header, extra={**header.extra, **extra}))
    w.write_tensor(T)
    with pytest.raises(UsageError, match="cannot be stored"):  # a bad event fails where it is written
        w.write_event(EventRecord("loss", 1, {"loss": object()}))
    assert (tmp_path / "r").is_dir() and not any((tmp_path / "r").iterdir())  # nothing written before the flush
    extra["sites_without_backward"] = {"emb": "no float input"}
    w.flush()
    w.write_event(EventRecord("step", 1, {}))
    w.close()
    reader = LogReader(tmp_path / "r")
    assert list(reader.records()) == [T, EventRecord("step", 1, {})] and reader.status.complete
    assert reader.header.extra["sites_without_backward"] == {"emb": "no float input"}


def test_header_at_first_flush_refuses_a_taken_directory_or_bad_header_at_once(
    make_log, header: RunHeader, tmp_path: Path
) -> None:
    from tracer.log.writer import HeaderAtFirstFlush

    with pytest.raises(UsageError, match="already holds a log"):
        HeaderAtFirstFlush(make_log(5), lambda: header)
    with pytest.raises(UsageError, match="cannot be stored"):
        HeaderAtFirstFlush(tmp_path / "new", lambda: dataclasses.replace(header, config={0: "int key"}))
    w = HeaderAtFirstFlush(tmp_path / "abandoned", lambda: header)
    w.write_tensor(T)
    w.abandon()  # before the first flush: no log is left
    assert not any((tmp_path / "abandoned").iterdir())
