"""Each composite transform on a TestPipeline, with hand-made elements; assert_that on what comes out."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from pipelines.detections import RankFindings
from pipelines.events import CHECKS, FAULTS, STEPS, AbftCheck, Fault, RouteEvents
from pipelines.log_source import (
    EventBatch,
    RankInfo,
    RankLayout,
    RunLayout,
    SegmentInfo,
    SummariseRanks,
    bucket_batches,
)
from pipelines.loss_and_drift import LossCurves
from pipelines.pairing import BOUNDS, ComparisonBounds
from pipelines.runner_options import DEFAULT_RUNNER
from pipelines.sink import WriteTables
from pipelines.tables import SCHEMAS, TABLES
from pipelines.tensor_diff import FINDINGS, DiffTensors
from tracer.log import SCHEMA_VERSION, Phase, RunHeader, SegmentSummary
from tracer.log.columns import TensorColumns

F, B, G, P = Phase.FORWARD, Phase.BACKWARD, Phase.GRAD, Phase.PARAM


def pipeline() -> test_pipeline.TestPipeline:
    """On `sdc diff`'s runner: the TestPipeline's default, the DirectRunner, first tries to download Prism."""
    return test_pipeline.TestPipeline(runner=DEFAULT_RUNNER)


def columns(records: list[tuple[int, int, str, Phase, int]]) -> TensorColumns:
    """(step, microbatch, name, phase, fingerprint) records, at offsets 100, 200, ... of one segment."""
    strings = sorted({r[2] for r in records}) + ["float32[4]"]
    col = lambda i, dtype: np.array([r[i] for r in records], dtype)  # noqa: E731
    n = len(records)
    return TensorColumns(
        offset=np.arange(1, n + 1, dtype=np.int64) * 100,
        step=col(0, np.int64),
        microbatch=col(1, np.int64),
        name=np.array([strings.index(r[2]) for r in records], np.int32),
        phase=col(3, np.int8),
        fingerprint=col(4, np.uint64),
        l2=np.ones(n, np.float32),
        absmax=np.ones(n, np.float32),
        nan=np.zeros(n, np.int64),
        inf=np.zeros(n, np.int64),
        meta=np.full(n, len(strings) - 1, np.int32),
        strings=strings,
    )


def keyed(side: str, records: list[tuple[int, int, str, Phase, int]], steps_per_bucket: int = 2) -> list:
    return [((0, bucket), (side, batch)) for bucket, batch in bucket_batches(columns(records), 0, steps_per_bucket)]


GOLDEN = [
    (0, 0, "a", F, 1),
    (0, 0, "b", F, 2),
    (0, 0, "b", B, 3),
    (0, 0, "w", G, 4),
    (1, 0, "a", F, 5),
    (1, 0, "b", F, 6),
    (1, 1, "a", F, 7),
    (1, 0, "w", G, 8),
    (2, 0, "a", F, 9),
]
SUSPECT = [
    (0, 0, "a", F, 1),
    (0, 0, "b", F, 2),
    (0, 0, "b", B, 3),
    (0, 0, "w", G, 4),
    (1, 0, "a", F, 5),
    (1, 0, "b", F, 6),
    (1, 1, "a", F, 70),
    (1, 0, "w", G, 80),
    (2, 0, "a", F, 9),
    (3, 0, "a", F, 10),
]


def test_diff_tensors_joins_buckets_and_stops_at_the_bound() -> None:
    with pipeline() as p:
        batches = p | "Batches" >> beam.Create(keyed("golden", GOLDEN) + keyed("suspect", SUSPECT))
        bounds = p | "Bounds" >> beam.Create([(0, 1)])  # steps 2 and 3 (bucket 1) are beyond it
        faults = p | "Faults" >> beam.Create([])
        out = batches | DiffTensors(bounds, faults)
        rows = (
            out[TABLES]
            | beam.Filter(lambda t: t[0] == "event_diffs")
            | beam.FlatMap(lambda t: t[1].select(["step", "microbatch", "name", "phase", "status"]).to_pylist())
            | beam.Map(lambda r: tuple(r.values()))
        )
        assert_that(
            rows,
            equal_to(
                [
                    (0, 0, "a", "forward", "equal"),
                    (0, 0, "b", "forward", "equal"),
                    (0, 0, "b", "backward", "equal"),
                    (0, 0, "w", "grad", "equal"),
                    (1, 0, "a", "forward", "equal"),
                    (1, 0, "b", "forward", "equal"),
                    (1, 1, "a", "forward", "differ"),
                    (1, 0, "w", "grad", "differ"),
                ]
            ),
            label="Events up to the bound",
        )
        firsts = out[FINDINGS] | beam.Map(
            lambda kv: (
                (kv[0], kv[1][1].first[1]["step"], kv[1][1].first[1]["microbatch"], kv[1][1].first[1]["phase"])
                if kv[1][1].first
                else None
            )
        )
        # microbatch 1's forward ran before the step's gradients: it is the first divergence
        assert_that(firsts, equal_to([(0, 1, 1, "forward")]), label="First per bucket")


def test_comparison_bounds_take_the_shorter_run() -> None:
    infos = [
        RankInfo("golden", 0, 1, 10, True, False, 9),
        RankInfo("suspect", 0, 1, 8, False, True, 6),
        RankInfo("golden", 1, 1, 10, True, False, 9),
        RankInfo("suspect", 1, 1, 0, False, False, None),
        RankInfo("replay0", 0, 1, 3, True, False, 2),
    ]
    with pipeline() as p:
        out = p | beam.Create(infos) | ComparisonBounds({("golden", 0): "g", ("suspect", 0): "s"})
        assert_that(out[BOUNDS], equal_to([(0, 6)]), label="Bounds")
        through = out[TABLES] | beam.Map(
            lambda t: tuple(t[1].select(["rank", "compared_through"]).to_pylist()[0].values())
        )
        assert_that(through, equal_to([(0, 6), (1, None)]), label="Table")


def _batch(kind: str, rank: int, *records: tuple[int, dict]) -> EventBatch:
    return EventBatch(tuple((rank, step, 0, 100 + i, fields) for i, (step, fields) in enumerate(records)))


FAULT = {
    "microbatch": 0,
    "site": "layers.1.mlp.w1",
    "op": "aten.mm.default",
    "phase": "forward",
    "kind": "bitflip",
    "elements": 1,
    "index": [5],
    "original": [1.0],
    "corrupted": [2.0],
    "detail": {"bit": 30},
}
CHECK = {
    "microbatch": 0,
    "site": "layers.1.mlp.w1",
    "op": "aten.mm.default",
    "phase": "forward",
    "shape": [2, 3, 4],
    "residual": 9.0,
    "bound": 1.0,
    "verdict": "flag",
}


def test_route_events_parses_what_each_table_needs() -> None:
    elements = [
        (("suspect", "fault", 0), _batch("fault", 0, (3, FAULT), (4, {"site": 7}))),
        (("suspect", "abft", 0), _batch("abft", 0, (3, CHECK))),
        (("golden", "step", 0), _batch("step", 0, (0, {"loss": 2.0}))),
        (
            ("replay0", "grad_noise", 0),
            _batch("grad_noise", 0, (1, {"name": "*", "diff_l2": 1.0, "golden_l2": 4.0, "ratio": 0.25})),
        ),
    ]
    with pipeline() as p:
        out = p | beam.Create(elements) | RouteEvents({("replay0", 0): "r"})
        assert_that(
            out[FAULTS] | beam.Map(lambda f: (f.step, f.site, f.indices, f.detail)),
            equal_to([(3, "layers.1.mlp.w1", [5], '{"bit": 30}'), (4, None, None, None)]),
            label="Faults",
        )
        assert_that(
            out[CHECKS] | beam.Map(lambda c: (c.m, c.k, c.n, c.verdict)), equal_to([(2, 3, 4, "flag")]), label="Checks"
        )
        assert_that(out[STEPS] | beam.Map(lambda kv: (kv[0], kv[1][0])), equal_to([(0, "golden")]), label="Steps")
        assert_that(
            out[TABLES] | beam.Map(lambda t: (t[0], t[1].to_pylist()[0]["ratio"])),
            equal_to([("grad_noise", 0.25)]),
            label="Replay rows",
        )


def test_rank_findings_score_faults_against_both_detectors() -> None:
    fault = Fault(
        "suspect",
        0,
        3,
        0,
        100,
        0,
        "layers.1.mlp.w1",
        "aten.mm.default",
        "forward",
        "bitflip",
        1,
        [5],
        [1.0],
        [2.0],
        None,
    )
    flagged = AbftCheck("suspect", 0, 3, 0, "layers.1.mlp.w1", "aten.mm.default", "forward", 2, 3, 4, 9.0, 1.0, "flag")
    clean = flagged._replace(step=2, verdict="ok")
    from pipelines.tensor_diff import BucketFindings

    findings = BucketFindings(
        None, (10, 1, 0, 0, 9, 0), [(fault.id, {"traced_site": "layers.1.mlp", "fingerprint_detected": True})]
    )
    with pipeline() as p:
        out = (
            p
            | "Findings" >> beam.Create([(0, ("bucket", findings))])
            | RankFindings(p | "Faults" >> beam.Create([fault]), p | "Checks" >> beam.Create([flagged, clean]))
        )
        rows = out | beam.FlatMap(lambda t: [(t[0], r) for r in t[1].to_pylist()])
        summary = rows | beam.Map(
            lambda tr: (
                tr[0],
                tr[1].get("outcome") or tr[1].get("detector") or (tr[1]["fingerprint_detected"], tr[1]["abft_flagged"]),
            )
        )
        assert_that(
            summary,
            equal_to(
                [
                    ("faults", (True, True)),
                    ("abft", "tp"),
                    ("abft", "tn"),
                    ("detection_scores", "fingerprint"),
                    ("detection_scores", "abft"),
                ]
            ),
        )


def test_loss_curves_join_both_runs_per_rank() -> None:
    golden = [(0, ("golden", _batch("step", 0, *[(s, {"loss": 2.0}) for s in range(12)])))]
    suspect = [
        (
            0,
            (
                "suspect",
                _batch("step", 0, *[(s, {"loss": 9.0 if s == 11 else 2.0}) for s in range(11)] + [(11, {"loss": 9.0})]),
            ),
        )
    ]
    with pipeline() as p:
        out = p | beam.Create(golden + suspect) | LossCurves()
        shape = out | beam.Map(lambda t: (t[0], t[1].num_rows))
        assert_that(shape, equal_to([("loss", 12), ("loss_spikes", 1)]))


def test_summarise_ranks_reports_problems_between_segments() -> None:
    header = RunHeader(SCHEMA_VERSION, "g", "n", "train", 1, 0, {}, "c", 0, "d", "lanes64-v1", {}, "cpu", {}, 0.0, {})
    run = RunLayout("/runs/g", {0: RankLayout(0, header, ((0, "/runs/g/rank-00000/000000.sdclog"),))}, 10)
    seg = lambda index, first: SegmentInfo(  # noqa: E731
        "golden",
        0,
        SegmentSummary(index, f"/runs/g/rank-00000/{index:06d}.sdclog", index, first, 5, False),
        5,
        index == 2,
        False,
        index,
        index,
    )
    with pipeline() as p:
        out = p | beam.Create([seg(0, 0), seg(2, 10)]) | SummariseRanks({"golden": run})
        problems = (
            out[TABLES]
            | beam.Filter(lambda t: t[0] == "corruptions")
            | beam.FlatMap(lambda t: [(r["path"], r["offset"]) for r in t[1].to_pylist()])
        )
        assert_that(problems, equal_to([("/runs/g/rank-00000/000001.sdclog", 0)]), label="Missing segment")
        assert_that(
            out["ranks"] | beam.Map(lambda i: (i.segments, i.records, i.complete, i.last_step)),
            equal_to([(2, 10, True, 2)]),
            label="Rank",
        )


def test_write_tables_moves_committed_files_into_place(tmp_path: Path) -> None:
    from pipelines.tables import named

    staging = str(tmp_path / "staging")
    row = {"rank": 0, "step": 1, "golden_loss": 2.0, "suspect_loss": 2.5, "diff": 0.5, "rel_diff": 0.25}
    with pipeline() as p:
        part = p | beam.Create([named("loss", [row]), named("loss", [{**row, "step": 2}])])
        paths = (part,) | WriteTables(staging, SCHEMAS)
        assert_that(paths | beam.Map(lambda path: Path(path).parent.name), equal_to(["loss"]))
    table = pq.read_table(tmp_path / "staging" / "loss")
    assert sorted(table.column("step").to_pylist()) == [1, 2] and not (tmp_path / "staging" / "_tmp").exists()


@pytest.mark.parametrize("steps_per_bucket", [1, 3])
def test_bucket_batches_split_by_step_and_copy(steps_per_bucket: int) -> None:
    cols = columns([(s, 0, "a", F, s) for s in (0, 1, 2, 3, 4, 0)])  # one step out of order
    batches = list(bucket_batches(cols, 7, steps_per_bucket))
    assert sorted(b for b, _ in batches) == sorted({s // steps_per_bucket for s in range(5)})
    assert sum(batch.num_rows for _, batch in batches) == 6
    assert all(set(batch.column("segment").to_pylist()) == {7} for _, batch in batches)


def test_route_events_keeps_fine_tune_rows_of_every_run_even_with_unreadable_fields() -> None:
    evaluation = {"task": "copy", "examples": 8, "correct": 6, "accuracy": 0.75, "chance": 0.25, "collapsed": False}
    elements = [
        (("golden", "finetune_eval", 0), _batch("finetune_eval", 0, (4, evaluation))),
        (
            ("twin", "finetune_prediction", 0),
            _batch(
                "finetune_prediction",
                0,
                (4, {"task": "add", "example": 3, "predicted": 1, "answer": 2}),
                (4, {"task": "add", "example": "three", "predicted": 1.5}),
            ),
        ),
    ]
    with pipeline() as p:
        out = p | beam.Create(elements) | RouteEvents({("golden", 0): "g", ("twin", 0): "t"})
        rows = out[TABLES] | beam.FlatMap(lambda t: [(t[0], tuple(r.values())) for r in t[1].to_pylist()])
        assert_that(
            rows,
            equal_to(
                [
                    ("finetune_eval", ("g", 0, 4, "copy", 8, 6, 0.75, 0.25, False)),
                    ("finetune_predictions", ("t", 0, 4, "add", 3, 1, 2)),
                    (
                        "finetune_predictions",
                        ("t", 0, 4, "add", None, None, None),
                    ),  # unreadable: counted, kept as nulls
                ]
            ),
        )
