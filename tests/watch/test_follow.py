"""Following a log while it is written: records once complete, never a bad CRC, the writer's end."""

from __future__ import annotations

import struct
import threading
import warnings
import zlib
from pathlib import Path

import pytest

from tests.watch.support import HEADER, step_records, steps_records, uninterrupted, write_steps
from tracer.errors import LogCorruptionError
from tracer.log import EventRecord, LogReader, LogWriter, LostRange, RecordType, TornTailWarning, rank_dir
from tracer.log.follow import LogFollower, Resumed
from tracer.log.resume import log_end
from tracer.log.runlock import RunLock
from tracer.log.segment import Entry
from tracer.log.sessions import Resumption


def records(items: list) -> list:
    return [i.record for i in items if isinstance(i, Entry)]


def event_frame(step: int, *, bad_crc: bool = False) -> bytes:
    import msgpack

    payload = msgpack.packb({"kind": "loss", "step": step, "fields": {"loss": 0.5}})
    crc = zlib.crc32(bytes([RecordType.EVENT]) + payload) ^ (1 if bad_crc else 0)
    return struct.pack("<IIB", len(payload), crc, RecordType.EVENT) + payload


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory whose writer (this test) holds the lock."""
    out = tmp_path / "run"
    out.mkdir()
    return out


def test_a_frame_written_in_pieces_is_yielded_once_complete_and_a_bad_crc_never(run: Path) -> None:
    lock = RunLock.acquire(run)
    w = LogWriter(rank_dir(run, 0), HEADER)
    write_steps(w, range(2))
    w.abandon()
    seg = rank_dir(run, 0) / "000000.sdclog"
    follower = LogFollower(rank_dir(run, 0), on_corruption="skip")
    assert records(follower.poll()) == steps_records(range(2))

    frame = event_frame(2)
    with open(seg, "ab") as f:
        f.write(frame[:5])  # inside the frame header
        f.flush()
        assert follower.poll() == [] and follower.state == "writing"
        f.write(frame[5:-3])  # the payload cut short
        f.flush()
        assert follower.poll() == []
        f.write(frame[-3:])
        f.flush()
        assert records(follower.poll()) == [EventRecord("loss", 2, {"loss": 0.5})]

        f.write(event_frame(3, bad_crc=True))  # complete, but its CRC fails: maybe a tail in progress
        f.flush()
        assert follower.poll() == [] and follower.poll() == []
        f.write(event_frame(4))  # a valid frame after it: it was corruption
        f.flush()
        lost, good = follower.poll()
    assert isinstance(lost, LostRange) and lost.records == 1 and (lost.first_step, lost.last_step) == (2, 4)
    assert good.record == EventRecord("loss", 4, {"loss": 0.5})
    assert follower.status.corruptions and "CRC mismatch" in follower.status.corruptions[0][2]

    with open(seg, "ab") as f:
        f.write(event_frame(5, bad_crc=True))
    assert follower.poll() == [] and follower.state == "writing"
    lock.release()  # the writer is gone: the bad frame at the end is no tail in progress
    (lost,) = follower.poll()
    assert isinstance(lost, LostRange) and lost.first_step == 4 and lost.last_step is None
    assert follower.state == "crashed" and not follower.status.torn_tail


def test_raise_mode_raises_at_a_bad_crc_once_a_valid_frame_follows(run: Path) -> None:
    lock = RunLock.acquire(run)
    with LogWriter(rank_dir(run, 0), HEADER) as w:
        write_steps(w, range(1))
        w.flush()
        follower = LogFollower(rank_dir(run, 0))
        assert records(follower.poll()) == steps_records(range(1))
        w._file.write(event_frame(1, bad_crc=True))  # a damaged record, as a disk might return it
        w._file.flush()
        assert follower.poll() == []
        w.write_event(EventRecord("loss", 1, {"loss": 0.5}))
        w.flush()
        with pytest.raises(LogCorruptionError, match="CRC mismatch"):
            follower.poll()
    lock.release()


def test_a_torn_tail_waits_while_the_writer_runs_and_ends_the_log_once_it_is_gone(run: Path) -> None:
    lock = RunLock.acquire(run)
    w = LogWriter(rank_dir(run, 0), HEADER)
    write_steps(w, range(3))
    w.abandon()
    with open(rank_dir(run, 0) / "000000.sdclog", "ab") as f:
        f.write(event_frame(3)[:-4])
    follower = LogFollower(rank_dir(run, 0))
    assert records(follower.poll()) == steps_records(range(3))
    assert follower.poll() == [] and follower.state == "writing"
    lock.release()
    with pytest.warns(TornTailWarning):
        assert follower.poll() == []
    assert follower.state == "crashed" and follower.status.torn_tail and not follower.status.complete


def test_following_a_writer_sees_every_record_across_segments_and_the_end(run: Path) -> None:
    lock = RunLock.acquire(run)
    writing = threading.Event()

    def write() -> None:
        with LogWriter(rank_dir(run, 0), HEADER, segment_bytes=900) as w:
            writing.set()
            write_steps(w, range(30))
        lock.release()

    writer = threading.Thread(target=write)
    writer.start()
    writing.wait()
    follower = LogFollower(rank_dir(run, 0), poll_bytes=300)  # small polls: a window often ends mid-record
    items = list(follower.follow(poll_s=0.001, idle_timeout_s=30))
    writer.join()
    assert len(list(rank_dir(run, 0).glob("*.sdclog"))) > 5
    assert records(items) == list(LogReader(rank_dir(run, 0)).records())
    assert follower.state == "finished" and follower.status.end.records == len(steps_records(range(30)))


def test_a_resumption_is_announced_and_its_records_follow(run: Path) -> None:
    lock = RunLock.acquire(run)
    w = LogWriter(rank_dir(run, 0), HEADER, segment_bytes=2000)
    write_steps(w, range(8))
    for rec in step_records(8)[:4]:
        w.write_tensor(rec)
    w.abandon()
    with open(sorted(rank_dir(run, 0).glob("*.sdclog"))[-1], "ab") as f:
        f.write(event_frame(8)[:7])  # torn
    lock.release()
    follower = LogFollower(rank_dir(run, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        before = follower.poll()
    assert follower.state == "crashed" and records(before) == steps_records(range(8)) + step_records(8)[:4]

    lock = RunLock.acquire(run)
    end = log_end(rank_dir(run, 0))
    w = LogWriter(
        rank_dir(run, 0), HEADER, segment_bytes=2000, resume=Resumption(end.segments, 5, end.records, end.last_step)
    )
    assert follower.state == "writing"
    write_steps(w, range(5, 10))
    w.close()
    lock.release()
    after = list(follower.follow(poll_s=0.001, idle_timeout_s=5))
    assert after[0] == Resumed(end.segments, 5, 7)
    assert records(after) == steps_records(range(5, 10))
    assert follower.state == "finished" and not follower.status.torn_tail and not follower.status.corruptions


def test_nothing_to_follow_yet(tmp_path: Path) -> None:
    follower = LogFollower(rank_dir(tmp_path / "none", 0))
    assert follower.poll() == [] and follower.state == "waiting"
    uninterrupted(rank_dir(tmp_path / "none", 0), 2)
    assert records(follower.poll()) == steps_records(range(2)) and follower.state == "finished"


def test_a_record_bigger_than_a_poll_is_read_whole(run: Path) -> None:
    with LogWriter(rank_dir(run, 0), HEADER) as w:
        w.write_event(EventRecord("note", 0, {"text": "x" * 5000}))
    follower = LogFollower(rank_dir(run, 0), poll_bytes=64)
    items = list(follower.follow(poll_s=0.001, idle_timeout_s=5))
    assert records(items) == [EventRecord("note", 0, {"text": "x" * 5000})]


def test_a_follower_started_after_a_resumption_yields_the_timeline(run: Path) -> None:
    w = LogWriter(rank_dir(run, 0), HEADER)
    write_steps(w, range(7))
    w.abandon()
    end = log_end(rank_dir(run, 0))
    with LogWriter(rank_dir(run, 0), HEADER, resume=Resumption(end.segments, 5, end.records, end.last_step)) as w:
        write_steps(w, range(5, 9))
    items = list(LogFollower(rank_dir(run, 0)).follow(poll_s=0.001, idle_timeout_s=5))
    timeline = [r for r in LogReader(rank_dir(run, 0)).records() if getattr(r, "kind", None) != "resume"]
    assert records(items) == steps_records(range(9)) == timeline
    late = list(LogFollower(rank_dir(run, 0), from_step=6).follow(poll_s=0.001, idle_timeout_s=5))
    assert records(late) == steps_records(range(6, 9))


@pytest.mark.parametrize("seed", range(6))
def test_a_log_appended_in_random_pieces_reads_as_the_reader_reads_it(tmp_path: Path, seed: int) -> None:
    """Whatever sizes the writer's chunks have, and with a damaged byte in the middle: the follower yields what
    LogReader yields, and loses what it loses."""
    import random

    rng = random.Random(seed)
    source = uninterrupted(tmp_path / "source" / "rank-00000", 12, segment_bytes=1500)
    data = {p.name: bytearray(p.read_bytes()) for p in sorted(source.glob("*.sdclog"))}
    if seed % 2:  # flip a byte inside a record of the second segment
        name = sorted(data)[1]
        data[name][len(data[name]) // 2] ^= 0x40
    if seed % 3 == 0:  # the writer dies mid-write: the last segment ends torn
        name = sorted(data)[-1]
        del data[name][rng.randint(len(data[name]) // 2, len(data[name]) - 1) :]
    run = tmp_path / "run"
    run.mkdir()
    lock = RunLock.acquire(run)
    rank_dir(run, 0).mkdir()
    follower = LogFollower(rank_dir(run, 0), on_corruption="skip", poll_bytes=rng.choice([64, 512, 1 << 20]))
    items = []
    for name, content in data.items():
        with open(rank_dir(run, 0) / name, "wb") as f:
            at = 0
            while at < len(content):
                step = rng.randint(1, 120)
                f.write(content[at : at + step])
                f.flush()
                at += step
                items += follower.poll()
    lock.release()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", TornTailWarning)
        items += list(follower.follow(poll_s=0.001, idle_timeout_s=0.2))
        reader = LogReader(rank_dir(run, 0), on_corruption="skip")
        assert records(items) == list(reader.records())
    assert len(warned) == 2 * reader.status.torn_tail and follower.status.torn_tail == reader.status.torn_tail
    assert follower.status.lost == reader.status.lost
    where = lambda r: (r.file, r.start, r.stop, r.first_step, r.last_step)  # noqa: E731 (counts may come later)
    assert [where(i) for i in items if isinstance(i, LostRange)] == [where(r) for r in reader.status.lost]
    assert follower.status.corruptions == reader.status.corruptions
    assert follower.state == ("crashed" if seed % 3 == 0 else "finished")
