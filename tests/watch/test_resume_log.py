"""A log continued after a crash reads as one timeline: the records of an uninterrupted run."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.watch.support import HEADER, step_records, uninterrupted, write_steps
from tracer.errors import UsageError
from tracer.log import EventRecord, LogReader, LogWriter, TornTailWarning
from tracer.log.resume import log_end
from tracer.log.sessions import RESUME, Resumption


def crash(directory: Path, steps: range, *, torn: bytes = b"", **kwargs) -> None:
    """Write `steps`, then half of the next step, and die: no END, the last segment ending in `torn`."""
    w = LogWriter(directory, HEADER, **kwargs)
    write_steps(w, steps)
    for rec in step_records(steps.stop)[:5]:
        w.write_tensor(rec)
    w.abandon()
    if torn:
        with open(sorted(directory.glob("*.sdclog"))[-1], "ab") as f:
            f.write(torn)


def resume(directory: Path, steps: range, **kwargs) -> None:
    """Continue from the checkpoint of `steps.start`, as `sdc record --resume` does, and finish."""
    end = log_end(directory)
    with LogWriter(
        directory, HEADER, resume=Resumption(end.segments, steps.start, end.records, end.last_step), **kwargs
    ) as w:
        write_steps(w, steps)


def timeline(directory: Path) -> tuple[list, LogReader]:
    reader = LogReader(directory)
    return [r for r in reader.records() if not (isinstance(r, EventRecord) and r.kind == RESUME)], reader


@pytest.mark.parametrize("segment_bytes", [64 << 20, 700])
def test_a_resumed_log_reads_as_the_uninterrupted_one(tmp_path: Path, segment_bytes: int) -> None:
    expected, _ = timeline(uninterrupted(tmp_path / "once", 12, segment_bytes=segment_bytes))
    log = tmp_path / "twice"
    crash(log, range(8), torn=b"\x40\x00\x00\x00\x12\x34", segment_bytes=segment_bytes)  # a frame cut short
    assert log_end(log).last_step == 7
    resume(log, range(5, 12), segment_bytes=segment_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TornTailWarning)  # the tear ended a session, not the log
        found, reader = timeline(log)
    assert found == expected
    assert reader.status.complete and not reader.status.torn_tail and not reader.status.corruptions
    assert reader.status.superseded == 3 * 13 + 1 + 5  # steps 5..7 with step 5's checkpoint, half of step 8
    (marker,) = [r for r in LogReader(log).records() if isinstance(r, EventRecord) and r.kind == RESUME]
    assert (marker.step, marker.fields["last_step"]) == (5, 7)


def test_a_log_resumed_twice_supersedes_from_the_earliest_later_checkpoint(tmp_path: Path) -> None:
    expected, _ = timeline(uninterrupted(tmp_path / "once", 16))
    log = tmp_path / "thrice"
    crash(log, range(8))
    end = log_end(log)
    w = LogWriter(log, HEADER, resume=Resumption(end.segments, 5, end.records))
    write_steps(w, range(5, 11))
    w.abandon()
    resume(log, range(10, 16))
    found, reader = timeline(log)
    assert found == expected and reader.status.complete


def test_a_resumption_must_continue_the_log_where_it_ends(tmp_path: Path) -> None:
    log = tmp_path / "log"
    crash(log, range(3))
    with pytest.raises(UsageError, match="cannot continue this log"):
        LogWriter(log, HEADER, resume=Resumption(5, 0, 0))
    with pytest.raises(UsageError, match="already holds a log"):
        LogWriter(log, HEADER)


def test_the_torn_end_of_a_session_still_counts_as_corruption_when_valid_frames_follow(tmp_path: Path) -> None:
    log = tmp_path / "log"
    crash(log, range(8), torn=b"\xff" * 40)  # no frame cut short: garbage
    resume(log, range(5, 10))
    from tracer.errors import LogCorruptionError

    with pytest.raises(LogCorruptionError):
        list(LogReader(log).records())


def test_segments_decoded_apart_give_the_same_timeline(tmp_path: Path) -> None:
    """What a parallel reader (the Beam pipelines) does: each segment alone, told what `Sessions` says of it."""
    from tracer.log import TensorRecord, check_chain, read_segment_columns
    from tracer.log.layout import list_segments
    from tracer.log.reader import find_sessions

    log = tmp_path / "log"
    crash(log, range(8), torn=b"\x40\x00\x00\x00\x12\x34", segment_bytes=900)
    resume(log, range(5, 12), segment_bytes=900)
    sessions = find_sessions(log)
    segments = list_segments(log)
    decoded = [
        read_segment_columns(
            path.read_bytes(),
            str(path),
            last=i == len(segments) - 1,
            session_end=sessions.ends_session(index),
            cutoff=sessions.cutoff(index),
        )
        for i, (index, path) in enumerate(segments)
    ]
    fingerprints = [int(fp) for seg in decoded for fp in seg.tensors.fingerprint]
    expected = [r.fingerprint for r in LogReader(log).records() if isinstance(r, TensorRecord)]
    assert fingerprints == expected
    assert not any(seg.status.corruptions or seg.status.torn_tail for seg in decoded)
    assert check_chain([seg.summary(index, str(path)) for seg, (index, path) in zip(decoded, segments)], str) == []
