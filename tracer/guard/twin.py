"""`RecordedTwin`: a twin's step fingerprints, read from its run directory for `TwinMismatch`.

    guard = Guard(detectors=(NonFinite(), TwinMismatch(RecordedTwin("runs/golden"))))

The twin is a run of the same deterministic training on a healthy node: recorded before, or
recording now beside this one. Its log is read through the reader API; asked for a step it
has not finished, it reads the log again (a live log may end in a torn tail, which is no
error) and, if the step is still missing, abstains: a twin that falls behind costs missed
alarms, never false ones. Each re-read reads the whole log: keep a live twin ahead.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from tracer.guard.evidence import step_fingerprint
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord
from tracer.log.segment import TornTailWarning


class RecordedTwin:
    """Step fingerprints of the gradients in ``run``'s log (rank ``rank``)."""

    def __init__(self, run: str | Path, rank: int = 0) -> None:
        self.run = Path(run)
        self.rank = rank
        self._steps: dict[int, int] = {}
        self._complete = -1  # the last step whose end the twin has logged
        self._read()

    def __repr__(self) -> str:
        return f"RecordedTwin({str(self.run)!r}, rank={self.rank})"

    def fingerprint(self, step: int) -> int | None:
        if step > self._complete:
            self._read()
        return self._steps.get(step) if step <= self._complete else None

    def _read(self) -> None:
        grads: dict[int, list[tuple[str, int]]] = {}
        done: list[int] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornTailWarning)
            for rec in LogReader(rank_dir(self.run, self.rank)).records():
                if isinstance(rec, TensorRecord):
                    if rec.phase == Phase.GRAD:
                        grads.setdefault(rec.step, []).append((rec.name, rec.fingerprint))
                elif rec.kind == "step":  # written at the step's end, after all of its gradients
                    done.append(rec.step)
        self._steps = {s: step_fingerprint(grads[s]) for s in done if s in grads}
        self._complete = max(done, default=-1)
