"""Only regular files are read from a run: a FIFO or a symlink to /dev/zero in a real run's folder is a one-line
error naming the path, never a hang or an unbounded read.

Each case runs in a child process with a timeout (a FIFO would block forever) and an address-space limit a little
above what the child holds once imported (/dev/zero would otherwise be read until memory runs out).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracer.blobs import BlobStore
from tracer.checkpoint.interface import checkpoint_files

pytestmark = pytest.mark.slow  # each case runs in a child process: seconds each

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120

# Imports first, then cap the address space at 1 GiB above the current size, then run the case.
_CHILD = """
import resource, sys
from pipelines.log_source import read_file
from tracer.blobs import BlobStore
from tracer.checkpoint import load_checkpoint
from tracer.errors import SdcError
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
try:
    {call}
except SdcError as e:
    print(type(e).__name__, e)
    sys.exit(1)
"""


def child(call: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", _CHILD.format(call=call)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=ROOT,
    )


def sdc(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "sdc.cli", *args], capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT
    )


@pytest.fixture
def run(pretrained: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(pretrained, copy)
    return copy


def test_fifo_segment_ends_inspect_with_one_line(run: Path) -> None:
    fifo = run / "rank-00000" / "000001.sdclog"
    os.mkfifo(fifo)
    done = sdc("inspect", "--skip-corrupt", str(run))
    assert done.returncode == 1
    assert done.stderr.startswith("sdc: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert f"{fifo}: log segment is a FIFO" in done.stderr


def test_fifo_segment_is_refused_by_the_beam_reader(run: Path) -> None:
    fifo = run / "rank-00000" / "000001.sdclog"
    os.mkfifo(fifo)
    done = child(f"read_file({str(fifo)!r})")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.startswith(f"LogError {fifo}: run file is a FIFO")


def test_segment_linked_to_dev_zero_is_refused_not_read_without_end(run: Path) -> None:
    seg = run / "rank-00000" / "000001.sdclog"
    seg.symlink_to("/dev/zero")
    done = child(f"read_file({str(seg)!r})")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.startswith(f"LogError {seg}: run file is a character device (a symlink to /dev/zero)")


def test_fifo_checkpoint_manifest_is_refused(run: Path) -> None:
    manifest = run / checkpoint_files(2, 0)[0]
    manifest.unlink()
    os.mkfifo(manifest)
    done = child(f"load_checkpoint({str(run)!r}, 2)")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.startswith(f"LogError {manifest}: checkpoint manifest is a FIFO")


def test_checkpoint_tensors_linked_to_dev_zero_are_refused(run: Path) -> None:
    tensors = run / checkpoint_files(2, 0)[1]
    tensors.unlink()
    tensors.symlink_to("/dev/zero")
    done = child(f"read_file({str(tensors)!r})")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.startswith(f"LogError {tensors}: run file is a character device")


def test_blob_linked_to_dev_zero_is_refused(run: Path) -> None:
    blob = BlobStore(run).path(0x1234)
    blob.parent.mkdir(parents=True)
    blob.symlink_to("/dev/zero")
    done = child(f"BlobStore({str(run)!r}).get(0x1234)")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.startswith(f"LogError {blob}: blob is a character device")
