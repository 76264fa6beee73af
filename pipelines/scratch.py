"""The folders a diff makes for itself and removes: its staging directory's default, and Beam's temporary folders.

    staging = scratch_dir(db.parent, "staging")   # .sdc-diff-staging-<pid>-<random>
    with beam_temp():                             # Beam's local runners write their temporary folders here
        ...

A folder named by `scratch_dir` carries its process id, so the next diff removes what
a killed one left behind (only such folders, only when their process is gone).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCRATCH_PREFIX = ".sdc-diff-"  # + purpose-pid-random: what a diff leaves behind if it is killed


def scratch_dir(parent: Path, purpose: str) -> str:
    """A new folder of this diff's in ``parent``, after removing those that killed diffs left there (their
    process is gone). Only folders named by this function are ever removed."""
    for old in parent.glob(f"{SCRATCH_PREFIX}*-*-*"):
        pid = old.name.removeprefix(SCRATCH_PREFIX).split("-")[1]
        if pid.isdigit() and not _alive(int(pid)) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{purpose}-{os.getpid()}-", dir=parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def beam_temp() -> Iterator[None]:
    """Beam's local runners make temporary folders they never remove (three empty ones per job): give them
    one of ours for the job, removed afterwards (or by the next diff, if this one is killed)."""
    folder = scratch_dir(Path(tempfile.gettempdir()), "beam")
    saved_env, saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield
    finally:
        tempfile.tempdir = saved
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(folder, ignore_errors=True)
