"""RQ3 drift rates against numbers computed here from the checkpoints, with numpy.

Four small pretraining runs: golden (with sharpness), its shuffle-seed twin (the baseline), a
node with a shipped profile and a single-ulp trigger node; three diffs into one database. The
drift of every checkpoint is recomputed from the checkpoint tensors, the growth window and its
slope (numpy.polyfit) by the documented rule, and compared with the named queries.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pytest

from analysis import queries
from faults import load_profile
from jobs.record import record_run
from pipelines.arguments import DiffRequest
from pipelines.run import diff
from tests.pipelines.conftest import IN_MEMORY
from tests.support import events, small_config
from tracer.checkpoint import list_checkpoints, load_checkpoint
from tracer.errors import ValidationError
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord

pytestmark = pytest.mark.slow

STEPS, EVERY = 16, 1
SUSPECTS = ("golden-twin", "node-01", "node-02", "trigger-ulp")
TRIGGER = """
description = "one single-ulp flip of one element of layers.0.attention.wq's forward matmul at step 2"
seed = 5
[[fault]]
kind = "bitflip"
bits = 0
elements = 1
ops = ["matmul"]
sites = "layers\\\\.0\\\\.attention\\\\.wq"
phases = ["forward"]
microbatches = [0]
steps = [2]
p_call = 1.0
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drift")
    (root / "trigger.toml").write_text(TRIGGER, encoding="utf-8")
    size = [f"run.steps={STEPS}", f"run.checkpoint_every={EVERY}"]
    nodes = {
        "golden": ([], {"sharpness": 3}),
        "golden-twin": (["data.shuffle_seed=1"], {}),
        "node-01": ([], {"fault_profile": load_profile("bursty-mismatch")}),
        "node-02": ([], {"fault_profile": load_profile("softmax-norm")}),
        "trigger-ulp": ([], {"fault_profile": load_profile(root / "trigger.toml")}),
    }
    runs = {}
    for label, (overrides, options) in nodes.items():
        runs[label] = root / label
        record_run(small_config(*size, *overrides), runs[label], node_label=label, progress=False, **options)
    db = root / "study.duckdb"
    for label in SUSPECTS:
        diff(
            DiffRequest(
                golden=str(runs["golden"]),
                suspect=str(runs[label]),
                db=db,
                beam_args=tuple(IN_MEMORY),
                baseline=label == "golden-twin",
            ),
            echo=lambda line: None,
        )
    return {**runs, "db": db}


def drift_curve(golden: Path, suspect: Path) -> dict[int, float]:
    """||theta_s - theta_h|| / ||theta_h|| per checkpoint, over every floating-point model tensor."""
    out = {}
    for step in list_checkpoints(golden):
        g, s = load_checkpoint(golden, step).model, load_checkpoint(suspect, step).model
        names = [n for n in g if g[n].is_floating_point()]
        diff_sq = sum(np.sum((s[n].double().numpy() - g[n].double().numpy()) ** 2) for n in names)
        golden_sq = sum(np.sum(g[n].double().numpy() ** 2) for n in names)
        out[step] = math.sqrt(diff_sq) / math.sqrt(golden_sq)
    return out


def expected_rate(curve: dict[int, float], baseline: dict[int, float] | None) -> dict:
    steps = sorted(curve)
    saturation = None
    if baseline is not None:
        saturation = next((s for s in steps if baseline[s] > 0 and curve[s] >= 0.5 * baseline[s]), None)
    onset = next((s for s in steps if curve[s] > 0), None)
    window = [
        s for s in steps if onset is not None and s >= onset and curve[s] > 0 and (saturation is None or s < saturation)
    ]
    rate = np.polyfit(window, np.log([curve[s] for s in window]), 1)[0] if len(window) >= 2 else None
    return {
        "points": len(window),
        "first_step": window[0] if window else None,
        "last_step": window[-1] if window else None,
        "saturation_step": saturation,
        "drift_rate": rate,
        "final_drift": curve[steps[-1]],
    }


def faults_of(run: Path) -> int:
    return len(events(run, "fault"))


def test_drift_rate_matches_numpy_over_the_same_window(study: dict[str, Path]) -> None:
    baseline = drift_curve(study["golden"], study["golden-twin"])
    rows = {r["node_label"]: r for r in queries.run(study["db"], "rq3_drift_rate").records()}
    assert sorted(rows) == sorted(SUSPECTS)
    assert [r["baseline"] for r in queries.run(study["db"], "rq3_drift_rate").records()] == [False] * 3 + [True]
    for label in SUSPECTS:
        expected = expected_rate(
            drift_curve(study["golden"], study[label]), None if label == "golden-twin" else baseline
        )
        row = rows[label]
        for key in ("points", "first_step", "last_step", "saturation_step"):
            assert row[key] == expected[key], (label, key, row, expected)
        assert row["final_drift"] == pytest.approx(expected["final_drift"], rel=1e-9)
        if expected["drift_rate"] is None:
            assert row["drift_rate"] is None
        else:
            assert row["drift_rate"] == pytest.approx(expected["drift_rate"], rel=1e-6), (label, row)
        assert row["faults"] == faults_of(study[label]) and row["steps"] == STEPS
        assert row["sdc_rate"] == pytest.approx(faults_of(study[label]) / STEPS)
    assert rows["golden-twin"]["faults"] == 0 and rows["trigger-ulp"]["faults"] == 1
    assert rows["trigger-ulp"]["points"] >= 3, rows["trigger-ulp"]  # a single ulp grows for many checkpoints
    assert rows["node-01"]["faults"] > 1
    assert rows["node-02"]["saturation_step"] is not None  # the window rule's other end is exercised


def test_drift_spread_matches_the_rates_it_summarises(study: dict[str, Path]) -> None:
    rates = {r["node_label"]: r for r in queries.run(study["db"], "rq3_drift_rate").records()}
    (row,) = queries.run(study["db"], "rq3_drift_spread").records()
    fleet = [r for label, r in rates.items() if label.startswith("node-") and r["points"] >= 3 and r["faults"] > 0]
    assert row["node_label"] == "golden" and row["nodes"] == len(fleet) >= 1
    drift, sdc = np.array([r["drift_rate"] for r in fleet]), np.array([r["sdc_rate"] for r in fleet])
    assert [row["min_rate"], row["median_rate"], row["max_rate"]] == pytest.approx(
        [drift.min(), np.median(drift), drift.max()], rel=1e-12
    )
    assert row["rate_ratio"] == pytest.approx(drift.max() / drift.min(), rel=1e-12)
    assert [row["min_sdc_rate"], row["median_sdc_rate"], row["max_sdc_rate"]] == pytest.approx(
        [sdc.min(), np.median(sdc), sdc.max()], rel=1e-12
    )
    assert row["sdc_rate_decades"] == pytest.approx(np.log10(sdc.max() / sdc.min()), abs=1e-12)
    assert row["baseline_rate"] == pytest.approx(rates["golden-twin"]["drift_rate"], rel=1e-12)
    assert row["trigger_rate"] == pytest.approx(rates["trigger-ulp"]["drift_rate"], rel=1e-12)
    assert row["trigger_over_median"] == pytest.approx(rates["trigger-ulp"]["drift_rate"] / np.median(drift))


def test_sharpness_rows_are_the_logged_events(study: dict[str, Path]) -> None:
    logged = [
        r
        for r in LogReader(rank_dir(study["golden"], 0)).records()
        if isinstance(r, EventRecord) and r.kind == "sharpness"
    ]
    assert [e.step for e in logged] == list(range(0, STEPS + 1, EVERY))
    rows = queries.run(study["db"], "rq3_sharpness").records()
    assert [(r["step"], r["sharpness"], r["iterations"], r["converged"]) for r in rows] == [
        (e.step, e.fields["value"], e.fields["iterations"], e.fields["converged"]) for e in logged
    ]
    lrs = {e.step: e.fields["lr"][0] for e in events(study["golden"], "step")}
    for r in rows:
        assert r["node_label"] == "golden"
        if r["step"] < STEPS:
            assert r["lr"] == lrs[r["step"]] and r["two_over_lr"] == pytest.approx(2 / lrs[r["step"]])
        else:
            assert r["lr"] is None  # the final state is no step's
    with duckdb.connect(str(study["db"]), read_only=True) as con:
        (count,) = con.execute("SELECT count(*) FROM sharpness").fetchone()
    assert count == len(logged)  # only golden logged any


def test_a_baseline_must_differ_in_the_data_order_only(study: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"extra.fault_profile"):
        diff(
            DiffRequest(
                golden=str(study["golden"]),
                suspect=str(study["node-01"]),
                db=tmp_path / "x.duckdb",
                beam_args=tuple(IN_MEMORY),
                baseline=True,
            ),
            echo=lambda line: None,
        )
    with pytest.raises(ValidationError, match=r"data_order_fingerprint"):
        diff(
            DiffRequest(
                golden=str(study["golden"]),
                suspect=str(study["golden-twin"]),
                db=tmp_path / "y.duckdb",
                beam_args=tuple(IN_MEMORY),
            ),
            echo=lambda line: None,
        )


def test_report_plots_drift_rates_beside_sharpness(study: dict[str, Path], tmp_path: Path) -> None:
    from analysis.study_report import build_report

    report = build_report(study["db"], tmp_path / "report", progress=False)
    drawn = [p.name for p in report.images if p.name.startswith("rq3_drift_rates_")]
    assert len(drawn) == 1 and (tmp_path / "report" / drawn[0]).read_bytes().startswith(b"\x89PNG")
    shown = {name: result for s in report.sections for name, result, _ in s.tables}
    for name in ("rq3_drift_rate", "rq3_drift_spread", "rq3_sharpness"):
        assert shown[name] == queries.run(study["db"], name)
