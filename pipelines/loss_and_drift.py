"""Per-step metrics beside the event diff: loss curves and spikes, parameter drift (RQ3).

Loss spike rule (analysis/SCHEMA.md, docs/pipelines.md): a step's loss is a spike when
it is not finite, or when at least `SPIKE_MIN_HISTORY` of the previous `SPIKE_WINDOW`
steps have a finite loss and the loss exceeds `SPIKE_FACTOR` times their median. The
first steps, without that history, are never spikes unless their loss is not finite.

Parameter drift, per checkpoint step both runs have: ‖θ_s − θ_h‖₂ / ‖θ_h‖₂ in float64
over all floating-point model tensors ("*") and per group: ``...layers.N`` for
everything under a ``layers.N.`` prefix, else the tensor name's first component. A checkpoint
whose model tensors differ from what its run's log recorded before that step is an error, never drift.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import torch
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipelines.events import NUMBER, Fields
from pipelines.log_source import NAMESPACE, EventBatch, corruption_row, read_file
from pipelines.scoring import sorted_median
from pipelines.tables import SCHEMAS, named, table
from tracer.checkpoint.interface import Checkpoint
from tracer.checkpoint.logged_parameters import LoggedParameters, parameters_in_segments
from tracer.checkpoint.manifest_bounds import check_manifest_size, header_tensor_count, manifest_limit
from tracer.checkpoint.plain import decode_checkpoint
from tracer.errors import CheckpointChangedError, LogError
from tracer.log.layout import SEGMENT_SUFFIX, parse_segment_path, rank_dir_name

SPIKE_FACTOR = 1.5
SPIKE_WINDOW = 10
SPIKE_MIN_HISTORY = 5
LOSS, SPIKES, DRIFT = "loss", "loss_spikes", "param_drift"
_LAYER = re.compile(r"^(.*?layers\.\d+)\.")


def spikes(steps: Sequence[int], losses: Sequence[float | None]) -> list[dict[str, Any]]:
    """Spikes of one loss curve (steps ascending): step, loss, baseline (the rolling median), ratio."""
    loss = np.array([math.nan if x is None else x for x in losses], np.float64)
    given = np.array([x is not None for x in losses], bool)
    baseline = _baselines(loss)
    finite = np.isfinite(loss)
    with np.errstate(invalid="ignore"):
        spiked = given & (~finite | (loss > SPIKE_FACTOR * baseline))  # NaN baseline: no history, no spike
    out = []
    for i in np.flatnonzero(spiked).tolist():
        base = float(baseline[i]) if not math.isnan(baseline[i]) else None
        value = float(loss[i])
        ratio = value / base if finite[i] and base else None
        out.append({"step": steps[i], "loss": value, "baseline": base, "ratio": ratio})
    return out


def _baselines(loss: np.ndarray) -> np.ndarray:
    """Per step, `statistics.median` of the finite losses among the `SPIKE_WINDOW` steps before it; NaN where
    fewer than `SPIKE_MIN_HISTORY` are finite."""
    n = len(loss)
    finite = np.where(np.isfinite(loss), loss, np.nan)
    before = np.full((n, SPIKE_WINDOW), np.nan)
    for back in range(1, SPIKE_WINDOW + 1):
        before[back:, back - 1] = finite[: max(0, n - back)]
    ordered = np.sort(before, axis=1)  # NaN last
    count = SPIKE_WINDOW - np.isnan(ordered).sum(axis=1)
    return np.where(count >= SPIKE_MIN_HISTORY, sorted_median(ordered, count), np.nan)


def loss_tables(
    rank: int,
    golden: Mapping[int, float | None],
    suspect: Mapping[int, float | None],
    lrs: Mapping[int, float | None] | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Both runs' per-step loss side by side (every step either run has), the golden's learning rate beside
    them (``lrs``), and each run's spikes."""
    steps = sorted(golden.keys() | suspect.keys())
    g, g_given = _column(golden, steps)
    s, s_given = _column(suspect, steps)
    lr, lr_given = _column(lrs or {}, steps)
    both = g_given & s_given
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = s - g
        rel = diff / np.abs(g)
    n = len(steps)
    loss = pa.Table.from_arrays(
        [
            pa.array(np.full(n, rank, np.int32)),
            pa.array(np.array(steps, np.int64)),
            pa.array(g, mask=~g_given),
            pa.array(s, mask=~s_given),
            pa.array(diff, mask=~both),
            pa.array(rel, mask=~both | (g == 0)),
            pa.array(lr, mask=~lr_given),
        ],
        schema=SCHEMAS[LOSS],
    )
    spike_rows = []
    for side, curve in (("golden", golden), ("suspect", suspect)):
        ordered = sorted(curve)
        for spike in spikes(ordered, [curve[step] for step in ordered]):
            spike_rows.append({"rank": rank, "side": side, **spike})
    return loss, table(SPIKES, spike_rows)


def _column(values: Mapping[int, float | None], steps: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``values`` at ``steps`` as floats, and where they are given (not None, not missing)."""
    got = [values.get(step) for step in steps]
    return (
        np.array([math.nan if v is None else v for v in got], np.float64),
        np.array([v is not None for v in got], bool),
    )


class LossCurves(beam.PTransform):
    """(rank, (side, EventBatch of `step` events)) -> TABLES: loss and loss_spikes."""

    def expand(self, steps: beam.PCollection) -> beam.PCollection:
        return steps | "Group by rank" >> beam.GroupByKey() | "Loss tables" >> beam.ParDo(_LossTables())


class _LossTables(beam.DoFn):
    def setup(self) -> None:
        self.unreadable = Metrics.counter(NAMESPACE, "event_fields_unreadable")

    def process(self, element: tuple[int, Iterable[tuple[str, EventBatch]]]) -> Iterator[tuple[str, pa.Table]]:
        rank, batches = element
        curves: dict[str, dict[int, float | None]] = {"golden": {}, "suspect": {}}
        lrs: dict[int, float | None] = {}
        for side, batch in batches:
            for row in batch.rows:
                fields = Fields(row.fields, self.unreadable)
                curves[side][row.step] = fields.get("loss", NUMBER)
                if side == "golden":
                    group_lrs = fields.floats("lr")
                    lrs[row.step] = group_lrs[0] if group_lrs else None
        loss, spike = loss_tables(rank, curves["golden"], curves["suspect"], lrs)
        yield LOSS, loss
        if spike.num_rows:
            yield SPIKES, spike


def parameter_group(name: str) -> str:
    """``layers.3.attention.wq.weight`` -> ``layers.3``; ``tok_embeddings.weight`` -> ``tok_embeddings``."""
    m = _LAYER.match(name)
    return m[1] if m else name.split(".", 1)[0]


def drift_rows(
    rank: int, step: int, golden: Mapping[str, torch.Tensor], suspect: Mapping[str, torch.Tensor]
) -> list[dict[str, Any]]:
    """‖θ_s − θ_h‖₂ / ‖θ_h‖₂ over all floating-point tensors ("*") and per parameter group, in float64."""
    sums: dict[str, list[float]] = {}  # group -> [elements, ‖θ_h‖², ‖θ_s − θ_h‖²]
    for name in sorted(golden):
        h = golden[name]
        if not h.is_floating_point():
            continue
        h, s = h.double(), suspect[name].double()
        values = (h.numel(), float(h.square().sum()), float((s - h).square().sum()))
        for group in ("*", parameter_group(name)):
            acc = sums.setdefault(group, [0, 0.0, 0.0])
            for i, v in enumerate(values):
                acc[i] += v
    rows = []
    for group, (elements, golden_sq, diff_sq) in sorted(sums.items()):
        golden_norm, diff_norm = math.sqrt(golden_sq), math.sqrt(diff_sq)
        rows.append(
            {
                "rank": rank,
                "step": step,
                "group": group,
                "elements": int(elements),
                "golden_norm": golden_norm,
                "diff_norm": diff_norm,
                "drift": diff_norm / golden_norm if golden_norm else None,
            }
        )
    return rows


class DriftTask(NamedTuple):
    rank: int
    step: int
    golden: tuple[str, str]  # (manifest, tensors) paths
    suspect: tuple[str, str]
    run_ids: tuple[str, str]


class ParamDrift(beam.PTransform):
    """Checkpoints both runs hold at the same (step, rank) -> TABLES: param_drift; a damaged checkpoint is
    a corruptions row; a pair of checkpoints of different models, or a checkpoint whose model tensors differ from
    the fingerprints its run's log recorded before that step (`tracer.checkpoint.logged_parameters`), an errors row. One
    element per rank: each rank's two logs are read once for all its checkpoints."""

    def __init__(self, tasks: Sequence[DriftTask], spread: bool = True) -> None:
        super().__init__()
        self.tasks, self.spread = list(tasks), spread

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        by_rank: dict[int, list[DriftTask]] = {}
        for task in self.tasks:
            by_rank.setdefault(task.rank, []).append(task)
        return (
            pbegin
            | "List checkpoint pairs" >> beam.Create(sorted(by_rank.items()), reshuffle=self.spread)  # spread: workers
            | "Compare checkpoints" >> beam.ParDo(_Drift())
        )


def run_of_checkpoint(manifest: str) -> str:
    """The run directory (or URL) of a checkpoint manifest ``<run>/checkpoints/step-N/rank-R.msgpack``."""
    return manifest.replace("\\", "/").rsplit("/", 3)[0]


def logged_before_checkpoints(run: str, rank: int, steps: Iterable[int]) -> dict[int, LoggedParameters]:
    """Checkpoint step -> the PARAM fingerprints ``rank``'s log recorded before it, read through Beam's file
    systems (a run with no readable log: nothing)."""
    try:
        matches = FileSystems.match([FileSystems.join(run, rank_dir_name(rank), "*" + SEGMENT_SUFFIX)])[0]
    except (ValueError, OSError):
        return {}
    paths = sorted(
        (parsed[1], m.path)
        for m in matches.metadata_list
        if (parsed := parse_segment_path(m.path)) is not None and parsed[0] == rank
    )
    return parameters_in_segments([(path, lambda path=path: read_file(path)) for _, path in paths], list(steps))


def _read_checkpoint(manifest: str, tensors: str, logged: LoggedParameters | None) -> Checkpoint:
    """A checkpoint through Beam's file systems: its manifest read no further than `manifest_limit` allows."""
    data = read_file(tensors)
    count = header_tensor_count(data, len(data), tensors)
    raw = read_file(manifest, manifest_limit(count) + 1)
    check_manifest_size(manifest, len(raw), count)
    return decode_checkpoint(raw, data, manifest, logged)


class _Drift(beam.DoFn):
    def setup(self) -> None:
        self.compared = Metrics.counter(NAMESPACE, "checkpoints_compared")
        self.damaged = Metrics.counter(NAMESPACE, "checkpoints_damaged")

    def process(self, element: tuple[int, Sequence[DriftTask]]) -> Iterator[tuple[str, pa.Table]]:
        rank, tasks = element
        steps = [t.step for t in tasks]
        logged = [
            logged_before_checkpoints(run_of_checkpoint(manifest), rank, steps)
            for manifest in (tasks[0].golden[0], tasks[0].suspect[0])
        ]
        for task in tasks:
            yield from self._compare(task, logged)

    def _compare(self, task: DriftTask, logged: list[dict[int, LoggedParameters]]) -> Iterator[tuple[str, pa.Table]]:
        models = []
        sides = zip(("golden", "suspect"), (task.golden, task.suspect), task.run_ids, logged, strict=True)
        for side, (manifest, tensors), run_id, side_logged in sides:
            try:
                models.append(_read_checkpoint(manifest, tensors, side_logged.get(task.step)).model)
            except CheckpointChangedError as e:  # never drift: the checkpoint is not the state the run had
                yield named("errors", [{"side": side, "rank": task.rank, "path": manifest, "message": str(e)}])
                return
            except (LogError, OSError) as e:
                self.damaged.inc()
                yield named("corruptions", [corruption_row(run_id, side, task.rank, tensors, 0, str(e))])
                return
        golden, suspect = models
        if set(golden) != set(suspect):
            only = sorted(set(golden) ^ set(suspect))
            yield named(
                "errors",
                [
                    {
                        "side": "pair",
                        "rank": task.rank,
                        "path": task.suspect[0],
                        "message": f"checkpoints of step {task.step} hold different tensors ({', '.join(only[:5])}): "
                        "the runs do not train the same model",
                    }
                ],
            )
            return
        self.compared.inc()
        yield named(DRIFT, drift_rows(task.rank, task.step, golden, suspect))
