"""Building a kernel survives what a killed build leaves behind and waits, saying so, for a live one."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracer import kernel


@pytest.fixture
def built_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of this machine's built digest kernel under a kernel directory of its own."""
    kernel.build(kernel.DIGEST)
    source = kernel.build_dir(kernel.DIGEST)
    root = tmp_path / "kernels"
    shutil.copytree(source, root / source.name, symlinks=True)
    env = dict(os.environ, **{kernel.DIR_ENV: str(root)})
    return root / source.name, env


def _build(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tracer.kernel"], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


@pytest.mark.slow  # a fresh Python process (or a compile) of a few seconds
def test_a_killed_builds_lock_file_does_not_stop_the_next_build(built_copy) -> None:
    folder, env = built_copy
    (folder / "lock").touch()  # torch's lock, left by a build killed mid-way; torch alone waits on it forever
    run = _build(env)
    out, err = run.communicate(timeout=240)
    assert run.returncode == 0, err
    assert str(folder / "sdctrace_digest.so") in out and not (folder / "lock").exists()


@pytest.mark.slow  # a fresh Python process (or a compile) of a few seconds
def test_a_build_waits_for_a_live_one_and_says_so(built_copy) -> None:
    folder, env = built_copy
    with open(folder / "sdctrace-build.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a build in another process holds it
        run = _build(env)
        assert run.stderr is not None
        line = run.stderr.readline()  # blocks until the build says it waits
        assert "another process is building the digest kernel" in line and str(folder) in line
        assert run.poll() is None
    out, _ = run.communicate(timeout=240)
    assert run.returncode == 0 and "sdctrace digest kernel:" in out
