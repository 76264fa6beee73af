"""The launcher: a hung rank ends the job with one error instead of hanging it; it starts a bounded number of
ranks; the ranks it starts inherit the run directory's writer lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracer.errors import CaptureError, UsageError
from jobs.launch import launch
from jobs.machine import max_local_ranks
from tracer.log import claim_out_dir


def test_no_more_ranks_start_than_the_machine_runs() -> None:
    with pytest.raises(UsageError, match=f"this machine runs at most {max_local_ranks()} "):
        launch("tests.parallel.ranks:no_such_target", {}, max_local_ranks() + 1, timeout_s=5)


@pytest.mark.slow  # launches ranks
def test_launched_ranks_inherit_the_writer_lock(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with claim_out_dir(out, role="train", overwrite=False) as lock:
        assert launch("tests.parallel.ranks:claim_on_rank_0", {"out": str(out)}, 2, lock=lock) == ["claimed"] * 2
        with pytest.raises(UsageError, match=r"^rank 0: .*run: another process \(pid \d+\) is writing this run"):
            launch("tests.parallel.ranks:claim_on_rank_0", {"out": str(out)}, 1)  # without the lock


@pytest.mark.slow  # launches ranks and waits out a collective timeout
def test_a_hung_rank_fails_the_job_after_the_collective_timeout() -> None:
    with pytest.raises(CaptureError, match=r"^rank 0 failed: RuntimeError: .*[Tt]imed out") as err:
        launch("tests.parallel.ranks:hang_on_rank_1", {}, 2, timeout_s=3)
    assert "\n" not in str(err.value)


@pytest.mark.slow  # launches ranks
def test_rank_0_of_a_torchrun_job_holds_the_writer_lock_while_it_traces(tmp_path: Path) -> None:
    from tracer.log import rank_dir
    from tracer.log.follow import LogFollower

    out = tmp_path / "run"
    assert launch("tests.parallel.ranks:trace_in_torchrun", {"out": str(out), "crash": False}, 2) == [True, True]
    assert LogFollower(rank_dir(out, 0)).writer_alive() is False  # released at the clean close
    crashed = tmp_path / "crashed"
    with pytest.raises(CaptureError, match="rank 0 failed"):
        launch("tests.parallel.ranks:trace_in_torchrun", {"out": str(crashed), "crash": True}, 2, timeout_s=20)
    # A crashed writer, not one whose state is unknown: `sdc watch` stops waiting for it.
    assert LogFollower(rank_dir(crashed, 0)).writer_alive() is False
