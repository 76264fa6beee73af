"""The guard's detectors over every step of a recorded run at once, with the verdicts a guard would give.

A guard checks each step against the history of the steps it accepted before (`tracer.guard`):
a step one of its detectors flags never joins the baseline. Run step by step in Python that is
about 13 µs a step and set; `score` decides the same verdicts with numpy instead:

- the detectors without history (`NonFinite`, `AbftFlags`, `TwinMismatch`) over all steps at once;
  a step they flag is out of the history from the start;
- the spike detectors (`LossSpike`, `GradNormSpike`) a chunk of steps at a time, each step's window
  being the last ``window`` accepted finite values before it, medians and MADs computed as
  `statistics.median` computes them (the mean of the two middle values, in float64);
- the first step in a chunk that a spike detector flags and the history took so far leaves it, and
  the next chunk starts after it: every later window is taken with that step out.

Each flagged step's `Alarm` then comes from the detector's own ``check`` on that step's evidence
and window, so measured values and details are the detector's. A set holding any other detector
(a user's own, `UpdateRmsSpike`) is scored step by step, as the guard runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tracer.guard import AbftFlags, Detector, Evidence, Guard, History, TwinMismatch
from tracer.guard.detectors import MAD_SIGMA, Alarm, GradNormSpike, LossSpike, NonFinite

_NO_HISTORY = History()
_CHUNK = 256  # steps whose windows are taken at once; a flag restarts the next chunk right after it


class Scored(NamedTuple):
    """A set of detectors scored together: ``name`` for one row per step for the set as a whole (fired if any
    fired; measured: how many), None for one row per step and detector."""

    detectors: tuple[Detector, ...]
    name: str | None = None


@dataclass(frozen=True)
class Steps:
    """What the detectors see of a run's steps, one entry per step in step order. ``loss`` is NaN where the
    step logged none and ``has_loss`` says which NaNs were logged (`NonFinite` fires on those)."""

    step: np.ndarray  # int64
    loss: np.ndarray  # float64
    has_loss: np.ndarray  # bool
    grad_norm: np.ndarray  # float64
    nonfinite: np.ndarray  # int64
    abft_flags: np.ndarray  # int64
    fingerprint: Sequence[int]  # 64-bit, as Python ints

    def __len__(self) -> int:
        return len(self.step)

    def evidence(self, k: int, past: History = _NO_HISTORY) -> Evidence:
        loss = float(self.loss[k]) if self.has_loss[k] else None
        return Evidence(
            int(self.step[k]),
            0,
            loss,
            float(self.grad_norm[k]),
            int(self.nonfinite[k]),
            int(self.abft_flags[k]),
            self.fingerprint[k],
            None,
            past,
        )


Fired = dict[int, dict[str, Alarm]]  # per step index with any alarm: detector name -> its alarm


def score(steps: Steps, sets: Sequence[Scored]) -> list[Fired]:
    """Per set: the alarms of each step that had any, as a guard running that set alone would raise them."""
    return [
        _score_set(steps, s.detectors)
        if all(_vectorised(d) for d in s.detectors)
        else score_stepwise(steps, s.detectors)
        for s in sets
    ]


def score_stepwise(steps: Steps, detectors: tuple[Detector, ...]) -> Fired:
    """The guard's own rule applied step by step: what `score` decides with numpy (tests/pipelines/test_scoring.py
    holds them equal), and what it falls back to."""
    guard, past, fired = Guard(detectors=detectors), _NO_HISTORY, {}
    for k in range(len(steps)):
        e = steps.evidence(k, past)
        alarms = {a.detector: a for a in guard.check(e)}
        if alarms:
            fired[k] = alarms
        elif guard.keep:
            past = past.after(e, guard.keep)
    return fired


def _vectorised(d: Detector) -> bool:
    return type(d) in (NonFinite, AbftFlags, TwinMismatch, LossSpike, GradNormSpike)


def _score_set(steps: Steps, detectors: tuple[Detector, ...]) -> Fired:
    """`score_stepwise` for detectors that all have a numpy form (`_vectorised`)."""
    n = len(steps)
    fires = {d.name: _fires_without_history(steps, d) for d in detectors if not _windowed(d)}
    windowed = [d for d in detectors if _windowed(d)]
    accepted = ~np.logical_or.reduce([*fires.values(), np.zeros(n, bool)])
    for d in windowed:
        fires[d.name] = np.zeros(n, bool)
    pushable = {"loss": np.isfinite(steps.loss), "grad_norm": np.isfinite(steps.grad_norm)}
    at = 0
    while windowed and at < n:
        end = min(n, at + _CHUNK)
        chunk = {d.name: _spikes(steps, d, accepted, pushable[_field(d)], at, end) for d in windowed}
        leaves = np.logical_or.reduce(list(chunk.values())) & accepted[at:end]
        stop = end if not leaves.any() else at + int(np.argmax(leaves)) + 1
        for name, hit in chunk.items():
            fires[name][at:stop] = hit[: stop - at]
        if leaves.any():
            accepted[stop - 1] = False
        at = stop
    history = _Histories(steps, accepted, pushable, Guard(detectors=detectors).keep)
    fired: Fired = {}
    for k in np.flatnonzero(np.logical_or.reduce([*fires.values(), np.zeros(n, bool)])).tolist():
        e = steps.evidence(k, history.at(k) if windowed else _NO_HISTORY)
        alarms = {}
        for d in detectors:
            if fires[d.name][k]:
                alarm = d.check(e)
                if alarm is None:  # numpy and the detector disagree: trust the detector's own rule
                    return score_stepwise(steps, detectors)
                alarms[d.name] = alarm
        fired[k] = alarms
    return fired


def _windowed(d: Detector) -> bool:
    return isinstance(d, LossSpike | GradNormSpike)


def _field(d: Detector) -> str:
    return "loss" if isinstance(d, LossSpike) else "grad_norm"


def _fires_without_history(steps: Steps, d: Detector) -> np.ndarray:
    if isinstance(d, NonFinite):
        return (steps.has_loss & ~np.isfinite(steps.loss)) | (steps.nonfinite != 0)
    if isinstance(d, AbftFlags):
        return steps.abft_flags >= d.min_flags
    assert isinstance(d, TwinMismatch)
    theirs = map(d.twin.fingerprint, steps.step.tolist())
    return np.fromiter((t is not None and t != fp for t, fp in zip(theirs, steps.fingerprint)), bool, len(steps))


def _spikes(
    steps: Steps, d: LossSpike | GradNormSpike, accepted: np.ndarray, pushable: np.ndarray, at: int, end: int
) -> np.ndarray:
    """Whether ``d`` fires at each step in [at, end), each against its own window of the history."""
    values = steps.loss if isinstance(d, LossSpike) else steps.grad_norm
    kept = np.flatnonzero(accepted[:end] & pushable[:end])
    history = values[kept]
    counts = np.searchsorted(kept, np.arange(at, end))  # history values before each step
    out = np.zeros(end - at, bool)
    full = counts >= d.window
    if full.any():
        rows = np.lib.stride_tricks.sliding_window_view(history, d.window)[counts[full] - d.window]
        out[full] = _verdicts(d, values[at:end][full], np.sort(rows, axis=1))
    for i in np.flatnonzero(~full & (counts >= d.min_history)).tolist():  # a short history: the run's first steps
        window = tuple(history[: counts[i]].tolist())
        past = History(**{_field(d): window})
        out[i] = d.check(steps.evidence(at + i, past)) is not None
    return out


def _verdicts(d: LossSpike | GradNormSpike, value: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """`LossSpike.check` / `_RatioSpike.check` on full windows, each row sorted ascending."""
    median = sorted_median(ordered)
    if isinstance(d, LossSpike):
        mad = sorted_median(np.sort(np.abs(ordered - median[:, None]), axis=1))
        scale = np.maximum(np.maximum(MAD_SIGMA * mad, d.floor * np.abs(median)), 1e-12)
        finite = np.isfinite(value)
        z = np.where(finite, value - median, 0.0) / scale
        return finite & (z > d.z)
    finite = np.isfinite(value)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = value / median
    return np.where(finite, (median > 0) & (ratio > d.factor), True)


def sorted_median(ordered: np.ndarray, count: np.ndarray | None = None) -> np.ndarray:
    """`statistics.median` of each row's first ``count`` values (all of them without ``count``), rows sorted
    ascending: the middle value, or the mean of the two middle ones, in float64."""
    rows = np.arange(len(ordered))
    count = np.full(len(ordered), ordered.shape[1]) if count is None else count
    upper = ordered[rows, count // 2]
    lower = ordered[rows, np.maximum(count - 1, 0) // 2]
    return np.where(count % 2 == 1, upper, (lower + upper) / 2)


class _Histories:
    """The history a guard holds when it checks each step: the last ``keep`` accepted finite values of each
    field, once every verdict is in."""

    def __init__(self, steps: Steps, accepted: np.ndarray, pushable: dict[str, np.ndarray], keep: int) -> None:
        self.keep = keep
        self.kept = {
            f: (values, np.flatnonzero(accepted & pushable[f]))
            for f, values in (("loss", steps.loss), ("grad_norm", steps.grad_norm))
        }

    def at(self, k: int) -> History:
        def last(values: np.ndarray, kept: np.ndarray) -> tuple[float, ...]:
            count = int(np.searchsorted(kept, k))
            return tuple(values[kept[max(0, count - self.keep) : count]].tolist())

        return History(*(last(*self.kept[f]) for f in ("loss", "grad_norm")))
