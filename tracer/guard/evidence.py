"""What a detector sees of one run of a step: scalars the Tracer has anyway, and the accepted past.

The Tracer fills an `Evidence` in its optimizer pre-hook from what it already computed: the
step's loss (the microbatch losses it logged), and from the gradient digests it records
anyway, the global gradient L2 norm, the count of NaN/Inf gradient elements and the step's
gradient fingerprint (`step_fingerprint`). No extra pass over any tensor, no extra host sync;
only `UpdateRmsSpike` asks for one (`tracer.guard.update`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

from tracer.fingerprint import TensorDigest


@dataclass(frozen=True)
class History:
    """The accepted steps' values, oldest first, at most `keep` of each: what spike detectors compare with.
    A step joins only once the guard accepted it, so a rejected spike never raises the baseline."""

    loss: tuple[float, ...] = ()
    grad_norm: tuple[float, ...] = ()
    update_rms: tuple[float, ...] = ()

    def after(self, e: Evidence, keep: int) -> History:
        """This history with ``e`` accepted (non-finite values stay out)."""
        if keep <= 0:
            return self

        def push(past: tuple[float, ...], value: float | None) -> tuple[float, ...]:
            if value is None or not math.isfinite(value):
                return past
            return (*past[len(past) + 1 - keep :], value) if len(past) >= keep else (*past, value)

        return History(push(self.loss, e.loss), push(self.grad_norm, e.grad_norm), push(self.update_rms, e.update_rms))


@dataclass(frozen=True)
class Evidence:
    """One run of one step, as the optimizer is about to consume it."""

    step: int
    attempt: int  # 0: the step's first run; 1, 2, ...: the guard's re-runs
    loss: float | None  # the step's loss (sum of its microbatch losses), None if none was logged
    grad_norm: float  # global L2 norm of the gradients: before clipping if the loop reported it, else as recorded
    nonfinite: int  # NaN and Inf gradient elements
    abft_flags: int  # abft events with verdict "flag" during this run
    fingerprint: int  # of the gradients, bit for bit (step_fingerprint)
    update_rms: float | None = None  # RMS of the update the optimizer would apply; only with UpdateRmsSpike
    past: History = History()


def step_fingerprint(named: Iterable[tuple[str, int]]) -> int:
    """One 64-bit fingerprint of a step's gradients from their (name, fingerprint) records in log order: equal
    for two runs exactly when every gradient is bit-identical (up to the digest's collision bound)."""
    h = hashlib.blake2b(digest_size=8)
    for name, fp in named:
        h.update(name.encode("utf-8"))
        h.update(b"\0")
        h.update(fp.to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little")


def gradient_evidence(named: list[tuple[str, TensorDigest]]) -> tuple[float, int, int]:
    """(global L2 norm, NaN/Inf elements, step fingerprint) from a step's gradient digests."""
    squares = sum(d.l2 * d.l2 for _, d in named)
    nonfinite = sum(d.nan + d.inf for _, d in named)
    return math.sqrt(squares), nonfinite, step_fingerprint((n, d.fingerprint) for n, d in named)
