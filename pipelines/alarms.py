"""Offline detector alarms: the guard's detectors run over every step of a recorded run, guarded or not.

A detector is a pure function of one step's `Evidence` and the accepted history
(`tracer.guard`), and everything the evidence holds is in the log: the step's loss and
its gradient norm before clipping (the `step` event's ``loss`` and ``grad_norm``), the
NaN/Inf count and the step fingerprint (the GRAD tensor records), the ABFT flags
(`abft` events). `step_facts` rebuilds it per step from the segments' evidence that the
diff's decoding hands on (`pipelines.evidence`), `score` runs the detectors over it
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

import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.evidence import SegmentEvidence
from pipelines.source import RunLayout
from pipelines.tables import SCHEMAS, named
from tracer.guard import AbftFlags, Detector, Evidence, Guard, History, TwinMismatch, default_guard
from tracer.guard.detectors import Alarm, GradNormSpike, LossSpike, NonFinite
from tracer.log.records import EventRecord

ALARMS, DECISIONS = "detector_alarms", "guard_decisions"
COMBINATION = "guard"  # the row name of the guard's default combination (`default_guard`)
DETECTORS: tuple[Detector, ...] = (NonFinite(), LossSpike(), GradNormSpike(), AbftFlags())


class StepFacts(NamedTuple):
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


class _Step:
    __slots__ = ("grads", "digest", "squares", "nonfinite", "flags", "faults", "abft", "guard", "done")

    def __init__(self) -> None:
        self.grads = False
        self.digest = hashlib.blake2b(digest_size=8)  # fed as `tracer.guard.step_fingerprint` feeds its own
        self.squares, self.nonfinite, self.flags, self.faults = 0.0, 0, 0, 0
        self.abft = False
        self.guard: Mapping[str, Any] | None = None
        self.done: Mapping[str, Any] | None = None  # the step event's fields


def step_facts(segments: Iterable[SegmentEvidence]) -> tuple[list[StepFacts], bool, list[EventRecord]]:
    """Per completed step (with a `step` event and gradients), in step order: what a detector sees. Also whether
    the run checked products with ABFT, and its `guard` events. ``segments``: one rank log's, in order."""
    steps: dict[int, _Step] = {}
    guards: list[EventRecord] = []
    for seg in segments:
        g = seg.grads
        if g is not None:
            for step, digest_input, squares, nonfinite in zip(g.steps.tolist(), g.digest_inputs(), g.squares.tolist(),
                                                              g.nonfinite.tolist()):
                s = steps.get(step) or steps.setdefault(step, _Step())
                s.grads = True
                s.digest.update(digest_input)
                s.squares += squares
                s.nonfinite += nonfinite
        for step, kind, fields in seg.events:
            s = steps.get(step) or steps.setdefault(step, _Step())
            if kind == "fault":
                s.faults += 1
            elif kind == "abft":
                s.abft = True
                s.flags += fields.get("verdict") == "flag"
            elif kind == "guard":
                s.guard = fields
                guards.append(EventRecord(kind, step, fields))
            elif kind == "step":
                s.done = fields
    facts = [_facts(step, s) for step, s in sorted(steps.items()) if s.done is not None and s.grads]
    return facts, any(s.abft for s in steps.values()), guards


def _facts(step: int, s: _Step) -> StepFacts:
    assert s.done is not None
    done = s.done
    loss, norm, wall = _number(done.get("loss")), _number(done.get("grad_norm")), _number(done.get("wall_s"))
    facts = StepFacts(step, loss, norm if norm is not None else math.sqrt(s.squares), s.nonfinite, s.flags,
                      int.from_bytes(s.digest.digest(), "little"), s.faults, wall_s=wall)
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


class Scored(NamedTuple):
    """A set of detectors scored together: ``name`` for one row per step for the set as a whole (fired if any
    fired; measured: how many), None for one row per step and detector."""

    detectors: tuple[Detector, ...]
    name: str | None = None


def score(facts: list[StepFacts], sets: list[Scored]) -> list[dict[int, dict[str, Alarm]]]:
    """Run each set of detectors over ``facts`` as a guard would: each step is checked against the history of the
    steps before it that none of the set flagged. Per set: the alarms (detector name -> `Alarm`) of each step
    that had any, by the step's index in ``facts``.

    Sets whose histories are still the same object share their checks: a detector's verdict depends only on the
    step and that history, so a detector in two sets is checked once until the sets' histories part (one set
    flags a step the other accepts), which is rare: most steps are accepted by every set. (A detector is
    shared by being the same object in both sets.)"""
    keeps = [Guard(detectors=s.detectors).keep for s in sets]
    pasts = [History()] * len(sets)
    fired: list[dict[int, dict[str, Alarm]]] = [{} for _ in sets]
    for k, f in enumerate(facts):
        shared: dict[int, tuple[Evidence, dict[int, Any], dict[int, History]]] = {}  # per history: its checks
        for i, s in enumerate(sets):
            past = pasts[i]
            entry = shared.get(id(past))
            if entry is None:
                e = Evidence(f.step, 0, f.loss, f.grad_norm, f.nonfinite, f.abft_flags, f.fingerprint, None, past)
                entry = shared[id(past)] = (e, {}, {})
            e, verdicts, accepted = entry
            alarms = None
            for d in s.detectors:
                a = verdicts[id(d)] if id(d) in verdicts else verdicts.setdefault(id(d), d.check(e))
                if a is not None:
                    alarms = alarms or fired[i].setdefault(k, {})
                    alarms[d.name] = a
            if alarms is None and keeps[i]:
                after = accepted.get(keeps[i])
                pasts[i] = after if after is not None else accepted.setdefault(keeps[i], past.after(e, keeps[i]))
    return fired


def run_alarms(facts: list[StepFacts], abft: bool, twin: Mapping[int, int] | None, rank: int = 0, run_id: str = "",
               node_label: str = "") -> pa.Table:
    """The ``detector_alarms`` rows of one run's steps: every shipped detector alone (`AbftFlags` where the run
    checked with ABFT, `TwinMismatch` where there is a twin), then the guard's default combination; per set,
    step by step."""
    combination = default_guard(abft=abft).detectors
    same = {id(d): c for d in DETECTORS for c in combination if type(c) is type(d) and c == d}
    sets = [Scored((same.get(id(d), d),)) for d in DETECTORS if abft or not isinstance(d, AbftFlags)]
    if twin is not None:
        sets.append(Scored((TwinMismatch(FingerprintTwin(twin)),)))
    sets.append(Scored(combination, COMBINATION))
    return _alarm_table(facts, sets, score(facts, sets), rank, run_id, node_label)


def _alarm_table(facts: list[StepFacts], sets: list[Scored], fired: list[dict[int, dict[str, Alarm]]], rank: int,
                 run_id: str, node_label: str) -> pa.Table:
    """Rows set by set, step by step, and within a step detector by detector: the columns that are the step's
    repeated with numpy, the alarms' filled in where there are any."""
    n = len(facts)
    per_step = list(zip(*facts)) if facts else [()] * len(StepFacts._fields)
    column = dict(zip(StepFacts._fields, per_step))
    names: list[str] = []  # the detector column's dictionary
    parts = []
    for s, alarms_at in zip(sets, fired):
        labels = [s.name] if s.name is not None else [d.name for d in s.detectors]
        k = len(labels)
        codes = np.arange(len(names), len(names) + k, dtype=np.int32)
        names += labels
        hit = np.zeros(n * k, bool)
        measured = np.zeros(n * k)
        threshold = np.zeros(n * k)
        detail: list[str | None] = [None] * (n * k)
        for step_index, alarms in alarms_at.items():
            for j, label in enumerate(labels):
                row = step_index * k + j
                if s.name is not None:
                    hit[row], measured[row], threshold[row] = True, float(len(alarms)), 1.0
                    detail[row] = ",".join(alarms)
                elif (a := alarms.get(label)) is not None:
                    hit[row], measured[row], threshold[row], detail[row] = True, a.measured, a.threshold, a.detail
        parts.append((k, np.tile(codes, n), hit, measured, threshold, detail))
    repeat = lambda values, dtype: np.concatenate([np.repeat(np.array(values, dtype), k) for k, *_ in parts])  # noqa: E731
    optional = lambda values: [v for k, *_ in parts for v in values for _ in range(k)]  # noqa: E731
    hit = np.concatenate([p[2] for p in parts])
    rows = len(hit)
    arrays = {
        "rank": pa.array(np.full(rows, rank, np.int32)),
        "run_id": pa.array([run_id] * rows, pa.string()),
        "node_label": pa.array([node_label] * rows, pa.string()),
        "step": pa.array(repeat(column["step"], np.int64)),
        "detector": pa.DictionaryArray.from_arrays(np.concatenate([p[1] for p in parts]), pa.array(names, pa.string())),
        "fired": pa.array(hit),
        "measured": pa.array(np.concatenate([p[3] for p in parts]), mask=~hit),
        "threshold": pa.array(np.concatenate([p[4] for p in parts]), mask=~hit),
        "detail": pa.array([d for p in parts for d in p[5]], pa.string()),
        "faults": pa.array(repeat(column["faults"], np.int64)),
        "guarded": pa.array(repeat(column["guarded"], bool)),
        "loss": pa.array(optional(column["loss"]), pa.float64()),
        "wall_s": pa.array(optional(column["wall_s"]), pa.float64()),
    }
    schema = SCHEMAS[ALARMS]
    return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)


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


class DetectorAlarms(beam.PTransform):
    """(rank, `SegmentEvidence`) of the golden and suspect runs (`pipelines.source.ReadRuns`) -> TABLES:
    detector_alarms and guard_decisions of the suspect (the golden run is the twin)."""

    def __init__(self, suspect: RunLayout) -> None:
        super().__init__()
        self.who = {rank: (r.header.run_id, r.header.node_label) for rank, r in suspect.ranks.items()}

    def expand(self, evidence: beam.PCollection) -> beam.PCollection:
        return (
            evidence
            | "Both runs of a rank" >> beam.GroupByKey()
            | "Score detectors" >> beam.FlatMap(lambda kv, who: rank_alarms(*kv, who), self.who)
        )


def readable(segments: Iterable[SegmentEvidence]) -> list[SegmentEvidence]:
    """One rank log's segments in order, up to the first unreadable one (that fails the diff on its own, in the
    errors table; what follows it is not read)."""
    out = []
    for seg in sorted(segments, key=lambda e: e.index):
        if not seg.readable:
            break
        out.append(seg)
    return out


def rank_alarms(rank: int, segments: Iterable[SegmentEvidence],
                who: Mapping[int, tuple[str, str]]) -> Iterator[tuple[str, pa.Table]]:
    by_side: dict[str, list[SegmentEvidence]] = {"golden": [], "suspect": []}
    for seg in segments:
        by_side[seg.side].append(seg)
    if not by_side["suspect"] or rank not in who:
        return
    facts, abft, guards = step_facts(readable(by_side["suspect"]))
    twin = {f.step: f.fingerprint for f in step_facts(readable(by_side["golden"]))[0]} if by_side["golden"] \
        else None
    run_id, node_label = who[rank]
    table = run_alarms(facts, abft, twin, rank, run_id, node_label)
    if table.num_rows:
        yield ALARMS, table
    if guards:
        who_row = {"rank": rank, "run_id": run_id, "node_label": node_label}
        yield named(DECISIONS, [{**who_row, **row} for row in decision_rows(guards)])
