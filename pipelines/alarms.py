"""Offline detector alarms: the guard's detectors run over every step of a recorded run, guarded or not.

A detector is a pure function of one step's `Evidence` and the accepted history
(`tracer.guard`), and everything the evidence holds is in the log: the step's loss and
its gradient norm before clipping (the `step` event's ``loss`` and ``grad_norm``), the
NaN/Inf count and the step fingerprint (the GRAD tensor records), the ABFT flags
(`abft` events). `step_facts` rebuilds it per step from the segments' evidence that the
diff's decoding hands on (`pipelines.segment_evidence`), `score` runs the detectors over it
with the same history rule as the guard (a step a detector set flags never joins that
set's baseline), and `DetectorAlarms` does both for the suspect of a pair, with the
golden run as the twin for `TwinMismatch`, into the ``detector_alarms`` table; a guarded
run's `guard` events also become ``guard_decisions`` rows. Replica agreement compares ranks,
which no one rank's evidence holds: a run that checked it (``Guard(replicas=...)`` in the
header) gets rows of detector ``replica_agreement``, fired where the rank's `replicas` event
blames it or names a tie it is part of.

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

from pipelines.log_source import RunLayout
from pipelines.scoring import Fired, Scored, Steps, score
from pipelines.segment_evidence import GradGroups, SegmentEvidence
from pipelines.tables import SCHEMAS, named
from tracer.guard import AbftFlags, Detector, ReplicaAgreement, TwinMismatch, default_guard
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
    replicas: Mapping[str, Any] | None = None  # the step's `replicas` event: its replicas disagreed


def step_facts(segments: Iterable[SegmentEvidence]) -> tuple[list[StepFacts], bool, list[EventRecord]]:
    """Per completed step (with a `step` event and gradients), in step order: what a detector sees. Also whether
    the run checked products with ABFT, and its `guard` events. ``segments``: one rank log's, in order."""
    segments = list(segments)
    grads = _grad_sums([seg.grads for seg in segments if seg.grads is not None])
    done: dict[int, Mapping[str, Any]] = {}  # the step event's fields
    faults: dict[int, int] = {}
    flags: dict[int, int] = {}
    guard: dict[int, Mapping[str, Any]] = {}
    replicas: dict[int, Mapping[str, Any]] = {}
    guards: list[EventRecord] = []
    abft = False
    for seg in segments:
        for step, kind, fields in seg.events:
            if kind == "step":
                done[step] = fields
            elif kind == "fault":
                faults[step] = faults.get(step, 0) + 1
            elif kind == "abft":
                abft = True
                flags[step] = flags.get(step, 0) + (fields.get("verdict") == "flag")
            elif kind == "guard":
                guard[step] = fields
                guards.append(EventRecord(kind, step, fields))
            elif kind == "replicas":
                replicas[step] = fields
    facts = [
        _facts(step, *grads[step], done[step], faults.get(step, 0), flags.get(step, 0), guard.get(step))._replace(
            replicas=replicas.get(step)
        )
        for step in sorted(done.keys() & grads.keys())
    ]
    return facts, abft, guards


def _grad_sums(groups: list[GradGroups]) -> dict[int, tuple[int, float, int]]:
    """Per step with gradients: its step fingerprint (fed as `tracer.guard.step_fingerprint` feeds its own),
    squared L2 norm and NaN/Inf count, over every group of that step in log order."""
    if not groups:
        return {}
    steps = np.concatenate([g.steps for g in groups]).tolist()
    inputs = [view for g in groups for view in g.digest_inputs()]
    squares = np.concatenate([g.squares for g in groups]).tolist()
    nonfinite = np.concatenate([g.nonfinite for g in groups]).tolist()
    if len(set(steps)) == len(steps):  # each step in one group: the usual log
        fingerprints = [int.from_bytes(hashlib.blake2b(v, digest_size=8).digest(), "little") for v in inputs]
        return dict(zip(steps, zip(fingerprints, squares, nonfinite)))
    sums: dict[int, tuple[Any, float, int]] = {}  # a step split across segments
    for step, view, sq, nf in zip(steps, inputs, squares, nonfinite):
        h, total, count = sums.get(step) or (hashlib.blake2b(digest_size=8), 0.0, 0)
        h.update(view)
        sums[step] = (h, total + sq, count + nf)
    return {step: (int.from_bytes(h.digest(), "little"), sq, nf) for step, (h, sq, nf) in sums.items()}


def _facts(
    step: int,
    fingerprint: int,
    squares: float,
    nonfinite: int,
    done: Mapping[str, Any],
    faults: int,
    flags: int,
    guard: Mapping[str, Any] | None,
) -> StepFacts:
    loss, norm, wall = _number(done.get("loss")), _number(done.get("grad_norm")), _number(done.get("wall_s"))
    if norm is None:
        norm = math.sqrt(squares)
    runs = guard.get("runs") if guard is not None else None
    if not runs or not isinstance(runs[0], Mapping):
        return StepFacts(step, loss, norm, nonfinite, flags, fingerprint, faults, wall_s=wall)
    first = runs[0]
    events = first.get("events") if isinstance(first.get("events"), Mapping) else {}
    return StepFacts(
        step,
        _number(first.get("loss")),
        _number(first.get("grad_norm")) or norm,
        int(first.get("nonfinite") or 0),
        flags,
        int(first.get("fingerprint") or 0),
        int(events.get("fault", 0)),
        guarded=True,
        wall_s=wall,
    )


def _number(value: Any) -> float | None:
    return float(value) if type(value) in (float, int) else None  # bool is an int, but no number here


@dataclass(frozen=True)
class FingerprintTwin:
    """A twin whose step fingerprints are already known (the golden run's, from its log)."""

    steps: Mapping[int, int]

    def fingerprint(self, step: int) -> int | None:
        return self.steps.get(step)


def run_alarms(
    facts: list[StepFacts],
    abft: bool,
    twin: Mapping[int, int] | None,
    rank: int = 0,
    run_id: str = "",
    node_label: str = "",
    replicas: bool = False,
) -> pa.Table:
    """The ``detector_alarms`` rows of one run's steps: every shipped detector alone (`AbftFlags` where the run
    checked with ABFT, `TwinMismatch` where there is a twin), then the guard's default combination, then replica
    agreement where the run checked it; per set, step by step."""
    combination = default_guard(abft=abft).detectors
    sets = [Scored((d,)) for d in DETECTORS if abft or not isinstance(d, AbftFlags)]
    if twin is not None:
        sets.append(Scored((TwinMismatch(FingerprintTwin(twin)),)))
    sets.append(Scored(combination, COMBINATION))
    fired = score(_steps(facts), sets)
    if replicas:
        sets.append(Scored((ReplicaAgreement(),)))  # type: ignore[arg-type]  # logged, not computed from evidence
        fired.append(replica_alarms(facts, rank))
    return _alarm_table(facts, sets, fired, rank, run_id, node_label)


def replica_alarms(facts: list[StepFacts], rank: int) -> Fired:
    """The steps whose `replicas` event blames ``rank``, or is a tie among replicas ``rank`` is one of."""
    fired: Fired = {}
    for k, f in enumerate(facts):
        e = f.replicas
        if e is None or not (rank in (e.get("ranks") or ()) or (e.get("tie") and rank in (e.get("replicas") or ()))):
            continue
        fired[k] = {
            ReplicaAgreement.name: Alarm(
                ReplicaAgreement.name,
                float(e.get("measured") or 0.0),
                float(e.get("threshold") or 0.0),
                str(e.get("detail") or ""),
            )
        }
    return fired


def checks_replicas(extra: Mapping[str, Any]) -> bool:
    """Whether a run header's ``extra`` says the run checked replica agreement (``Guard(replicas=...)``)."""
    guard = extra.get("guard")
    return isinstance(guard, Mapping) and guard.get("replicas") is not None


def _steps(facts: list[StepFacts]) -> Steps:
    loss = [f.loss for f in facts]
    return Steps(
        step=np.array([f.step for f in facts], np.int64),
        loss=np.array([math.nan if x is None else x for x in loss], np.float64),
        has_loss=np.array([x is not None for x in loss], bool),
        grad_norm=np.array([f.grad_norm for f in facts], np.float64),
        nonfinite=np.array([f.nonfinite for f in facts], np.int64),
        abft_flags=np.array([f.abft_flags for f in facts], np.int64),
        fingerprint=[f.fingerprint for f in facts],
    )


def _alarm_table(
    facts: list[StepFacts], sets: list[Scored], fired: list[Fired], rank: int, run_id: str, node_label: str
) -> pa.Table:
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
        rows.append(
            {
                "step": g.step,
                "detectors": [str(a.get("detector")) for a in alarms],
                "outcome": f.get("outcome"),
                "action": f.get("action"),
                "accepted": accepted if isinstance(accepted, int) else None,
                "runs": len(runs),
                "first_run_faults": faults[0] if faults else None,
                "accepted_run_faults": faults[accepted]
                if isinstance(accepted, int) and 0 <= accepted < len(faults)
                else None,
            }
        )
    return rows


class DetectorAlarms(beam.PTransform):
    """(rank, `SegmentEvidence`) of the golden and suspect runs (`pipelines.log_source.ReadRuns`) -> TABLES:
    detector_alarms and guard_decisions of the suspect (the golden run is the twin)."""

    def __init__(self, suspect: RunLayout) -> None:
        super().__init__()
        self.who = {
            rank: (r.header.run_id, r.header.node_label, checks_replicas(r.header.extra))
            for rank, r in suspect.ranks.items()
        }

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


def rank_alarms(
    rank: int, segments: Iterable[SegmentEvidence], who: Mapping[int, tuple[str, str, bool]]
) -> Iterator[tuple[str, pa.Table]]:
    by_side: dict[str, list[SegmentEvidence]] = {"golden": [], "suspect": []}
    for seg in segments:
        by_side[seg.side].append(seg)
    if not by_side["suspect"] or rank not in who:
        return
    facts, abft, guards = step_facts(readable(by_side["suspect"]))
    twin = {f.step: f.fingerprint for f in step_facts(readable(by_side["golden"]))[0]} if by_side["golden"] else None
    run_id, node_label, replicas = who[rank]
    table = run_alarms(facts, abft, twin, rank, run_id, node_label, replicas)
    if table.num_rows:
        yield ALARMS, table
    if guards:
        who_row = {"rank": rank, "run_id": run_id, "node_label": node_label}
        yield named(DECISIONS, [{**who_row, **row} for row in decision_rows(guards)])
