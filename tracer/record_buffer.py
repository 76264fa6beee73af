"""`RecordBuffer`: the records a Tracer has taken but not written yet, and the one place that writes them.

Two kinds wait, for speed, and both keep the log's order:

- **held**: inside a step, CPU digests and the Tracer's own events are kept as plain tuples and written when
  the step ends (or a record comes that cannot wait): building records between the ops of a pass costs
  several times what it costs in a loop;
- **pending**: digests on an accelerator stay on the device and the step's end reads all of them in one
  transfer (on XLA, after marking the step), instead of stalling the device at every record.

The Tracer drives it::

    buffer = RecordBuffer(lambda: tracer.log, capture, blobs)
    buffer.start_holding()                    # a step begins (when its records may wait)
    buffer.hold(step, mb, name, phase, t)     # False: not held, so write it
    buffer.write_many(named, phase, step, mb) # digest and write (or defer on an accelerator)
    buffer.stop_holding(); buffer.drain(); buffer.read_pending()  # the step ends

Records go to the sink the callable returns when they are written, except a deferred tensor's, which go to
the sink of the moment they were recorded (the guard may have switched it by the step's end).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import torch

from tracer.blobs import BlobStore
from tracer.device import is_lazy, mark_step, to_host
from tracer.fingerprint import (
    HeldRow,
    TensorDigest,
    batched_parts,
    digest_many,
    held_digesters,
    resolve_rows,
    tensor_meta,
)
from tracer.intercept import own_ops
from tracer.io_thread import IOThread
from tracer.log.records import EndStatus, EventRecord, Phase, TensorRecord
from tracer.options import CapturePolicy

HOLD_ROWS = 4096  # held records at most: a step of many microbatches writes as it goes


class RecordSink(Protocol):
    """Where a Tracer's records go: a `LogWriter`, or a checker such as replay's verifier."""

    def write_tensor(self, rec: TensorRecord) -> None: ...
    def write_event(self, rec: EventRecord) -> None: ...
    def flush(self) -> None: ...
    def close(self, status: EndStatus = "complete", detail: str = "") -> None: ...
    def abandon(self) -> None: ...


def deferred(device: torch.device) -> bool:
    """Whether digests on ``device`` are read at the step's end rather than when recorded: on accelerators."""
    return device.type != "cpu"


class RecordBuffer:
    """Held and pending records of one Tracer, written to ``sink()`` in the order they were taken. ``capture``
    says which tensors are also stored whole in ``blobs``, by the I/O thread ``io`` (set while recording)."""

    def __init__(self, sink: Callable[[], RecordSink], capture: CapturePolicy, blobs: BlobStore | None) -> None:
        self._sink = sink
        self.capture = capture
        self.blobs = blobs
        self.io: IOThread | None = None
        self._held: list[tuple[int, int, str, Phase, HeldRow] | EventRecord] = []
        self._pending: list[tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], None]]] = []
        # Set inside a step that holds (fingerprint.HeldDigesters).
        self._digest_one: Callable[[torch.Tensor], HeldRow | None] | None = None
        self._digest_many: Callable[[list[torch.Tensor]], list[HeldRow] | None] | None = None

    # -- holding ---------------------------------------------------------------------
    def start_holding(self) -> None:
        """Hold what the fused kernel digests from now on (nothing without the kernel)."""
        held = held_digesters()
        self._digest_one, self._digest_many = (held.one, held.many) if held is not None else (None, None)

    def stop_holding(self) -> None:
        self._digest_one = self._digest_many = None

    def hold(self, step: int, mb: int, name: str, phase: Phase, tensor: torch.Tensor) -> bool:
        """Hold one tensor's record; False (nothing held) outside a step that holds, or for a tensor the
        kernel does not take."""
        digest = self._digest_one
        if digest is None:
            return False
        row = digest(tensor)  # no torch op: the fault emulator and the ABFT checker see nothing of it
        if row is None:
            return False
        held = self._held
        held.append((step, mb, name, phase, row))
        if len(held) >= HOLD_ROWS:
            self.drain()
        return True

    def hold_many(self, named: list[tuple[str, torch.Tensor]], phase: Phase, step: int, mb: int) -> bool:
        """Hold a step's gradient or parameter records from one kernel call, with no Python per tensor but the
        record's tuple; False (nothing held) outside a step that holds, or when the kernel does not take them all."""
        many = self._digest_many
        rows = many([t for _, t in named]) if many is not None and named else None
        if rows is None:
            return False
        held = self._held
        held.extend([(step, mb, name, phase, row) for (name, _), row in zip(named, rows)])
        if len(held) >= HOLD_ROWS:
            self.drain()
        return True

    def hold_event(self, event: EventRecord) -> None:
        """Write one of the Tracer's own events, or inside a step that holds, keep it in order with the held
        records: written between a pass's ops, a loss event cost a traced tiny step 40 us, 3 us in a loop."""
        if self._digest_one is None:
            self.drain()
            self._sink().write_event(event)
            return
        self._held.append(event)
        if len(self._held) >= HOLD_ROWS:
            self.drain()

    def drain(self) -> None:
        """Write the held records, in order: before any other record is written or deferred, and before the
        guard moves what it holds."""
        held = self._held
        if not held:
            return
        self._held = []
        log = self._sink()
        write = log.write_tensor
        for item in held:
            if type(item) is EventRecord:
                log.write_event(item)
                continue
            step, mb, name, phase, (fp, nan, inf, l2, absmax, meta) = item
            write(TensorRecord(step, mb, name, phase, fp, l2, absmax, nan, inf, meta))

    # -- writing and deferring ---------------------------------------------------------
    def write_many(
        self, named: list[tuple[str, torch.Tensor]], phase: Phase, step: int, mb: int, *, read_now: bool = False
    ) -> list[TensorDigest] | None:
        """Digest ``named`` in one call and write their records. Returns the digests; None on an accelerator,
        whose digests are read at the step's end unless ``read_now``."""
        self.drain()
        if not named:
            return []
        log = self._sink()
        tensors = [t for _, t in named]
        if read_now:
            self.read_pending()  # what was recorded before keeps its place in the log
        elif deferred(tensors[0].device):
            # Reading a digest now would stall the device (or, on XLA, run the graph up to here on its own):
            # the digests stay on the device and the step's end reads all of them in one transfer.
            with own_ops():
                parts = batched_parts(tensors)
                # A tensor captured later could have changed in place by then; an XLA tensor is a value.
                kept = [
                    (t.detach() if is_lazy(t.device) else t.detach().clone())
                    if self._captures(step, n, phase)
                    else None
                    for n, t in named
                ]
            metas = [tensor_meta(t) for t in tensors]
            self._pending.append(
                ([parts], functools.partial(self._write_rows, log, step, mb, phase, named, metas, kept))
            )
            return None
        with own_ops():
            digests = digest_many(tensors)
        for (name, tensor), d in zip(named, digests):
            self._write(log, step, mb, name, phase, d, tensor)
        return digests

    def defers(self, tensor: torch.Tensor) -> bool:
        """Whether what the step takes of ``tensor`` (its digest, a loss) is read at the step's end."""
        return deferred(tensor.device)

    def defer(self, tensors: list[torch.Tensor], finish: Callable[[list[torch.Tensor]], None]) -> None:
        """Call ``finish`` with ``tensors`` on the host when the pending records are read, in log order.

        Pass them as the step computed them: on a lazy device an op taken on them after the step's graph ran
        (a ``reshape(1)`` at the step's end) is a second graph of its own when the step's end marks the step."""
        self._pending.append((tensors, finish))

    def write_event(self, event: EventRecord) -> None:
        """Write ``event`` after everything taken before it, pending records included."""
        self.drain()
        log = self._sink()
        if self._pending:  # keep log order
            self._pending.append(([], lambda host: log.write_event(event)))
        else:
            log.write_event(event)

    def read_pending(self) -> None:
        """Mark the step on a lazy device, then read what an accelerator recorded in one transfer and log it."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        tensors = [t for ts, _ in pending for t in ts]
        if tensors:
            mark_step(tensors[0].device)
        host = iter(to_host(tensors))
        for ts, finish in pending:
            finish([next(host) for _ in ts])

    def discard_pending(self) -> None:
        """Forget the deferred records: after a failure, a lazy step's graph may not run."""
        self._pending.clear()

    def discard_held(self) -> None:
        self._held.clear()

    def _write_rows(
        self,
        log: RecordSink,
        step: int,
        mb: int,
        phase: Phase,
        named: list[tuple[str, torch.Tensor]],
        metas: list[tuple[str, int]],
        kept: list[torch.Tensor | None],
        host: list[torch.Tensor],
    ) -> None:
        for (name, _), tensor, d in zip(named, kept, resolve_rows(host[0], metas)):
            self._write(log, step, mb, name, phase, d, tensor)

    def _captures(self, step: int, name: str, phase: Phase) -> bool:
        return self.capture.active and self.blobs is not None and self.capture.wants(step, name, phase)

    def _write(
        self, log: RecordSink, step: int, mb: int, name: str, phase: Phase, d: TensorDigest, tensor: torch.Tensor | None
    ) -> None:
        log.write_tensor(TensorRecord(step, mb, name, phase, d.fingerprint, d.l2, d.absmax, d.nan, d.inf, d.meta))
        if tensor is not None and self._captures(step, name, phase):
            with own_ops():
                copy = tensor.detach().to("cpu", copy=True)
            fp = d.fingerprint
            assert self.io is not None and self.blobs is not None
            blobs = self.blobs
            self.io.submit(lambda: blobs.put(fp, copy))
            log.write_event(
                EventRecord("blob", step, {"microbatch": mb, "name": name, "phase": int(phase), "fingerprint": fp})
            )
