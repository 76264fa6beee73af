"""Keep disk I/O off the training thread without ever dropping a record.

Encoding a record costs about two microseconds, so the training thread frames
records itself into a memory buffer; whole chunks go through a bounded queue to
one I/O thread that writes, flushes and fsyncs them. (A writer thread that also
encoded would hold the GIL in Python code and stall every torch op the training
thread runs.) When the disk falls behind, the queue fills and the training thread
waits: backpressure, never a silent drop. A failure on the I/O thread is raised
in the training thread at its next call.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from tracer.errors import CaptureError

CHUNK_BYTES = 256 << 10
_STOP = object()


class IOThread:
    """One thread that runs file operations in the order they were submitted."""

    def __init__(self, *, max_pending: int = 64, name: str = "sdctrace-io") -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._stopped = False
        self.stalls = 0  # times the training thread waited for the disk
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, op: Callable[[], object]) -> None:
        """Queue ``op``; blocks while the queue is full."""
        self.check()
        if self._stopped:
            raise CaptureError("the tracer's I/O thread is stopped; record inside the `with Tracer(...)` block")
        try:
            self._queue.put_nowait(op)
            return
        except queue.Full:
            pass
        self.stalls += 1
        while True:
            try:
                self._queue.put(op, timeout=0.05)
                break
            except queue.Full:
                self.check()

    def drain(self) -> None:
        """Wait until every queued operation has run."""
        done = threading.Event()
        self.submit(done.set)
        while not done.wait(0.05):
            self.check()
        self.check()

    def stop(self) -> None:
        """Run what is queued, then end the thread; raises the thread's failure, if any."""
        if not self._stopped:
            self._stopped = True
            if self._error is None:
                self._queue.put(_STOP)
            self._thread.join()
        self.check()

    def check(self) -> None:
        if self._error is not None:
            raise CaptureError(
                f"writing the run failed on the I/O thread: {self._error} "
                "(records after the failure are lost; check disk space and permissions)"
            ) from self._error

    def _run(self) -> None:
        while True:
            op = self._queue.get()
            if op is _STOP:
                return
            try:
                op()
            except BaseException as exc:  # surfaced in the training thread by check()
                self._error = exc
                self._discard_queue()
                return

    def _discard_queue(self) -> None:
        """After a failure, unblock producers waiting on a full queue (their ops are lost)."""
        while True:
            try:
                op = self._queue.get(timeout=0.2)
            except queue.Empty:
                return
            if op is _STOP:
                return


class AsyncFile:
    """A write-only binary file whose system calls run on an `IOThread`."""

    def __init__(self, path: Path, io: IOThread, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._io = io
        self._chunk = chunk_bytes
        self._buf = bytearray()
        self._box: dict[str, BinaryIO] = {}
        io.check()
        # Opened eagerly so "already exists" is reported here, not later on the I/O thread.
        self._box["f"] = open(path, "xb", buffering=0)

    def write(self, data: bytes) -> int:
        self._buf += data
        if len(self._buf) >= self._chunk:
            self._post()
        return len(data)

    def flush(self) -> None:
        self._post()

    def fsync(self) -> None:
        self._post()
        box = self._box
        self._io.submit(lambda: os.fsync(box["f"].fileno()))

    def close(self) -> None:
        self._post()
        box = self._box
        self._io.submit(lambda: box["f"].close())

    def _post(self) -> None:
        if not self._buf:
            return
        data, self._buf = bytes(self._buf), bytearray()
        f = self._box["f"]
        self._io.submit(lambda: _write_all(f, data))


def _write_all(f: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = f.write(view)
        view = view[n:]
