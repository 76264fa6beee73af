"""Claiming a run directory (`claim_out_dir`): what it refuses, what it deletes, and its writer lock."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.support import hold_run_dir
from tracer.checkpoint import list_checkpoints
from tracer.errors import UsageError
from tracer.log import claim_out_dir, list_ranks
from tracer.log.layout import LOCK_FILE


def _intact(run: Path) -> bool:
    return list_ranks(run) == [0] and list_checkpoints(run) != []


@pytest.mark.parametrize("where", ["same", "inside", "holds"])
def test_an_input_of_the_command_is_never_the_output(run_factory, where: str) -> None:
    golden = run_factory("golden")
    out = {"same": golden, "inside": golden / "sub", "holds": golden.parent}[where]
    with pytest.raises(UsageError, match="the input run .*nothing was deleted"):
        claim_out_dir(out, role="train", overwrite=True, inputs=(golden,))
    assert _intact(golden)


def test_a_file_sdctrace_did_not_write_inside_a_run_is_named_and_nothing_deleted(run_factory) -> None:
    run = run_factory("golden")
    notes = run / "checkpoints" / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(UsageError, match=r"holds checkpoints/notes\.txt, which sdctrace did not write"):
        claim_out_dir(run, role="train", overwrite=True)
    assert _intact(run) and notes.read_text() == "mine"


def test_another_kind_of_run_is_not_replaced(run_factory) -> None:
    run = run_factory("golden")
    with pytest.raises(UsageError, match="holds a recording, and this command writes a replay log"):
        claim_out_dir(run, role="replay", overwrite=True)
    assert _intact(run)


def test_what_a_start_up_kill_left_is_recorded_over_without_overwrite(run_factory) -> None:
    run = run_factory("golden")
    for segment in (run / "rank-00000").iterdir():  # killed before its header went out: checkpoints, no log
        segment.unlink()
    unclaimed = run.parent / "unclaimed"
    shutil.copytree(run, unclaimed)
    (unclaimed / LOCK_FILE).unlink()  # the same data without sdctrace's claim: nothing says what wrote it
    with pytest.raises(UsageError, match="no log that says which kind of run they belong to; nothing was deleted"):
        claim_out_dir(unclaimed, role="train", overwrite=False)
    assert list_checkpoints(unclaimed) != []
    with claim_out_dir(run, role="train", overwrite=False):
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]


def test_overwrite_replaces_only_what_sdctrace_wrote_and_keeps_the_lock_file(run_factory) -> None:
    run = run_factory("golden")
    with claim_out_dir(run, role="train", overwrite=True):
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]


def test_a_run_another_process_writes_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    holder = hold_run_dir(out)
    try:
        for overwrite in (False, True):
            with pytest.raises(UsageError, match=f"another process \\(pid {holder.pid}\\) is writing this run"):
                claim_out_dir(out, role="train", overwrite=overwrite)
    finally:
        holder.communicate("")
    with claim_out_dir(out, role="train", overwrite=False):  # released when the holder ended
        pass


def test_a_crashed_writer_leaves_no_lock(tmp_path: Path) -> None:
    out = tmp_path / "run"
    holder = hold_run_dir(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate()
    with claim_out_dir(out, role="train", overwrite=False):
        pass


def test_an_out_under_a_regular_file_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "somefile").write_text("x")
    with pytest.raises(UsageError, match=r"somefile is a file, not a directory\); choose another --out$"):
        claim_out_dir(tmp_path / "somefile" / "run", role="train", overwrite=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_an_out_in_a_read_only_directory_is_a_one_line_error(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(UsageError, match="no permission to write in .*ro; choose another --out"):
            claim_out_dir(locked / "run", role="train", overwrite=False)
    finally:
        locked.chmod(0o700)


def test_a_run_is_reclaimed_to_resume_it_as_it_is(run_factory, tmp_path: Path) -> None:
    from tracer.log.claim import reclaim_out_dir

    run = run_factory("golden")
    leftover = run / "checkpoints" / "step-000002" / ".tmpAb12Cd"  # what safetensors leaves when killed mid-save
    leftover.write_bytes(b"half a checkpoint")
    with reclaim_out_dir(run, role="train"):
        assert _intact(run) and leftover.exists()
        with pytest.raises(UsageError, match="another process"):
            reclaim_out_dir(run, role="train")
    with pytest.raises(UsageError, match="holds a recording, and this command writes a replay log"):
        reclaim_out_dir(run, role="replay")
    with pytest.raises(UsageError, match="no run to resume there"):
        reclaim_out_dir(tmp_path / "nothing", role="train")
