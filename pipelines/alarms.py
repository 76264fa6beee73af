"""Offline detector alarms: the guard's detectors run over every step of a recorded run, guarded or not.

A detector is a pure function of one step's `Evidence` and the accepted history
(`tracer.guard`), and everything the evidence holds is in the log: the step's loss and
its gradient norm before clipping (the `step` event's ``loss`` and ``grad_norm``), the
NaN/Inf count and the step fingerprint (the GRAD tensor records), the ABFT flags
(`abft` events). `step_facts` rebuilds it per step, `score` runs the detectors over it
with the same history rule as the guard (a step a detector set flags never joins that
set's baseline), and `DetectorAlarms` does both for the suspect of a pair, with the
golden run as the twin for `TwinMismatch`, into the ``detector_alarms`` table; a guarded
run's `guard` events also become ``guard_decisions`` rows.

The ground truth of each row is ``faults``: the emulator's `fault` events of the run the
detectors saw. On a step the guard re-ran, that is the first run: its evidence and its
fault count come from the `guard` event's ``runs[0]`` (the log holds the accepted run's
records). `UpdateRmsSpike` needs the optimizer's state, which no log holds: it is not
scored here. docs/guard.md ("Scoring the detectors") has the rules.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np

from pipelines.source import RunLayout, read_file
from pipelines.tables import named
from tracer.errors import LogError
from tracer.guard import AbftFlags, Detector, Evidence, Guard, History, TwinMismatch, default_guard, step_fingerprint
from tracer.guard.detectors import GradNormSpike, LossSpike, NonFinite
from tracer.log import Sessions, read_segment_columns
from tracer.log.columns import TensorColumns
from tracer.log.records import EventRecord, Phase

ALARMS, DECISIONS = "detector_alarms", "guard_decisions"
COMBINATION = "guard"  # the row name of the guard's default combination (`default_guard`)
DETECTORS: tuple[Detector, ...] = (NonFinite(), LossSpike(), GradNormSpike(), AbftFlags())


@dataclass(frozen=True)
class StepFacts:
    """What the detectors saw of one step, and the ground truth: the fault events of that run."""

    step: int
    loss: float | None
    grad_norm: float
    nonfinite: int
    abft_flags: int
    fingerprint: int
    faults: int
    guarded: bool = False  # the guard re-ran it: the evidence is the guard event's first run
    wall_s: float | None = None  # the step's wall time (the `step` event's), re-runs included


@dataclass
class _Step:
    grads: list[tuple[str, int]] = field(default_factory=list)
    squares: float = 0.0
    nonfinite: int = 0
    flags: int = 0
    faults: int = 0
    abft: bool = False
    guard: Mapping[str, Any] | None = None
    done: Mapping[str, Any] | None = None  # the step event's fields


class GradGroup(NamedTuple):
    """One step's GRAD tensor records from one segment, as the column reader gives them: in log order, with
    their squared L2 norms and NaN/Inf counts already summed."""

    step: int
    grads: list[tuple[str, int]]  # (name, fingerprint)
    squares: float
    nonfinite: int


def step_facts(records: Iterable[GradGroup | EventRecord]) -> tuple[list[StepFacts], bool, list[EventRecord]]:
    """Per completed step (with a `step` event and gradients), in step order: what a detector sees. Also whether
    the run checked products with ABFT, and its `guard` events."""
    steps: dict[int, _Step] = {}
    guards: list[EventRecord] = []
    for r in records:
        s = steps.setdefault(r.step, _Step())
        if isinstance(r, GradGroup):
            s.grads += r.grads
            s.squares += r.squares
            s.nonfinite += r.nonfinite
        elif r.kind == "fault":
            s.faults += 1
        elif r.kind == "abft":
            s.abft = True
            s.flags += r.fields.get("verdict") == "flag"
        elif r.kind == "guard":
            s.guard = r.fields
            guards.append(r)
        elif r.kind == "step":
            s.done = r.fields
    facts = [_facts(step, s) for step, s in sorted(steps.items()) if s.done is not None and s.grads]
    return facts, any(s.abft for s in steps.values()), guards


def _facts(step: int, s: _Step) -> StepFacts:
    assert s.done is not None
    loss, norm, wall = (_number(s.done.get(k)) for k in ("loss", "grad_norm", "wall_s"))
    facts = StepFacts(step, loss, norm if norm is not None else math.sqrt(s.squares), s.nonfinite, s.flags,
                      step_fingerprint(s.grads), s.faults, wall_s=wall)
    runs = s.guard.get("runs") if s.guard is not None else None
    if not runs or not isinstance(runs[0], Mapping):
        return facts
    first = runs[0]
    events = first.get("events") if isinstance(first.get("events"), Mapping) else {}
    return StepFacts(step, _number(first.get("loss")), _number(first.get("grad_norm")) or facts.grad_norm,
                     int(first.get("nonfinite") or 0), s.flags, int(first.get("fingerprint") or 0),
                     int(events.get("fault", 0)), guarded=True, wall_s=wall)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class FingerprintTwin:
    """A twin whose step fingerprints are already known (the golden run's, from its log)."""

    steps: Mapping[int, int]

    def fingerprint(self, step: int) -> int | None:
        return self.steps.get(step)


class AlarmRow(NamedTuple):
    step: int
    detector: str
    fired: bool
    measured: float | None
    threshold: float | None
    detail: str | None
    faults: int
    guarded: bool
    loss: float | None  # the loss the detectors saw
    wall_s: float | None


def score(facts: list[StepFacts], detectors: tuple[Detector, ...], name: str | None = None) -> Iterator[AlarmRow]:
    """Run ``detectors`` together over ``facts`` as a guard would: each step is checked against the history of the
    steps before it that none of them flagged. One row per step and detector, or, with ``name``, one row per step
    for the set as a whole (fired if any fired; measured: how many)."""
    guard = Guard(detectors=detectors)
    past = History()
    for f in facts:
        e = Evidence(f.step, 0, f.loss, f.grad_norm, f.nonfinite, f.abft_flags, f.fingerprint, None, past)
        alarms = {a.detector: a for a in guard.check(e)}
        if not alarms:
            past = past.after(e, guard.keep)
        if name is not None:
            yield AlarmRow(f.step, name, bool(alarms), float(len(alarms)) if alarms else None, 1.0 if alarms else None,
                           ",".join(alarms) or None, f.faults, f.guarded, f.loss, f.wall_s)
            continue
        for d in detectors:
            a = alarms.get(d.name)
            yield AlarmRow(f.step, d.name, a is not None, a.measured if a else None, a.threshold if a else None,
                           a.detail if a else None, f.faults, f.guarded, f.loss, f.wall_s)


def run_alarms(facts: list[StepFacts], abft: bool, twin: Mapping[int, int] | None) -> list[AlarmRow]:
    """Every shipped detector alone (`AbftFlags` where the run checked with ABFT, `TwinMismatch` where there is a
    twin) and the guard's default combination, over one run's steps."""
    rows: list[AlarmRow] = []
    for d in DETECTORS:
        if abft or not isinstance(d, AbftFlags):
            rows += score(facts, (d,))
    if twin is not None:
        rows += score(facts, (TwinMismatch(FingerprintTwin(twin)),))
    rows += score(facts, default_guard(abft=abft).detectors, COMBINATION)
    return rows


def decision_rows(guards: Iterable[EventRecord]) -> list[dict[str, Any]]:
    """One row per `guard` event: which detectors fired, what the re-runs decided, and each run's faults."""
    rows = []
    for g in guards:
        f = g.fields
        alarms = [a for a in f.get("alarms") or () if isinstance(a, Mapping)]
        runs = [r for r in f.get("runs") or () if isinstance(r, Mapping)]
        faults = [int((r.get("events") or {}).get("fault", 0)) for r in runs]
        accepted = f.get("accepted")
        rows.append({
            "step": g.step, "detectors": [str(a.get("detector")) for a in alarms], "outcome": f.get("outcome"),
            "action": f.get("action"), "accepted": accepted if isinstance(accepted, int) else None,
            "runs": len(runs), "first_run_faults": faults[0] if faults else None,
            "accepted_run_faults": faults[accepted] if isinstance(accepted, int) and 0 <= accepted < len(faults)
            else None,
        })
    return rows


class RankLog(NamedTuple):
    """One rank of one run to read: its segments, in order."""

    side: str
    rank: int
    run_id: str
    node_label: str
    segments: tuple[tuple[int, str], ...]
    sessions: Sessions = Sessions()  # where a resumed log's records were superseded


class RunFacts(NamedTuple):
    side: str
    log: RankLog
    facts: list[StepFacts]
    abft: bool
    guards: list[EventRecord]


class DetectorAlarms(beam.PTransform):
    """The golden and suspect runs of a pair -> TABLES: detector_alarms and guard_decisions of the suspect (the
    golden run is the twin)."""

    def __init__(self, golden: RunLayout, suspect: RunLayout) -> None:
        super().__init__()
        self.logs = [RankLog(side, r.rank, r.header.run_id, r.header.node_label, tuple(r.segments), r.sessions)
                     for side, run in (("golden", golden), ("suspect", suspect)) for r in run.ranks.values()]

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "List logs" >> beam.Create(self.logs)
            | "Step evidence" >> beam.Map(read_facts)
            | "Key by rank" >> beam.Map(lambda f: (f.log.rank, f))
            | "Both runs of a rank" >> beam.GroupByKey()
            | "Score detectors" >> beam.FlatMapTuple(rank_alarms)
        )


def read_facts(log: RankLog) -> RunFacts:
    """Read one rank's log through Beam's file systems and tracer's column reader (a resumed log as its one
    timeline); corruption is skipped here (the diff's own read reports it)."""
    def records() -> Iterator[GradGroup | EventRecord]:
        for i, (index, path) in enumerate(log.segments):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    seg = read_segment_columns(read_file(path), path, last=i == len(log.segments) - 1,
                                               on_corruption="skip", session_end=log.sessions.ends_session(index),
                                               cutoff=log.sessions.cutoff(index))
            except (LogError, OSError):
                return  # an unreadable segment fails the diff on its own (errors table)
            yield from _grad_groups(seg.tensors)
            for entry in seg.events:
                if isinstance(entry.record, EventRecord):
                    yield entry.record

    facts, abft, guards = step_facts(records())
    return RunFacts(log.side, log, facts, abft, guards)


def _grad_groups(t: TensorColumns) -> Iterator[GradGroup]:
    """A segment's GRAD records, one group per run of equal steps (log order), sums taken with numpy."""
    grad = t.phase == int(Phase.GRAD)
    if not grad.any():
        return
    steps, names, fps = t.step[grad], t.name[grad], t.fingerprint[grad]
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    squares = np.add.reduceat(t.l2[grad].astype(np.float64) ** 2, starts).tolist()
    nonfinite = np.add.reduceat(t.nan[grad] + t.inf[grad], starts).tolist()
    bounds = [*starts.tolist(), len(steps)]
    strings, names, fps, steps = t.strings, names.tolist(), fps.tolist(), steps.tolist()
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        yield GradGroup(steps[a], [(strings[n], f) for n, f in zip(names[a:b], fps[a:b])], squares[k], nonfinite[k])


def rank_alarms(rank: int, runs: Iterable[RunFacts]) -> Iterator[tuple[str, Any]]:
    by_side = {r.side: r for r in runs}
    suspect, golden = by_side.get("suspect"), by_side.get("golden")
    if suspect is None:
        return
    twin = {f.step: f.fingerprint for f in golden.facts} if golden is not None else None
    who = {"rank": rank, "run_id": suspect.log.run_id, "node_label": suspect.log.node_label}
    rows = [{**who, **row._asdict()} for row in run_alarms(suspect.facts, suspect.abft, twin)]
    if rows:
        yield named(ALARMS, rows)
    if suspect.guards:
        yield named(DECISIONS, [{**who, **row} for row in decision_rows(suspect.guards)])
