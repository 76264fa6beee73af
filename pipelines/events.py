"""What each event kind becomes: typed records for the scoring steps, rows for the replay tables.

`RouteEvents` sends every batch of events (``((side, kind, rank), EventBatch)`` from
`pipelines.log_source`) where it is used, in one step: faults and ABFT checks of the
golden and suspect runs, their `step` events (the loss curves), and the RQ1/RQ2
events of replay logs and the fine-tune evaluations of every run (RQ3) straight into
their tables, and the golden and suspect runs' sharpness estimates. The kinds and fields are those of
docs/log-format.md ("Event kinds"). Fields are read leniently: a missing or ill-typed
field becomes null and is counted in the ``event_fields_unreadable`` metric, so no
event is dropped for a field it lacks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipelines.log_source import DIFFED, NAMESPACE, EventBatch, EventRow
from pipelines.tables import TABLES, named
from pipelines.tagged_outputs import split
from tracer.log import Phase

FAULTS, CHECKS, STEPS = "faults", "checks", "steps"
SITE_MISMATCH, GRAD_NOISE = "site_mismatch", "grad_noise"
NUMBER = (int, float)
_PHASE_OF = {"forward": int(Phase.FORWARD), "backward": int(Phase.BACKWARD)}


class Fields:
    """Typed, lenient access to an event's fields; counts what it could not read."""

    def __init__(self, fields: Mapping[str, Any], unreadable: Any = None) -> None:
        self.fields, self.unreadable = fields, unreadable

    def get(self, name: str, kind: type | tuple[type, ...]) -> Any:
        value = self.fields.get(name)
        if value is None:
            return None
        if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            return float(value) if kind == NUMBER else value
        if self.unreadable is not None:
            self.unreadable.inc()
        return None

    def ints(self, name: str) -> list[int] | None:
        value = self.get(name, list)
        return value if value is not None and all(type(v) is int for v in value) else None

    def floats(self, name: str) -> list[float] | None:
        value = self.get(name, list)
        if value is None or not all(isinstance(v, NUMBER) and not isinstance(v, bool) for v in value):
            return None
        return [float(v) for v in value]


class Fault(NamedTuple):
    """One injected corruption, as the fault emulator logged it."""

    side: str
    rank: int
    step: int
    segment: int
    offset: int
    microbatch: int | None
    site: str | None
    op: str | None
    phase: str | None
    kind: str | None
    elements: int | None
    indices: list[int] | None
    original: list[float] | None
    corrupted: list[float] | None
    detail: str | None  # JSON

    @property
    def id(self) -> tuple[str, int, int, int]:
        return self.side, self.rank, self.segment, self.offset

    @property
    def unit(self) -> tuple[Any, ...]:
        """What an ABFT check must share to have checked this fault's op call."""
        return self.side, self.step, self.microbatch, self.site, self.phase, self.op


class AbftCheck(NamedTuple):
    side: str
    rank: int
    step: int
    microbatch: int | None
    site: str | None
    op: str | None
    phase: str | None
    m: int | None
    k: int | None
    n: int | None
    residual: float | None
    bound: float | None
    verdict: str | None

    @property
    def unit(self) -> tuple[Any, ...]:
        return self.side, self.step, self.microbatch, self.site, self.phase, self.op


def parse_fault(side: str, row: EventRow, unreadable: Any = None) -> Fault:
    f = Fields(row.fields, unreadable)
    detail = f.get("detail", dict)
    return Fault(
        side,
        row.rank,
        row.step,
        row.segment,
        row.offset,
        f.get("microbatch", int),
        f.get("site", str),
        f.get("op", str),
        f.get("phase", str),
        f.get("kind", str),
        f.get("elements", int),
        f.ints("index"),
        f.floats("original"),
        f.floats("corrupted"),
        json.dumps(detail, sort_keys=True, default=repr) if detail is not None else None,
    )


def parse_abft(side: str, row: EventRow, unreadable: Any = None) -> AbftCheck:
    f = Fields(row.fields, unreadable)
    shape = f.ints("shape")
    m, k, n = shape if shape is not None and len(shape) == 3 else (None, None, None)
    return AbftCheck(
        side,
        row.rank,
        row.step,
        f.get("microbatch", int),
        f.get("site", str),
        f.get("op", str),
        f.get("phase", str),
        m,
        k,
        n,
        f.get("residual", NUMBER),
        f.get("bound", NUMBER),
        f.get("verdict", str),
    )


def fault_units(faults: Iterable[Fault], site_names: Iterable[str]) -> Iterator[tuple[Fault, str | None, int | None]]:
    """Each fault with the traced site it happened in (the longest site name equal to its `site` or a
    dotted prefix of it) and that site's Phase value; (None, None) when no traced site holds it."""
    sites = sorted(site_names, key=len, reverse=True)
    for f in faults:
        phase = _PHASE_OF.get(f.phase or "")
        traced = None
        if f.site and phase is not None and f.microbatch is not None:
            traced = next((s for s in sites if f.site == s or f.site.startswith(s + ".")), None)
        yield f, traced, phase if traced is not None else None


def site_mismatch_row(run_id: str, row: EventRow, unreadable: Any = None) -> dict[str, Any]:
    f = Fields(row.fields, unreadable)
    return {
        "replay_run_id": run_id,
        "rank": row.rank,
        "step": row.step,
        "microbatch": f.get("microbatch", int),
        "site": f.get("site", str),
        "phase": f.get("phase", str),
        "elements": f.get("elements", int),
        "mismatched": f.get("mismatched", int),
        "frequency": f.get("frequency", NUMBER),
        "severity": f.get("severity", NUMBER),
        "max_rel": f.get("max_rel", NUMBER),
    }


def grad_noise_row(run_id: str, row: EventRow, unreadable: Any = None) -> dict[str, Any]:
    f = Fields(row.fields, unreadable)
    return {
        "replay_run_id": run_id,
        "rank": row.rank,
        "step": row.step,
        "name": f.get("name", str),
        "diff_l2": f.get("diff_l2", NUMBER),
        "golden_l2": f.get("golden_l2", NUMBER),
        "ratio": f.get("ratio", NUMBER),
    }


def finetune_eval_row(run_id: str, row: EventRow, unreadable: Any = None) -> dict[str, Any]:
    f = Fields(row.fields, unreadable)
    return {
        "run_id": run_id,
        "rank": row.rank,
        "step": row.step,
        "task": f.get("task", str),
        "examples": f.get("examples", int),
        "correct": f.get("correct", int),
        "accuracy": f.get("accuracy", NUMBER),
        "chance": f.get("chance", NUMBER),
        "collapsed": f.get("collapsed", bool),
    }


def sharpness_row(run_id: str, row: EventRow, unreadable: Any = None) -> dict[str, Any]:
    f = Fields(row.fields, unreadable)
    return {
        "run_id": run_id,
        "rank": row.rank,
        "step": row.step,
        "value": f.get("value", NUMBER),
        "iterations": f.get("iterations", int),
        "converged": f.get("converged", bool),
        "residual": f.get("residual", NUMBER),
        "method": f.get("method", str),
        "microbatch": f.get("microbatch", int),
    }


def finetune_prediction_row(run_id: str, row: EventRow, unreadable: Any = None) -> dict[str, Any]:
    f = Fields(row.fields, unreadable)
    return {
        "run_id": run_id,
        "rank": row.rank,
        "step": row.step,
        "task": f.get("task", str),
        "example": f.get("example", int),
        "predicted": f.get("predicted", int),
        "answer": f.get("answer", int),
    }


# Event kind -> (table, row maker): events of any run that become rows of their own table.
_ROWS = {
    SITE_MISMATCH: (SITE_MISMATCH, site_mismatch_row),
    GRAD_NOISE: (GRAD_NOISE, grad_noise_row),
    "finetune_eval": ("finetune_eval", finetune_eval_row),
    "finetune_prediction": ("finetune_predictions", finetune_prediction_row),
    "sharpness": ("sharpness", sharpness_row),
}


class RouteEvents(beam.PTransform):
    """((side, kind, rank), EventBatch) -> {FAULTS: Fault, CHECKS: AbftCheck, STEPS: (rank, (side, batch)),
    TABLES: the rows of site_mismatch, grad_noise, finetune_eval, finetune_predictions and sharpness}."""

    def __init__(self, run_ids: Mapping[tuple[str, int], str]) -> None:
        super().__init__()
        self.run_ids = dict(run_ids)  # (side, rank) -> run id, of every run

    def expand(self, events: beam.PCollection) -> dict[str, beam.PCollection]:
        routed = events | "Route" >> beam.ParDo(_Route(self.run_ids))
        return split(routed, (FAULTS, CHECKS, STEPS, TABLES), "Routed")


class _Route(beam.DoFn):
    def __init__(self, run_ids: dict[tuple[str, int], str]) -> None:
        self.run_ids = run_ids

    def setup(self) -> None:
        self.unreadable = Metrics.counter(NAMESPACE, "event_fields_unreadable")

    def process(self, element: tuple[tuple[str, str, int], EventBatch]) -> Iterator[tuple[str, Any]]:
        (side, kind, rank), batch = element
        if side in DIFFED:
            if kind == "fault":
                for row in batch.rows:
                    yield FAULTS, parse_fault(side, row, self.unreadable)
            elif kind == "abft":
                for row in batch.rows:
                    yield CHECKS, parse_abft(side, row, self.unreadable)
            elif kind == "step":
                yield STEPS, (rank, (side, batch))
        if kind in _ROWS:
            (name, to_row), run_id = _ROWS[kind], self.run_ids[side, rank]
            yield TABLES, named(name, (to_row(run_id, r, self.unreadable) for r in batch.rows))
