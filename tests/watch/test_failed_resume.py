"""A `sdc record --resume` that fails (a checkpoint that no longer verifies, a full disk) leaves the crashed run
resumable: the failure is recorded in the log (a ``resume_failed`` event, no END), and a resume once the cause is
fixed gives the records of an uninterrupted run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.record import record_run, resume_step
from tests.support import small_config
from tests.watch.test_record_resume import DIES, STEPS, timeline
from tracer.compare import compare_runs
from tracer.errors import SdcError
from tracer.log import EventRecord, LogReader, rank_dir
from tracer.log.runlock import RunLock
from tracer.log.sessions import RESUME_FAILED

pytestmark = pytest.mark.slow  # records small runs, some in subprocesses that die or hit a file-size limit

# Resumes under a file-size limit, as a full disk would stop it: SIGXFSZ ignored, so writes fail with EFBIG.
FULL_DISK = """
import resource, signal, sys
from tests.support import small_config
from jobs.record import record_run
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
record_run(small_config(*sys.argv[3:]), sys.argv[1], node_label="node", progress=False, resume=True)
"""
ROOT = Path(__file__).parents[2]


def crashed(tmp_path: Path) -> tuple[Path, Path]:
    once, twice = tmp_path / "once", tmp_path / "twice"
    record_run(small_config(*STEPS), once, node_label="node", progress=False)
    assert subprocess.run([sys.executable, "-c", DIES, str(twice), *STEPS], cwd=ROOT).returncode == 9
    return once, twice


def failures(run: Path) -> list[EventRecord]:
    reader = LogReader(rank_dir(run, 0), on_corruption="skip")
    found = [r for r in reader.records() if isinstance(r, EventRecord) and r.kind == RESUME_FAILED]
    assert not reader.status.complete  # no END: the run can still be resumed
    return found


def resumes_to_the_uninterrupted_run(once: Path, twice: Path) -> None:
    summary = record_run(small_config(*STEPS), twice, node_label="node", progress=False, resume=True)
    assert summary.resumed_from is not None
    assert [r for r in timeline(twice) if not (isinstance(r, tuple) and r[0] == RESUME_FAILED)] == timeline(once)
    assert compare_runs(once, twice).first is None
    reader = LogReader(rank_dir(twice, 0))
    for _ in reader.records():
        pass
    assert reader.status.complete


def test_a_resume_from_a_tampered_checkpoint_fails_and_a_resume_after_restoring_it_succeeds(tmp_path: Path) -> None:
    once, twice = crashed(tmp_path)
    step = resume_step(twice, 1)
    tensors = twice / "checkpoints" / f"step-{step:06d}" / "rank-00000.safetensors"
    good = tensors.read_bytes()
    bad = bytearray(good)
    bad[-3] ^= 0x40  # a bit of the last tensor's data: its fingerprint no longer matches
    tensors.write_bytes(bytes(bad))
    with pytest.raises(SdcError):
        record_run(small_config(*STEPS), twice, node_label="node", progress=False, resume=True)
    [failed] = failures(twice)
    assert failed.step == step and failed.fields["rank"] == 0 and failed.fields["detail"]
    RunLock.acquire(twice).release()  # the failed resume left the folder unlocked
    tensors.write_bytes(good)
    resumes_to_the_uninterrupted_run(once, twice)
    assert [
        r.step
        for r in LogReader(rank_dir(twice, 0)).records()
        if isinstance(r, EventRecord) and r.kind == RESUME_FAILED
    ] == [step]  # kept in the timeline


def test_a_resume_on_a_full_disk_fails_and_a_resume_with_room_succeeds(tmp_path: Path) -> None:
    once, twice = crashed(tmp_path)
    full = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(twice), "20000", *STEPS], cwd=ROOT, capture_output=True, text=True
    )
    assert full.returncode != 0 and "File too large" in full.stderr, full.stderr[-2000:]
    failures(twice)  # the event itself may not have fitted; what matters is no END
    RunLock.acquire(twice).release()
    resumes_to_the_uninterrupted_run(once, twice)
