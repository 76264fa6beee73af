"""Detectors: small, typed checks of one run of a step before the optimizer consumes it.

    guard = Guard(detectors=(NonFinite(), LossSpike(z=8.0), GradNormSpike(), AbftFlags()))

A detector is a frozen dataclass with a ``name`` and ``check(evidence) -> Alarm | None``. It
holds no state: the spike detectors compare with ``evidence.past``, the accepted steps the
guard keeps (`tracer.guard.evidence.History`), so a rejected step never moves a baseline and
one detector object can serve any number of runs. The defaults come from healthy runs of the
reference workload; docs/guard.md gives the command, the numbers and the false-alarm rate.

An `Alarm` says what the detector measured against which threshold: what the ``guard`` event
logs and what scoring against the emulator's ground truth reads.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from tracer.errors import ConfigError
from tracer.guard.evidence import Evidence

MAD_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normal data


@dataclass(frozen=True)
class Alarm:
    """A detector fired: ``measured`` crossed ``threshold`` (both in the detector's own unit)."""

    detector: str
    measured: float
    threshold: float
    detail: str = ""

    def to_event(self) -> dict[str, Any]:
        return {
            "detector": self.detector,
            "measured": float(self.measured),
            "threshold": float(self.threshold),
            "detail": self.detail,
        }


@runtime_checkable
class Detector(Protocol):
    """Looks at one run of a step; fires an `Alarm` or returns None."""

    @property
    def name(self) -> str: ...

    def check(self, evidence: Evidence) -> Alarm | None: ...


@dataclass(frozen=True)
class NonFinite:
    """A NaN or Inf in the step's loss or in any gradient element. Never fires on a finite step."""

    name: ClassVar[str] = "non_finite"

    def check(self, e: Evidence) -> Alarm | None:
        if e.loss is not None and not math.isfinite(e.loss):
            return Alarm(self.name, e.loss, 0.0, "the step's loss is not finite")
        if e.nonfinite:
            return Alarm(self.name, float(e.nonfinite), 0.0, f"{e.nonfinite} NaN/Inf gradient elements")
        return None


@dataclass(frozen=True)
class LossSpike:
    """The step's loss is ``z`` robust standard deviations above the median of the last ``window`` accepted
    losses (deviation: 1.4826 x their median absolute deviation, at least ``floor`` x the median, so that a
    flat loss curve does not turn rounding noise into spikes). Quiet until ``min_history`` steps are in."""

    name: ClassVar[str] = "loss_spike"
    window: int = 32
    z: float = 8.0  # healthy tiny runs: at most 4.1 in 876 checked steps (docs/guard.md)
    floor: float = 0.01
    min_history: int = 8

    def __post_init__(self) -> None:
        _window(self, self.window, self.min_history)
        _positive(self, "z", self.z)
        _positive(self, "floor", self.floor, zero=True)

    def check(self, e: Evidence) -> Alarm | None:
        past = e.past.loss[-self.window :]
        if e.loss is None or len(past) < self.min_history or not math.isfinite(e.loss):
            return None
        z = robust_z(e.loss, past, self.floor)
        if z <= self.z:
            return None
        return Alarm(
            self.name,
            z,
            self.z,
            f"loss {e.loss:.6g} vs median {statistics.median(past):.6g} of {len(past)} accepted steps",
        )


@dataclass(frozen=True)
class _RatioSpike:
    """A value more than ``factor`` times the median of its last ``window`` accepted values."""

    window: int = 32
    factor: float = 5.0
    min_history: int = 8
    name: ClassVar[str]
    _of: ClassVar[str]  # the Evidence (and History) field watched
    _what: ClassVar[str]

    def __post_init__(self) -> None:
        _window(self, self.window, self.min_history)
        _positive(self, "factor", self.factor, above=1.0)

    def check(self, e: Evidence) -> Alarm | None:
        value: float | None = getattr(e, self._of)
        past: tuple[float, ...] = getattr(e.past, self._of)[-self.window :]
        if value is None or len(past) < self.min_history:
            return None
        median = statistics.median(past)
        if math.isfinite(value) and median <= 0:
            return None
        ratio = value / median if math.isfinite(value) else math.inf
        if ratio <= self.factor:
            return None
        return Alarm(
            self.name,
            ratio,
            self.factor,
            f"{self._what} {value:.6g} vs median {median:.6g} of {len(past)} accepted steps",
        )


@dataclass(frozen=True)
class GradNormSpike(_RatioSpike):
    """The global gradient norm is more than ``factor`` times the median of the last ``window`` accepted
    steps' norms. (Gradient norms change by factors, not by offsets: a ratio, not a z-score.)"""

    name: ClassVar[str] = "grad_norm_spike"
    factor: float = 5.0  # healthy tiny runs: at most 2.8
    _of = "grad_norm"
    _what = "gradient norm"


@dataclass(frozen=True)
class UpdateRmsSpike(_RatioSpike):
    """The RMS of the update the optimizer is about to apply is more than ``factor`` times the median of the
    last ``window`` accepted steps'. Computed before the update, in closed form from the gradients and the
    optimizer's state, for SGD (with momentum), Adam and AdamW only (`tracer.guard.update`): any other
    optimizer is refused when the Tracer starts. The only detector that costs a pass over the gradients."""

    name: ClassVar[str] = "update_rms_spike"
    factor: float = 2.0  # healthy tiny runs: at most 1.4
    _of = "update_rms"
    _what = "update RMS"


@dataclass(frozen=True)
class AbftFlags:
    """At least ``min_flags`` matrix products of this run failed their ABFT checksum check (`abft` events
    with verdict "flag", from the checker that `sdc record --abft` runs). The checker's bound is a worst
    case: a healthy product is never flagged (docs/faults.md)."""

    name: ClassVar[str] = "abft_flags"
    min_flags: int = 1

    def __post_init__(self) -> None:
        if self.min_flags < 1:
            raise ConfigError(f"AbftFlags(min_flags={self.min_flags}): must be >= 1")

    def check(self, e: Evidence) -> Alarm | None:
        if e.abft_flags < self.min_flags:
            return None
        return Alarm(self.name, float(e.abft_flags), float(self.min_flags), f"{e.abft_flags} products flagged")


class Twin(Protocol):
    """Where a twin's gradient fingerprints come from: `tracer.guard.twin.RecordedTwin`, or your own."""

    def fingerprint(self, step: int) -> int | None:
        """The twin's step fingerprint (`tracer.guard.evidence.step_fingerprint`), None if it has none yet."""
        ...


@dataclass(frozen=True)
class TwinMismatch:
    """The step's gradients differ, bit for bit, from a twin's: a healthy node training the same
    deterministic run. Abstains on steps the twin has not reached."""

    name: ClassVar[str] = "twin_mismatch"
    twin: Twin = field(compare=False)

    def check(self, e: Evidence) -> Alarm | None:
        theirs = self.twin.fingerprint(e.step)
        if theirs is None or theirs == e.fingerprint:
            return None
        return Alarm(self.name, 1.0, 0.0, f"gradient fingerprint {e.fingerprint:016x}, the twin's {theirs:016x}")


def robust_z(value: float, past: Sequence[float], floor: float) -> float:
    """How many robust standard deviations ``value`` lies above the median of ``past``."""
    median = statistics.median(past)
    mad = statistics.median(abs(x - median) for x in past)
    scale = max(MAD_SIGMA * mad, floor * abs(median), 1e-12)
    return (value - median) / scale


def _window(d: Any, window: int, min_history: int) -> None:
    if not 1 <= min_history <= window:
        raise ConfigError(
            f"{type(d).__name__}(window={window}, min_history={min_history}): need 1 <= min_history <= window"
        )


def _positive(d: Any, key: str, value: float, *, zero: bool = False, above: float = 0.0) -> None:
    ok = math.isfinite(value) and (value >= above if zero else value > above)
    if not ok:
        bound = f">= {above}" if zero else f"> {above}"
        raise ConfigError(f"{type(d).__name__}({key}={value}): must be a finite number {bound}")
