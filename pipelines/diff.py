"""Diff the tensor records of a golden and a suspect run: key -> join -> diff.

Both runs' record batches are keyed by (rank, step bucket) in `pipelines.source`; one
GroupByKey brings a bucket's batches from both sides together, and `diff_bucket`
joins them with numpy on (step, microbatch, name, phase, occurrence), where
occurrence numbers repeated records of one key (a module called twice in a forward)
in log order. Steps after the last one both runs completed are not compared.

Execution order, for first divergences, is (step, microbatch-level phases before the
step-level GRAD and PARAM, microbatch, INPUT < FORWARD < BACKWARD < GRAD < PARAM,
position in the golden log): the order in which a training step produces the tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from pipelines.events import Fault, fault_units
from pipelines.pairing import in_lost_steps
from pipelines.source import NAMESPACE
from pipelines.tables import PHASES, SCHEMAS, STATUSES, TABLES
from pipelines.tags import split
from tracer.log import Phase

EVENT_DIFFS, DIVERGENCE_STEPS, FIRST = "event_diffs", "divergence_steps", "first_divergence"
FINDINGS = "findings"  # per-rank results of a bucket, gathered by `pipelines.detections.RankFindings`
EQUAL, DIFFER, GOLDEN_ONLY, SUSPECT_ONLY = range(4)  # indexes into tables.STATUSES
_SITE_PHASES = (int(Phase.FORWARD), int(Phase.BACKWARD))
# Phase value -> rank in a microbatch's execution (INPUT first, then FORWARD, BACKWARD; GRAD, PARAM after).
_PHASE_ORDER = np.zeros(len(Phase), np.int8)
for _rank, _phase in enumerate((Phase.INPUT, Phase.FORWARD, Phase.BACKWARD, Phase.GRAD, Phase.PARAM)):
    _PHASE_ORDER[int(_phase)] = _rank
_STEP_LEVEL = np.isin(np.arange(len(Phase)), [int(Phase.GRAD), int(Phase.PARAM)])
_PHASE_DICT = pa.array(PHASES, pa.string())
_STATUS_DICT = pa.array(STATUSES, pa.string())

FirstDifference = tuple[tuple[int, ...], dict[str, Any]]  # (execution-order key, event_diffs row)


@dataclass
class BucketFindings:
    """What one bucket contributes to its rank's first divergence and detection scores."""

    first: FirstDifference | None
    scores: tuple[int, int, int, int, int, int]  # units, tp, fp, fn, tn, propagated
    fault_hits: list[tuple[tuple[Any, ...], dict[str, Any]]]  # (fault id, traced_site and fingerprint_detected)


@dataclass
class BucketDiff:
    event_diffs: pa.Table
    divergence_steps: pa.Table
    findings: BucketFindings


class DiffTensors(beam.PTransform):
    """((rank, bucket), (side, batch)) -> {TABLES: event_diffs, divergence_steps; FINDINGS: (rank, findings)}.

    Side inputs: `bounds`, (rank, last compared step); `faults`, every `Fault` of both runs; `lost`, (rank,
    step ranges corruption made unknown).
    """

    def __init__(self, bounds: beam.PCollection, faults: beam.PCollection, lost: beam.PCollection | None = None) -> None:
        super().__init__()
        self.bounds, self.faults, self.lost = bounds, faults, lost

    def expand(self, batches: beam.PCollection) -> dict[str, beam.PCollection]:
        diffs = (
            batches
            | "Join buckets" >> beam.GroupByKey()
            | "Diff buckets" >> beam.ParDo(
                _DiffBucket(), beam.pvalue.AsDict(self.bounds), beam.pvalue.AsList(self.faults),
                beam.pvalue.AsDict(self.lost) if self.lost is not None else {},
            )
        )
        return split(diffs, (TABLES, FINDINGS), "Diffs")


def earliest(firsts: Iterable[FirstDifference | None]) -> FirstDifference | None:
    """The first difference in execution order among buckets' candidates."""
    return min((f for f in firsts if f is not None), key=lambda f: f[0], default=None)


class _DiffBucket(beam.DoFn):
    def setup(self) -> None:
        self.compared = Metrics.counter(NAMESPACE, "events_compared")
        self.differing = Metrics.counter(NAMESPACE, "events_differing")

    def process(self, element: Any, bounds: dict[int, int], faults: list[Fault], lost: dict[int, Any]) -> Iterator[Any]:
        (rank, _), batches = element
        bound = bounds.get(rank)
        if bound is None:
            return
        sides: dict[str, list[pa.RecordBatch]] = {"golden": [], "suspect": []}
        for side, batch in batches:
            sides[side].append(batch)
        result = diff_bucket(rank, sides["golden"], sides["suspect"], bound, faults, lost.get(rank, ()))
        if result is None:
            return
        n = result.event_diffs.num_rows
        self.compared.inc(n)
        self.differing.inc(n - int(result.event_diffs.column("equal").to_numpy(zero_copy_only=False).sum()))
        yield TABLES, (EVENT_DIFFS, result.event_diffs)
        yield TABLES, (DIVERGENCE_STEPS, result.divergence_steps)
        yield FINDINGS, (rank, ("bucket", result.findings))


_DTYPES = {"step": np.int64, "microbatch": np.int64, "name": np.int32, "phase": np.int8, "fingerprint": np.uint64,
           "l2": np.float32, "absmax": np.float32, "nan": np.int64, "inf": np.int64, "meta": np.int32,
           "segment": np.int32, "offset": np.int64}


class _Side:
    """One run's records of a bucket as numpy columns; names and metas as codes into shared dictionaries."""

    def __init__(self, batches: Iterable[pa.RecordBatch], bound: int, names: dict[str, int], metas: dict[str, int]):
        cols: dict[str, list[np.ndarray]] = {k: [] for k in _DTYPES}
        for b in batches:
            keep = b.column("step").to_numpy() <= bound
            if not keep.any():
                continue
            for key in cols:
                col = b.column(key)
                if key in ("name", "meta"):
                    table = names if key == "name" else metas
                    lut = np.array([table.setdefault(s, len(table)) for s in col.dictionary.to_pylist()], np.int32)
                    values = lut[col.indices.to_numpy()]
                else:
                    values = col.to_numpy()
                cols[key].append(values[keep])
        self.n = sum(len(a) for a in cols["step"])
        self.cols = {k: np.concatenate(v) if v else np.zeros(0, _DTYPES[k]) for k, v in cols.items()}
        self.position = (self.cols["segment"].astype(np.int64) << 40) | self.cols["offset"].astype(np.int64)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.cols[key]


def diff_bucket(
    rank: int, golden: Iterable[pa.RecordBatch], suspect: Iterable[pa.RecordBatch], bound: int,
    faults: Sequence[Fault] = (), lost: Sequence[tuple[int | None, int | None]] = (),
) -> BucketDiff | None:
    """Join one bucket's records of both runs (steps <= `bound`) and derive its rows of every diff table.

    `lost`: step ranges corruption made unknown on either side. Corruption is never data: a record
    one side lacks there is not a difference (no row), and no difference there is a first divergence.
    """
    names: dict[str, int] = {}
    metas: dict[str, int] = {}
    g, s = _Side(golden, bound, names, metas), _Side(suspect, bound, names, metas)
    if g.n + s.n == 0:
        return None
    gi, si, occurrence = _match(g, s, len(names))
    if lost:
        unknown = in_lost_steps(_pick(g["step"], s["step"], gi, si), lost) & ((gi < 0) | (si < 0))
        gi, si, occurrence = gi[~unknown], si[~unknown], occurrence[~unknown]
    order_cols = {k: _pick(g[k], s[k], gi, si) for k in ("step", "microbatch", "name", "phase")}
    position = _pick(g.position, s.position, gi, si)
    phase = order_cols["phase"].astype(np.intp)
    order = np.lexsort((position, _PHASE_ORDER[phase], order_cols["microbatch"], _STEP_LEVEL[phase], order_cols["step"]))
    gi, si, occurrence, position = gi[order], si[order], occurrence[order], position[order]
    step, mb, name, phase = (order_cols[k][order] for k in ("step", "microbatch", "name", "phase"))
    matched = (gi >= 0) & (si >= 0)
    equal = matched & (g["fingerprint"][np.maximum(gi, 0)] == s["fingerprint"][np.maximum(si, 0)])
    status = np.where(matched, np.where(equal, EQUAL, DIFFER), np.where(gi >= 0, GOLDEN_ONLY, SUSPECT_ONLY))
    name_dict, meta_dict = pa.array(list(names), pa.string()), pa.array(list(metas), pa.string())
    n = len(gi)
    table = pa.Table.from_arrays(
        [
            pa.array(np.full(n, rank, np.int32)),
            pa.array(step.astype(np.int64)),
            pa.array(mb.astype(np.int64)),
            pa.DictionaryArray.from_arrays(pa.array(name.astype(np.int32)), name_dict),
            pa.DictionaryArray.from_arrays(pa.array(phase.astype(np.int8)), _PHASE_DICT),
            pa.array(occurrence.astype(np.int32)),
            pa.DictionaryArray.from_arrays(pa.array(status.astype(np.int8)), _STATUS_DICT),
            pa.array(equal),
            _take(g["fingerprint"], gi), _take(s["fingerprint"], si),
            _take(g["l2"], gi), _take(s["l2"], si),
            _take(g["absmax"], gi), _take(s["absmax"], si),
            _take(g["nan"], gi), _take(s["nan"], si),
            _take(g["inf"], gi), _take(s["inf"], si),
            pa.DictionaryArray.from_arrays(pa.array(_pick(g["meta"], s["meta"], gi, si).astype(np.int32)), meta_dict),
            _take(g["segment"], gi), _take(g["offset"], gi),
            _take(s["segment"], si), _take(s["offset"], si),
        ],
        schema=SCHEMAS[EVENT_DIFFS],
    )
    differ = status != EQUAL
    first = None
    candidates = differ & ~in_lost_steps(step, lost) if lost else differ
    if candidates.any():
        i = int(np.argmax(candidates))
        key = (int(step[i]), int(_STEP_LEVEL[phase[i]]), int(mb[i]), int(_PHASE_ORDER[phase[i]]), int(position[i]))
        first = (key, table.slice(i, 1).to_pylist()[0])
    steps = _divergence_steps(rank, step, mb, name, phase, differ, list(names))
    hits, scores = _fault_scores(rank, step, mb, name, phase, differ, names, faults, bound)
    return BucketDiff(table, steps, BucketFindings(first, scores, hits))


def _match(g: _Side, s: _Side, n_names: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row indexes into each side (-1: absent) of every joined event (matched, golden-only, suspect-only),
    and each event's occurrence."""
    gk, sk, span = _keys(g, s, n_names)
    _, gm, sm = np.intersect1d(gk, sk, assume_unique=True, return_indices=True)
    g_only = np.setdiff1d(np.arange(g.n), gm, assume_unique=True)
    s_only = np.setdiff1d(np.arange(s.n), sm, assume_unique=True)
    none = lambda k: np.full(k, -1, np.int64)  # noqa: E731
    gi = np.concatenate([gm, g_only, none(len(s_only))]).astype(np.int64)
    si = np.concatenate([sm, none(len(g_only)), s_only]).astype(np.int64)
    return gi, si, _pick(gk % span, sk % span, gi, si)


def _keys(g: _Side, s: _Side, n_names: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One unique int64 per record, (step, microbatch, name, phase, occurrence) packed; and the occurrence span."""
    both = lambda k: np.concatenate([g[k], s[k]]).astype(np.int64)  # noqa: E731
    step, mb = both("step"), both("microbatch")
    lo_step, lo_mb = int(step.min()), int(mb.min())
    dims = (int(step.max()) - lo_step + 1, int(mb.max()) - lo_mb + 1, max(n_names, 1), len(Phase))
    base = np.ravel_multi_index((step - lo_step, mb - lo_mb, both("name"), both("phase")), dims)
    occ = np.concatenate([_occurrences(base[: g.n], g.position), _occurrences(base[g.n :], s.position)])
    span = int(occ.max()) + 1
    if int(np.prod(dims, dtype=object)) * span >= 1 << 63:
        raise ValueError(f"bucket key space {dims} x {span} overflows int64: use fewer steps per bucket")
    keys = base * span + occ
    return keys[: g.n], keys[g.n :], span


def _occurrences(base: np.ndarray, position: np.ndarray) -> np.ndarray:
    """0 for the first record of each key in log order, 1 for the second, ..."""
    order = np.lexsort((position, base))
    b = base[order]
    idx = np.arange(len(b))
    run_start = np.r_[True, b[1:] != b[:-1]] if len(b) else np.zeros(0, bool)
    occ = np.empty(len(b), np.int64)
    occ[order] = idx - np.maximum.accumulate(np.where(run_start, idx, 0))
    return occ


def _pick(a: np.ndarray, b: np.ndarray, ai: np.ndarray, bi: np.ndarray) -> np.ndarray:
    """a[ai] where ai >= 0, else b[bi]: a key column taken from whichever side has the record."""
    if len(a) == 0:
        return b[bi]
    if len(b) == 0:
        return a[ai]
    return np.where(ai >= 0, a[np.maximum(ai, 0)], b[np.maximum(bi, 0)])


def _take(a: np.ndarray, idx: np.ndarray) -> pa.Array:
    """a[idx] with nulls where idx < 0 (the side lacks the record)."""
    missing = idx < 0
    if len(a) == 0:
        return pa.nulls(len(idx), pa.from_numpy_dtype(a.dtype))
    values = a[np.maximum(idx, 0)]
    return pa.array(values, mask=missing if missing.any() else None)


def _divergence_steps(
    rank: int, step: np.ndarray, mb: np.ndarray, name: np.ndarray, phase: np.ndarray, differ: np.ndarray,
    names: list[str],
) -> pa.Table:
    """Per step: how many events differ, and how many distinct sites (the divergence frontier)."""
    steps, start = np.unique(step, return_index=True)  # rows are in step order
    count = lambda mask: np.add.reduceat(mask.astype(np.int64), start)  # noqa: E731
    site = np.isin(phase, _SITE_PHASES)
    sel = np.flatnonzero(differ & site)
    pairs = np.unique(np.stack([step[sel], name[sel]]), axis=1) if len(sel) else np.zeros((2, 0), np.int64)
    sites = np.zeros(len(steps), np.int64)
    np.add.at(sites, np.searchsorted(steps, pairs[0]), 1)
    first_mb: list[int | None] = [None] * len(steps)
    first_name: list[str | None] = [None] * len(steps)
    first_phase: list[str | None] = [None] * len(steps)
    diff_rows = np.flatnonzero(differ)
    if len(diff_rows):
        d_steps, d_first = np.unique(step[diff_rows], return_index=True)
        for st, row in zip(np.searchsorted(steps, d_steps).tolist(), diff_rows[d_first].tolist()):
            first_mb[st], first_name[st], first_phase[st] = int(mb[row]), names[name[row]], PHASES[phase[row]]
    return pa.Table.from_arrays(
        [
            pa.array(np.full(len(steps), rank, np.int32)),
            pa.array(steps.astype(np.int64)),
            pa.array(np.diff(np.r_[start, len(step)]).astype(np.int64)),
            pa.array(count(differ)),
            pa.array(sites),
            pa.array(count(differ & (phase == int(Phase.INPUT)))),
            pa.array(count(differ & (phase == int(Phase.GRAD)))),
            pa.array(count(differ & (phase == int(Phase.PARAM)))),
            pa.array(first_mb, pa.int64()),
            pa.array(first_name, pa.string()),
            pa.array(first_phase, pa.string()),
        ],
        schema=SCHEMAS[DIVERGENCE_STEPS],
    )


def _fault_scores(
    rank: int, step: np.ndarray, mb: np.ndarray, name: np.ndarray, phase: np.ndarray, differ: np.ndarray,
    names: dict[str, int], faults: Sequence[Fault], bound: int,
) -> tuple[list[tuple[tuple[Any, ...], dict[str, Any]]], tuple[int, int, int, int, int, int]]:
    """Fingerprint divergence as a fault detector over this bucket's site events (docs: analysis/SCHEMA.md)."""
    site = np.isin(phase, _SITE_PHASES)
    lo, hi = (int(step.min()), int(step.max())) if len(step) else (0, -1)
    mine = [f for f in faults if f.rank == rank]
    first_fault = min((f.step for f in mine), default=None)
    faulted = np.zeros(len(step), bool)
    site_codes = set(np.unique(name[site]).tolist())
    site_names = {n: code for n, code in names.items() if code in site_codes}
    hits = []
    for f, traced, phase_code in fault_units([f for f in mine if lo <= f.step <= min(hi, bound)], site_names):
        detected = None
        if traced is not None:
            at = site & (step == f.step) & (mb == f.microbatch) & (name == names[traced]) & (phase == phase_code)
            if at.any():
                faulted |= at
                detected = bool(differ[at].any())
        hits.append((f.id, {"traced_site": traced, "fingerprint_detected": detected}))
    units = int(site.sum())
    tp = int((faulted & differ).sum())
    fn = int((faulted & ~differ).sum())
    unexplained = site & differ & ~faulted
    before = unexplained if first_fault is None else unexplained & (step < first_fault)
    fp = int(before.sum())
    propagated = int(unexplained.sum()) - fp
    tn = int((site & ~faulted & ~differ).sum())
    return hits, (units, tp, fp, fn, tn, propagated)
