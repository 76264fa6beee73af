"""Diff the tensor records of a golden and a suspect run: key -> join -> diff.

Both runs' record batches are keyed by (rank, step bucket) in `pipelines.log_source`; one
GroupByKey brings a bucket's batches from both sides together, and `diff_bucket`
joins them with numpy on (step, microbatch, name, phase, occurrence), where
occurrence numbers repeated records of one key (a module called twice in a forward)
in log order. Steps after the last one both runs completed are not compared. With a tolerance map
(`sdc diff --tolerance`), an event whose bits differ at a place the map lists, with both runs' l2 and absmax
within the place's band (`pipelines.tolerance.within_band`), is ``within_tolerance``: counted apart, never a
difference (no first divergence, no divergence step, no detection).

Execution order, for first divergences, is (step, microbatch-level phases before the
step-level GRAD and PARAM, microbatch, INPUT < FORWARD < BACKWARD < GRAD < PARAM,
position in the golden log): the order in which a training step produces the tensors.
A GRAD record's microbatch (the one whose backward last changed it: the step's last, or
NO_MICROBATCH) labels it and takes no part in the order. The tables show a microbatch of
null for a PARAM record and for a GRAD record with NO_MICROBATCH: they belong to the step.
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
from pipelines.log_source import NAMESPACE, unpack_batch
from pipelines.pairing import in_lost_steps
from pipelines.tables import PHASES, SCHEMAS, STATUSES, TABLES
from pipelines.tagged_outputs import split
from pipelines.tolerance import ToleranceMap, within_band
from tracer.log import NO_MICROBATCH, Phase

EVENT_DIFFS, DIVERGENCE_STEPS, FIRST = "event_diffs", "divergence_steps", "first_divergence"
FINDINGS = "findings"  # per-rank results of a bucket, gathered by `pipelines.detections.RankFindings`
EQUAL, DIFFER, GOLDEN_ONLY, SUSPECT_ONLY, WITHIN = range(5)  # indexes into tables.STATUSES
_FORWARD, _BACKWARD = int(Phase.FORWARD), int(Phase.BACKWARD)  # the phases of site events
_PARAM = int(Phase.PARAM)
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

    A batch is a `pa.RecordBatch` of `pipelines.log_source.TENSOR_SCHEMA`, or one `pipelines.log_source.pack_batch`
    packed.

    Side inputs: `bounds`, (rank, last compared step); `faults`, every `Fault` of both runs; `lost`, (rank,
    step ranges corruption made unknown). `tolerance`: places compared within a band (`sdc diff --tolerance`).
    """

    def __init__(
        self,
        bounds: beam.PCollection,
        faults: beam.PCollection,
        lost: beam.PCollection | None = None,
        tolerance: ToleranceMap | None = None,
    ) -> None:
        super().__init__()
        self.bounds, self.faults, self.lost, self.tolerance = bounds, faults, lost, tolerance

    def expand(self, batches: beam.PCollection) -> dict[str, beam.PCollection]:
        diffs = (
            batches
            | "Join buckets" >> beam.GroupByKey()
            | "Diff buckets"
            >> beam.ParDo(
                _DiffBucket(self.tolerance),
                beam.pvalue.AsDict(self.bounds),
                beam.pvalue.AsList(self.faults),
                beam.pvalue.AsDict(self.lost) if self.lost is not None else {},
            )
        )
        return split(diffs, (TABLES, FINDINGS), "Diffs")


def earliest(firsts: Iterable[FirstDifference | None]) -> FirstDifference | None:
    """The first difference in execution order among buckets' candidates."""
    return min((f for f in firsts if f is not None), key=lambda f: f[0], default=None)


class _DiffBucket(beam.DoFn):
    def __init__(self, tolerance: ToleranceMap | None) -> None:
        self.tolerance = tolerance

    def setup(self) -> None:
        self.compared = Metrics.counter(NAMESPACE, "events_compared")
        self.differing = Metrics.counter(NAMESPACE, "events_differing")
        self.within = Metrics.counter(NAMESPACE, "events_within_tolerance")

    def process(self, element: Any, bounds: dict[int, int], faults: list[Fault], lost: dict[int, Any]) -> Iterator[Any]:
        (rank, _), batches = element
        bound = bounds.get(rank)
        if bound is None:
            return
        sides: dict[str, list[pa.RecordBatch]] = {"golden": [], "suspect": []}
        for side, batch in batches:
            sides[side].append(unpack_batch(batch))
        result = diff_bucket(rank, sides["golden"], sides["suspect"], bound, faults, lost.get(rank, ()), self.tolerance)
        if result is None:
            return
        n = result.event_diffs.num_rows
        codes = result.event_diffs.column("status").combine_chunks().indices.to_numpy()
        within = int((codes == WITHIN).sum())
        self.compared.inc(n)
        self.within.inc(within)
        self.differing.inc(n - within - int(result.event_diffs.column("equal").to_numpy(zero_copy_only=False).sum()))
        yield TABLES, (EVENT_DIFFS, result.event_diffs)
        yield TABLES, (DIVERGENCE_STEPS, result.divergence_steps)
        yield FINDINGS, (rank, ("bucket", result.findings))


_DTYPES = {
    "step": np.int64,
    "microbatch": np.int64,
    "name": np.int32,
    "phase": np.int8,
    "fingerprint": np.uint64,
    "l2": np.float32,
    "absmax": np.float32,
    "nan": np.int64,
    "inf": np.int64,
    "meta": np.int32,
    "segment": np.int32,
    "offset": np.int64,
}
_CODED = ("name", "meta")  # dictionary columns: codes into the segment's strings, translated into the bucket's


class _Side:
    """One run's records of a bucket (steps <= bound) as numpy columns; names and metas as codes into one
    dictionary that both sides share."""

    def __init__(self, batches: Iterable[pa.RecordBatch], bound: int, strings: dict[str, int]):
        parts: dict[str, list[np.ndarray]] = {k: [] for k in _DTYPES}
        for b in batches:
            keep = b.column("step").to_numpy() <= bound
            if not keep.any():
                continue
            rows = slice(None) if keep.all() else keep
            for key in parts:
                col = b.column(key)
                if key in _CODED:
                    lut = np.array([strings.setdefault(s, len(strings)) for s in col.dictionary.to_pylist()], np.int32)
                    parts[key].append(lut[col.indices.to_numpy()[rows]])
                else:
                    parts[key].append(col.to_numpy()[rows])
        self.n = sum(len(a) for a in parts["step"])
        self.cols = {
            k: (v[0] if len(v) == 1 else np.concatenate(v)) if v else np.zeros(0, _DTYPES[k]) for k, v in parts.items()
        }
        self.position = (self.cols["segment"].astype(np.int64) << 40) | self.cols["offset"]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.cols[key]


def diff_bucket(
    rank: int,
    golden: Iterable[pa.RecordBatch],
    suspect: Iterable[pa.RecordBatch],
    bound: int,
    faults: Sequence[Fault] = (),
    lost: Sequence[tuple[int | None, int | None]] = (),
    tolerance: ToleranceMap | None = None,
) -> BucketDiff | None:
    """Join one bucket's records of both runs (steps <= `bound`) and derive its rows of every diff table.

    `lost`: step ranges corruption made unknown on either side. Corruption is never data: a record
    one side lacks there is not a difference (no row), and no difference there is a first divergence.
    """
    strings: dict[str, int] = {}
    g, s = _Side(golden, bound, strings), _Side(suspect, bound, strings)
    if g.n + s.n == 0:
        return None
    gi, si, occurrence = _aligned(g, s, len(strings)) or _match(g, s, len(strings))
    if lost:
        unknown = in_lost_steps(_pick(g["step"], s["step"], gi, si), lost) & ((gi < 0) | (si < 0))
        gi, si, occurrence = gi[~unknown], si[~unknown], occurrence[~unknown]
    step, mb, name, phase = (_pick(g[k], s[k], gi, si) for k in ("step", "microbatch", "name", "phase"))
    position = _pick(g.position, s.position, gi, si)
    order = _execution_order(step, mb, phase, position)
    if order is not None:
        gi, si, occurrence, position = gi[order], si[order], occurrence[order], position[order]
        step, mb, name, phase = step[order], mb[order], name[order], phase[order]
    gr, sr = _Rows(gi), _Rows(si)
    matched = ~gr.missing & ~sr.missing
    equal = matched & (gr.values(g["fingerprint"]) == sr.values(s["fingerprint"]))
    status = np.where(matched, np.where(equal, EQUAL, DIFFER), np.where(gi >= 0, GOLDEN_ONLY, SUSPECT_ONLY))
    if tolerance is not None and tolerance.places:
        stats = {k: (gr.values(g[k]), sr.values(s[k])) for k in ("l2", "absmax", "nan", "inf", "meta")}
        status = np.where(matched & ~equal & within_band(tolerance, list(strings), name, phase, stats), WITHIN, status)
    dictionary = pa.array(list(strings), pa.string())
    coded = lambda codes, values: pa.DictionaryArray.from_arrays(pa.array(codes), values)  # noqa: E731
    n = len(gi)
    table = pa.Table.from_arrays(
        [
            pa.array(np.full(n, rank, np.int32)),
            pa.array(step),
            _microbatches(mb, phase),
            coded(name, dictionary),
            coded(phase, _PHASE_DICT),
            pa.array(occurrence.astype(np.int32)),
            coded(status.astype(np.int8), _STATUS_DICT),
            pa.array(equal),
            gr.take(g["fingerprint"]),
            sr.take(s["fingerprint"]),
            gr.take(g["l2"]),
            sr.take(s["l2"]),
            gr.take(g["absmax"]),
            sr.take(s["absmax"]),
            gr.take(g["nan"]),
            sr.take(s["nan"]),
            gr.take(g["inf"]),
            sr.take(s["inf"]),
            coded(_pick(g["meta"], s["meta"], gi, si), dictionary),
            gr.take(g["segment"]),
            gr.take(g["offset"]),
            sr.take(s["segment"]),
            sr.take(s["offset"]),
        ],
        schema=SCHEMAS[EVENT_DIFFS],
    )
    differ = (status != EQUAL) & (status != WITHIN)
    first = None
    candidates = differ & ~in_lost_steps(step, lost) if lost else differ
    if candidates.any():
        i = int(np.argmax(candidates))
        level = bool(_STEP_LEVEL[phase[i]])
        key = (int(step[i]), int(level), 0 if level else int(mb[i]), int(_PHASE_ORDER[phase[i]]), int(position[i]))
        first = (key, table.slice(i, 1).to_pylist()[0])
    site = (phase == _FORWARD) | (phase == _BACKWARD)
    steps = _divergence_steps(rank, step, mb, name, phase, site, differ, list(strings))
    hits, scores = _fault_scores(rank, step, mb, name, phase, site, differ, strings, faults, bound)
    return BucketDiff(table, steps, BucketFindings(first, scores, hits))


def _aligned(g: _Side, s: _Side, n_names: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The join when both sides hold the same keys in the same log order, the usual case (a fault changes
    values, not which tensors a step makes): row i of one side pairs with row i of the other. None otherwise."""
    if g.n != s.n or not all(np.array_equal(g[k], s[k]) for k in ("step", "microbatch", "name", "phase")):
        return None
    if not (_increasing(g.position) and _increasing(s.position)):
        return None
    rows = np.arange(g.n)
    base, _ = _base(g["step"], g["microbatch"], g["name"], g["phase"], n_names)
    return rows, rows, _occurrences(base, g.position)


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


def _base(
    step: np.ndarray, mb: np.ndarray, name: np.ndarray, phase: np.ndarray, n_names: int
) -> tuple[np.ndarray, tuple[int, ...]]:
    """(step, microbatch, name, phase) packed into one int64 per record; and the packing's dimensions."""
    lo_step, lo_mb = int(step.min()), int(mb.min())
    dims = (int(step.max()) - lo_step + 1, int(mb.max()) - lo_mb + 1, max(n_names, 1), len(Phase))
    return np.ravel_multi_index((step - lo_step, mb - lo_mb, name, phase), dims), dims


def _keys(g: _Side, s: _Side, n_names: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One unique int64 per record, (step, microbatch, name, phase, occurrence) packed; and the occurrence span."""
    base, dims = _base(*(np.concatenate([g[k], s[k]]) for k in ("step", "microbatch", "name", "phase")), n_names)
    occ = np.concatenate([_occurrences(base[: g.n], g.position), _occurrences(base[g.n :], s.position)])
    span = int(occ.max()) + 1
    if int(np.prod(dims, dtype=object)) * span >= 1 << 63:
        raise ValueError(f"bucket key space {dims} x {span} overflows int64: use fewer steps per bucket")
    keys = base * span + occ
    return keys[: g.n], keys[g.n :], span


def _increasing(a: np.ndarray) -> bool:
    return bool((a[1:] > a[:-1]).all())


def _occurrences(base: np.ndarray, position: np.ndarray) -> np.ndarray:
    """0 for the first record of each key in log order, 1 for the second, ..."""
    order = np.argsort(base, kind="stable") if _increasing(position) else np.lexsort((position, base))
    b = base[order]
    run_start = np.r_[True, b[1:] != b[:-1]] if len(b) else np.zeros(0, bool)
    if run_start.all():
        return np.zeros(len(b), np.int64)
    idx = np.arange(len(b))
    occ = np.empty(len(b), np.int64)
    occ[order] = idx - np.maximum.accumulate(np.where(run_start, idx, 0))
    return occ


def _execution_order(step: np.ndarray, mb: np.ndarray, phase: np.ndarray, position: np.ndarray) -> np.ndarray | None:
    """The permutation that puts events in execution order (module docstring); None if they are in it already,
    which a log written in step order usually is."""
    p = phase.astype(np.intp)
    level = _STEP_LEVEL[p]
    keys = (step, level, np.where(level, 0, mb), _PHASE_ORDER[p], position)  # most significant first
    ordered = keys[-1][1:] >= keys[-1][:-1]
    for k in reversed(keys[:-1]):
        ordered = (k[1:] > k[:-1]) | ((k[1:] == k[:-1]) & ordered)
    return None if ordered.all() else np.lexsort(keys[::-1])


def _microbatches(mb: np.ndarray, phase: np.ndarray, none: np.ndarray | None = None) -> pa.Array:
    """A microbatch column: null for the records that belong to the whole step (module docstring)."""
    step_level = (phase == _PARAM) | (mb == NO_MICROBATCH)
    if none is not None:
        step_level |= none
    return pa.array(mb, mask=step_level) if step_level.any() else pa.array(mb)


def _pick(a: np.ndarray, b: np.ndarray, ai: np.ndarray, bi: np.ndarray) -> np.ndarray:
    """a[ai] where ai >= 0, else b[bi]: a key column taken from whichever side has the record."""
    if len(b) == 0 or (len(a) and bool((ai >= 0).all())):
        return a[ai]
    if len(a) == 0:
        return b[bi]
    return np.where(ai >= 0, a[np.maximum(ai, 0)], b[np.maximum(bi, 0)])


class _Rows:
    """Which row of one side each joined event takes (-1: the side lacks it), prepared once for many columns."""

    def __init__(self, idx: np.ndarray) -> None:
        self.missing = idx < 0
        self.any_missing = bool(self.missing.any())
        self.identity = (
            not self.any_missing and len(idx) > 0 and idx[0] == 0 and _increasing(idx) and idx[-1] == len(idx) - 1
        )
        self.idx = np.maximum(idx, 0) if self.any_missing else idx
        self.n = len(idx)

    def values(self, a: np.ndarray) -> np.ndarray:
        """a at these rows; any value where the side lacks the record (for comparisons that mask those)."""
        if not len(a):
            return np.zeros(self.n, a.dtype)
        return a if self.identity and len(a) == self.n else a[self.idx]

    def take(self, a: np.ndarray) -> pa.Array:
        """a at these rows, null where the side lacks the record."""
        if not len(a):
            return pa.nulls(self.n, pa.from_numpy_dtype(a.dtype))
        return pa.array(self.values(a), mask=self.missing if self.any_missing else None)


def _divergence_steps(
    rank: int,
    step: np.ndarray,
    mb: np.ndarray,
    name: np.ndarray,
    phase: np.ndarray,
    site: np.ndarray,
    differ: np.ndarray,
    names: list[str],
) -> pa.Table:
    """Per step: how many events differ, and how many distinct sites (the divergence frontier)."""
    if not len(step):
        return SCHEMAS[DIVERGENCE_STEPS].empty_table()
    start = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])  # rows are in step order
    steps = step[start]
    count = lambda mask: np.add.reduceat(mask.astype(np.int64), start)  # noqa: E731
    sel = np.flatnonzero(differ & site)
    pairs = np.unique((step[sel] - steps[0]) * max(len(names), 1) + name[sel])  # distinct (step, site)
    sites = np.bincount(np.searchsorted(steps, pairs // max(len(names), 1) + steps[0]), minlength=len(steps))
    diff_rows = np.flatnonzero(differ)
    first = diff_rows[np.r_[True, step[diff_rows][1:] != step[diff_rows][:-1]]] if len(diff_rows) else diff_rows
    at = np.searchsorted(steps, step[first])  # the steps that have a difference, and their first one
    none = np.ones(len(steps), bool)
    none[at] = False
    first_of = np.zeros(len(steps), np.int64)
    first_of[at] = first
    phases = np.array(PHASES, object)
    return pa.Table.from_arrays(
        [
            pa.array(np.full(len(steps), rank, np.int32)),
            pa.array(steps.astype(np.int64)),
            pa.array(np.diff(np.r_[start, len(step)]).astype(np.int64)),
            pa.array(count(differ)),
            pa.array(sites.astype(np.int64)),
            pa.array(count(differ & (phase == int(Phase.INPUT)))),
            pa.array(count(differ & (phase == int(Phase.GRAD)))),
            pa.array(count(differ & (phase == int(Phase.PARAM)))),
            _microbatches(mb[first_of].astype(np.int64), phase[first_of], none),
            pa.array(np.array(names, object)[name[first_of]], pa.string(), mask=none),
            pa.array(phases[phase[first_of]], pa.string(), mask=none),
        ],
        schema=SCHEMAS[DIVERGENCE_STEPS],
    )


def _fault_scores(
    rank: int,
    step: np.ndarray,
    mb: np.ndarray,
    name: np.ndarray,
    phase: np.ndarray,
    site: np.ndarray,
    differ: np.ndarray,
    names: dict[str, int],
    faults: Sequence[Fault],
    bound: int,
) -> tuple[list[tuple[tuple[Any, ...], dict[str, Any]]], tuple[int, int, int, int, int, int]]:
    """Fingerprint divergence as a fault detector over this bucket's site events (docs: analysis/SCHEMA.md)."""
    lo, hi = (int(step.min()), int(step.max())) if len(step) else (0, -1)
    mine = [f for f in faults if f.rank == rank]
    first_fault = min((f.step for f in mine), default=None)
    faulted = np.zeros(len(step), bool)
    hits = []
    in_bucket = [f for f in mine if lo <= f.step <= min(hi, bound)]
    if in_bucket:
        site_codes = set(np.unique(name[site]).tolist())
        site_names = {n: code for n, code in names.items() if code in site_codes}
        # A site's backward unit holds the gradients w.r.t. its other inputs too, recorded as SITE[k].
        backward: dict[str, list[int]] = {n: [c] for n, c in site_names.items()}
        for n, c in site_names.items():
            if n.endswith("]") and (base := n[: n.rfind("[")]) in backward:
                backward[base].append(c)
        for f, traced, phase_code in fault_units(in_bucket, site_names):
            detected = None
            if traced is not None:
                codes = backward[traced] if phase_code == _BACKWARD else [names[traced]]
                at = site & (step == f.step) & (mb == f.microbatch) & (phase == phase_code)
                at &= (name == codes[0]) if len(codes) == 1 else np.isin(name, codes)
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
