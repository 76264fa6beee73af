"""Write the log off the training thread without ever dropping a record.

The training thread only computes digests and enqueues small records; a single
writer thread encodes, frames and writes them. The queue is bounded: when the
writer falls behind, ``put`` blocks (backpressure) instead of dropping. A failure
in the writer is re-raised in the training thread at the next call.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tracer.errors import CaptureError
from tracer.log.records import EventRecord, TensorRecord
from tracer.log.writer import LogWriter

_CLOSE = object()


class BackgroundWriter:
    """A `LogWriter` driven by its own thread through a bounded queue."""

    def __init__(self, writer: LogWriter, *, max_pending: int = 8192) -> None:
        self._writer = writer
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._closed = False
        self.stalls = 0  # times the training thread waited for the writer
        self.stall_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="sdctrace-log-writer", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------
    def tensor(self, rec: TensorRecord) -> None:
        self._put(rec)

    def event(self, rec: EventRecord) -> None:
        self._put(rec)

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the writer thread, in order with the records (e.g. a blob write)."""
        self._put(fn)

    def sync(self) -> None:
        """Block until everything enqueued so far is written and flushed to the OS."""
        done = threading.Event()
        self._put(done)
        while not done.wait(0.05):
            self._raise_if_failed()
        self._raise_if_failed()

    def close(self, status: str = "complete", detail: str = "") -> None:
        """Drain the queue, write the end marker and join the writer thread."""
        if self._closed:
            return
        self._closed = True
        if self._error is None:
            self._put((_CLOSE, status, detail), closing=True)
        self._thread.join()
        self._raise_if_failed()

    def abandon(self) -> None:
        """Stop without an end marker, as a crash would (used by tests and on fatal errors)."""
        if self._closed:
            return
        self._closed = True
        self._put((_CLOSE, None, ""), closing=True)
        self._thread.join()

    # -- internals -------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise CaptureError(
                f"the background log writer failed: {self._error} "
                f"(events after step of failure are not recorded; check disk space and permissions)"
            ) from self._error

    def _put(self, item: Any, closing: bool = False) -> None:
        if self._closed and not closing:
            raise CaptureError("the tracer's log writer is closed; record inside the `with Tracer(...)` block")
        self._raise_if_failed()
        try:
            self._queue.put_nowait(item)
            return
        except queue.Full:
            pass
        self.stalls += 1
        start = time.perf_counter()
        while True:
            try:
                self._queue.put(item, timeout=0.05)
                break
            except queue.Full:
                if not self._thread.is_alive():
                    self._raise_if_failed()
                    raise CaptureError("the background log writer stopped unexpectedly") from None
        self.stall_seconds += time.perf_counter() - start

    def _run(self) -> None:
        w = self._writer
        try:
            while True:
                item = self._queue.get()
                while True:
                    if isinstance(item, TensorRecord):
                        w.write_tensor(item)
                    elif isinstance(item, EventRecord):
                        w.write_event(item)
                    elif isinstance(item, threading.Event):
                        w.flush()
                        item.set()
                    elif isinstance(item, tuple) and item and item[0] is _CLOSE:
                        if item[1] is None:
                            w.abandon()
                        else:
                            w.close(item[1], item[2])
                        return
                    else:
                        item()
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                # The queue ran dry: hand what we have to the OS so a crash loses little.
                w.flush()
        except BaseException as exc:  # surfaced in the training thread
            self._error = exc
            try:
                w.abandon()
            except BaseException:
                pass
            # Unblock a producer waiting on a full queue.
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, threading.Event):
                    item.set()
