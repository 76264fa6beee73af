"""The I/O thread: order, backpressure and failures that surface."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tracer.errors import CaptureError
from tracer.io_thread import AsyncFile, IOThread


def eventually(condition: Callable[[], bool], deadline_s: float = 30.0) -> bool:
    """Poll ``condition`` until it holds or a deadline far beyond any scheduling delay passes."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_operations_run_in_order_and_a_full_queue_blocks_instead_of_dropping() -> None:
    io = IOThread(max_pending=2)
    started, gate = threading.Event(), threading.Event()
    done: list[int] = []
    io.submit(lambda: (started.set(), gate.wait(10)))  # the "disk" hangs until the gate opens
    try:
        assert started.wait(5)
        for i in range(2):
            io.submit(lambda i=i: done.append(i))
        blocked = threading.Thread(target=lambda: io.submit(lambda: done.append(2)), daemon=True)
        blocked.start()
        assert eventually(lambda: io.stalls == 1)  # the third submit found the queue full ...
        assert blocked.is_alive() and done == []  # ... and waits while the disk hangs: backpressure, not a drop
    finally:
        gate.set()
    blocked.join(5)
    io.stop()
    assert done == [0, 1, 2]


def test_a_failure_is_raised_at_the_next_call() -> None:
    io = IOThread()

    def fail() -> None:
        raise OSError(28, "No space left on device")

    io.submit(fail)
    with pytest.raises(CaptureError, match="No space left on device"):
        io.drain()
    with pytest.raises(CaptureError):
        io.submit(lambda: None)
    with pytest.raises(CaptureError):
        io.stop()


def test_async_file_writes_everything_in_order(tmp_path: Path) -> None:
    io = IOThread()
    f = AsyncFile(tmp_path / "x.bin", io, chunk_bytes=10)
    payload = [bytes([i]) * (i + 3) for i in range(40)]
    for p in payload:
        f.write(p)
    f.fsync()
    f.close()
    io.stop()
    assert (tmp_path / "x.bin").read_bytes() == b"".join(payload)
    with pytest.raises(FileExistsError):
        AsyncFile(tmp_path / "x.bin", IOThread())
