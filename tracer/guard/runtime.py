"""The guard inside one Tracer: a step's runs held in memory until the decision, the RNG they restart from,
and the accepted history the detectors compare with.

The Tracer drives it (`tracer.tracing.Tracer.step` and its optimizer pre-hook)::

    begin(step, log)     -> records of the step go to a `Held` sink; the RNG state is saved
    [mark_rerun_start()] -> with a closure as the re-run, what came before it belongs to every run
    evidence(...)        -> the first run's `Evidence`; no alarm: accept() writes it all out
    next_run()           -> on an alarm: RNG restored, a fresh `Held` for the re-run
    settle(verdict, ...) -> the prefix, the decided run's records and the ``guard`` event go to the log

so the log holds the records of the run training used, as if no other had happened, and the
``guard`` event after its gradients says what the other runs were.
"""

from __future__ import annotations

import random
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from tracer.errors import TraceWarning
from tracer.guard.detectors import AbftFlags, Alarm
from tracer.guard.evidence import Evidence, History, gradient_evidence
from tracer.guard.guard import Guard, Verdict
from tracer.guard.ranks import GuardRanks
from tracer.guard.replicas import ReplicaCheck
from tracer.guard.update import require_closed_form, update_rms
from tracer.intercept import own_ops
from tracer.log.records import EventRecord, TensorRecord
from tracer.parallel import Layout
from tracer.record_buffer import RecordSink


class Held:
    """A record sink that keeps a run's records in memory, in order, until the guard decides."""

    def __init__(self) -> None:
        self.records: list[TensorRecord | EventRecord] = []

    def write_tensor(self, rec: TensorRecord) -> None:
        self.records.append(rec)

    def write_event(self, rec: EventRecord) -> None:
        self.records.append(rec)

    def flush(self) -> None:
        pass  # written when the guard has decided

    def close(self, status: str = "complete", detail: str = "") -> None:
        pass

    def abandon(self) -> None:
        pass

    def events(self) -> list[EventRecord]:
        return [r for r in self.records if isinstance(r, EventRecord)]


class RngState:
    """Every generator a training step may draw from (Python, NumPy if loaded, torch CPU and CUDA), so that a
    re-run's dropout and sampling repeat the first run's."""

    def __init__(self) -> None:
        self.python = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy = numpy.random.get_state() if numpy is not None else None
        with own_ops():
            self.torch = torch.get_rng_state()
            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            self.cuda = torch.cuda.get_rng_state_all() if cuda else None

    def restore(self) -> None:
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)
        with own_ops():
            torch.set_rng_state(self.torch)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)


@dataclass
class Run:
    """One run of the guarded step: its records and what the detectors saw of it."""

    held: Held
    evidence: Evidence | None = None
    result: Any = None  # what the re-run (or the closure) returned: a closure's loss

    def summary(self) -> dict[str, Any]:
        e = self.evidence
        assert e is not None
        events = Counter(r.kind for r in self.held.events() if r.kind != "loss")
        return {
            "attempt": e.attempt,
            "fingerprint": e.fingerprint,
            "loss": e.loss,
            "grad_norm": e.grad_norm,
            "nonfinite": e.nonfinite,
            "events": dict(sorted(events.items())),
        }


def _say_warm_up(guard: Guard) -> None:
    """Say once, at the start, which detectors are quiet until they have a history to compare with."""
    quiet = {d.name: n for d in guard.detectors if (n := getattr(d, "min_history", 0)) > 0}
    if not quiet:
        return
    names = ", ".join(f"{name} (the first {n} steps)" for name, n in quiet.items())
    warnings.warn(
        f"the guard's spike detectors compare a step with the accepted steps before it, so they do not "
        f"look at the first steps of a run or of a resume: {names}; a spike there goes unnoticed. Lower a "
        "detector's min_history (e.g. LossSpike(min_history=2)) to watch sooner",
        TraceWarning,
        stacklevel=3,
    )


class StepGuard:
    """One Tracer's guard state: the accepted `History`, the current step's runs, the ranks that decide each step
    together and the replica agreement check after it (None without ``Guard(replicas=...)``)."""

    def __init__(
        self, guard: Guard, optimizer: torch.optim.Optimizer, layout: Layout = Layout(), rank: int = 0
    ) -> None:
        if guard.wants_update_rms:
            require_closed_form(optimizer)
        self.guard = guard
        self.ranks = GuardRanks.of(layout.world_size)
        self.replicas = ReplicaCheck(guard.replicas, layout, rank) if guard.replicas is not None else None
        _say_warm_up(guard)
        self.history = History()
        self.pending = False  # the current step's first run awaits its check
        self.warned_no_rerun = False
        self._counts_flags = any(isinstance(d, AbftFlags) for d in guard.detectors)
        self._log: RecordSink | None = None
        self._prefix = Held()
        self._runs: list[Run] = []
        self._rng: RngState | None = None

    @property
    def current(self) -> Held:
        return self._runs[-1].held

    def begin(self, log: RecordSink) -> Held:
        """A step begins: hold its records (returned: the sink to write to) and save the RNG."""
        self._log, self._prefix, self._runs = log, Held(), [Run(Held())]
        self._rng = RngState()
        self.pending = True
        return self.current

    def mark_rerun_start(self) -> None:
        """What the current run recorded so far comes before the re-runnable part and belongs to every run."""
        self._prefix.records += self.current.records
        self.current.records = []

    def evidence(
        self,
        step: int,
        attempt: int,
        loss: float | None,
        grads: list,
        optimizer: torch.optim.Optimizer,
        result: Any = None,
        unclipped: torch.Tensor | float | None = None,
    ) -> Evidence:
        """The current run's evidence from its gradient digests, ``(name, TensorDigest)`` in log order, and the
        gradient norm before clipping, if the loop reported one (`Tracer.gradient_norm`)."""
        norm, nonfinite, fp = gradient_evidence(grads)
        flags = 0
        if self._counts_flags:
            flags = sum(r.kind == "abft" and r.fields.get("verdict") == "flag" for r in self.current.events())
        with own_ops():  # sdctrace's arithmetic, which an emulated fault must not hit
            if unclipped is not None:
                norm = float(unclipped)
            rms = update_rms(optimizer) if self.guard.wants_update_rms else None
        e = Evidence(step, attempt, loss, norm, nonfinite, flags, fp, rms, self.history)
        if self.replicas is not None:
            self.replicas.note_gradients(grads)
        run = self._runs[-1]
        run.evidence, run.result = e, result
        return e

    def next_run(self) -> Held:
        """Start a re-run: the RNG as at the step's start, and a fresh sink (returned)."""
        assert self._rng is not None
        self._rng.restore()
        self._runs.append(Run(Held()))
        return self.current

    def restore_rng(self) -> None:
        assert self._rng is not None
        self._rng.restore()

    @property
    def fingerprints(self) -> list[int]:
        return [r.evidence.fingerprint for r in self._runs if r.evidence is not None]

    @property
    def result(self) -> Any:
        return self._runs[-1].result

    def accept(self) -> RecordSink:
        """No alarm: the first run is the step; returns the real log, everything held written to it."""
        e = self._runs[-1].evidence
        assert e is not None
        self.history = self.history.after(e, self.guard.keep)
        return self.release()

    def settle(self, step: int, verdict: Verdict, alarms: list[Alarm]) -> RecordSink:
        """An alarm decided: the newest run's records (the gradients ``.grad`` holds), then the ``guard`` event;
        returns the real log."""
        runs = [r.summary() for r in self._runs]
        newest = self._runs[-1].evidence
        assert newest is not None
        if verdict.action == "continue":
            self.history = self.history.after(newest, self.guard.keep)
        log = self.release()
        log.write_event(
            EventRecord(
                "guard",
                step,
                {
                    "alarms": [a.to_event() for a in alarms],
                    "outcome": verdict.outcome,
                    "action": verdict.action,
                    "accepted": verdict.accepted,
                    "runs": runs,
                },
            )
        )
        return log

    def release(self) -> RecordSink:
        """Write what is held (the prefix, then the newest run) to the real log and return that log; after
        that, nothing is held until the next step begins."""
        log = self._log
        assert log is not None, "release() before begin()"
        for rec in (*self._prefix.records, *(self._runs[-1].held.records if self._runs else ())):
            log.write_tensor(rec) if isinstance(rec, TensorRecord) else log.write_event(rec)
        self.pending, self._prefix, self._runs = False, Held(), []
        return log
