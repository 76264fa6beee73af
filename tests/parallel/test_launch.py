"""The launcher: a hung rank ends the job with one error instead of hanging it; it starts a bounded number of
ranks; the ranks it starts inherit the run directory's writer lock; they exit when it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs.launch import launch
from jobs.machine import max_local_ranks
from tracer.errors import CaptureError, UsageError
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


@pytest.mark.slow  # launches ranks
def test_the_workload_module_is_imported_once_before_the_fork_unless_its_import_starts_a_thread() -> None:
    # imported by the job's process, which forked both ranks
    pids = launch("tests.parallel.preloaded:imported_by", {}, 2, preload=["tests.parallel.preloaded"])
    assert pids[0][0] == pids[1][0] and {pids[0][0]} != {p[1] for p in pids}, pids
    # a thread started at import would be missing in the forked ranks: each rank imports that module itself
    ranks = launch("tests.parallel.preloaded:thread_alive", {}, 2, preload=["tests.parallel.thread_at_import"])
    assert all(by == pid and alive for by, pid, alive in ranks), ranks


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


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (an exited one nobody has reaped yet is a zombie: not running)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.slow  # launches ranks
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads process states from /proc")
def test_ranks_exit_when_their_launcher_is_killed(tmp_path: Path) -> None:
    # SIGKILL (or the out-of-memory killer) gives the launcher no chance to stop its ranks: they must notice.
    code = (
        "from jobs.launch import launch; "
        f"launch('tests.parallel.ranks:sleep_with_pid_file', {{'folder': {str(tmp_path)!r}}}, 2)"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE, text=True
    )
    pid_files = [tmp_path / f"rank-{r}.pid" for r in range(2)]
    ranks: list[int] = []
    try:
        assert _wait_for(lambda: all(f.is_file() and f.read_text() for f in pid_files), 120), "the ranks never started"
        ranks = [int(f.read_text()) for f in pid_files]
        assert all(_running(pid) for pid in ranks)
        # The launcher's folder holds the job's spec (naming this test's folder), left to rank 0 to remove.
        specs = Path(tempfile.gettempdir()).glob("sdc-launch-*/spec.json")
        (spec,) = [p for p in specs if str(tmp_path) in p.read_text()]
        # Forked from one process of the job's, itself forked from the launcher's zygote, which imported torch.
        parents = {_parent(pid) for pid in ranks}
        assert len(parents) == 1 and parents != {launcher.pid} and _parent(parents.pop()) != launcher.pid, parents
        launcher.kill()
        launcher.wait()
        assert _wait_for(lambda: not any(_running(pid) for pid in ranks), 30), "ranks outlived their launcher"
        lines = launcher.stderr.read().splitlines()  # the job's process and its ranks write there too
        assert [line for line in lines if not line.startswith("sdc: warning: ")] == [
            f"sdc: error: the launcher (pid {launcher.pid}) is gone; its 2 rank(s) stop, their logs left as a "
            "crash's (sdc record --resume continues a recording)"
        ]  # one line for the job, none per rank, no traceback
        assert not spec.parent.exists(), "the killed launcher's folder was left behind"
    finally:
        for pid in ranks:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()


@pytest.mark.slow  # launches ranks
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads process states from /proc")
def test_a_killed_job_process_is_named_as_such_in_one_line(tmp_path: Path) -> None:
    # Not "rank 0 failed: exited without a report": no rank failed, the process that forked them was killed.
    code = (
        "import sys\nfrom jobs.launch import launch\nfrom tracer.errors import SdcError\ntry:\n"
        f"    launch('tests.parallel.ranks:sleep_with_pid_file', {{'folder': {str(tmp_path)!r}}}, 2)\n"
        "except SdcError as e:\n    print(e)\n"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True
    )
    pid_files = [tmp_path / f"rank-{r}.pid" for r in range(2)]
    try:
        assert _wait_for(lambda: all(f.is_file() and f.read_text() for f in pid_files), 120), "the ranks never started"
        rank = int(pid_files[0].read_text())
        job = _parent(rank)
        os.kill(job, signal.SIGKILL)
        out, _ = launcher.communicate(timeout=60)
        assert out.splitlines() == [
            f"the job's process (pid {job}) was killed (SIGKILL) before any rank failed; its ranks were stopped with it"
        ]
    finally:
        if launcher.poll() is None:
            launcher.kill()
