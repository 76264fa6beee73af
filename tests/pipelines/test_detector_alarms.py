"""Offline detector alarms: the diff's detector_alarms and guard_decisions tables and the guard_detector_scores
query, checked against an independent count over the logs (plain Python over `LogReader` records, the detector
classes run directly, the harmful rule applied by hand)."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest

from analysis.queries import LIBRARY
from analysis.study_db import SCHEMA_VERSION
from faults import load_profile
from jobs.record import record_run
from pipelines.arguments import DiffRequest
from pipelines.run import diff
from tests.support import small_config
from tracer.guard import Evidence, GradNormSpike, History, LossSpike, NonFinite, TwinMismatch
from tracer.guard.evidence import step_fingerprint
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, Phase, TensorRecord

STEPS = 14  # the loss-spike profile corrupts steps 10 and 11; LossSpike needs 8 accepted steps first
IN_MEMORY = ["--direct_running_mode=in_memory"]
NOISE, LOSS = 0.01, 0.1  # the harmful rule's thresholds (docs/guard.md)


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """golden, the loss-spike node, and the same node recorded under the guard (policy skip), diffed."""
    tmp = tmp_path_factory.mktemp("alarms")
    cfg = small_config(f"run.steps={STEPS}")
    runs = {"golden": tmp / "golden", "spike": tmp / "spike", "spike-guarded": tmp / "spike-guarded"}
    record_run(cfg, runs["golden"], node_label="golden", progress=False)
    for label, guard in (("spike", None), ("spike-guarded", "skip")):
        record_run(
            cfg, runs[label], node_label=label, progress=False, fault_profile=load_profile("loss-spike"), guard=guard
        )
    db = tmp / "study.duckdb"
    for label in ("spike", "spike-guarded"):
        diff(
            DiffRequest(golden=str(runs["golden"]), suspect=str(runs[label]), db=db, beam_args=tuple(IN_MEMORY)),
            echo=lambda _: None,
        )
    return db, runs


def by_hand(run: Path, golden: Path) -> dict[str, dict[str, int]]:
    """Per detector: checked, faulty, harmful, alarms, true and false alarms, counted from the logs alone."""
    steps = read(run)
    golden_steps = read(golden)
    twin = {s: fp for s, (_, _, _, fp, _) in golden_steps.items()}
    guards = {r.step: r.fields for r in records(run) if isinstance(r, EventRecord) and r.kind == "guard"}
    evidence = {}
    for step, (loss, norm, nonfinite, fp, faults) in steps.items():
        if step in guards:  # the guard re-ran it: the detectors saw its first run
            first = guards[step]["runs"][0]
            loss, norm, nonfinite, fp = first["loss"], first["grad_norm"], first["nonfinite"], first["fingerprint"]
            faults = first["events"].get("fault", 0)
        evidence[step] = (loss, norm, nonfinite, fp, faults)
    first_fault = min((s for s, e in evidence.items() if e[4]), default=None)

    def harmful(step: int) -> bool:
        loss, golden_loss = evidence[step][0], golden_steps[step][0]
        return evidence[step][4] > 0 and abs(loss - golden_loss) / abs(golden_loss) > LOSS

    class Twin:
        def fingerprint(self, step: int) -> int | None:
            return twin.get(step)

    sets = {
        "non_finite": (NonFinite(),),
        "loss_spike": (LossSpike(),),
        "grad_norm_spike": (GradNormSpike(),),
        "twin_mismatch": (TwinMismatch(Twin()),),
        "guard": (NonFinite(), LossSpike(), GradNormSpike()),
    }
    counts = {}
    for name, detectors in sets.items():
        past = History()
        c = dict.fromkeys(("checked", "faulty", "harmful", "alarms", "true", "false", "harmful_caught"), 0)
        for step in sorted(evidence):
            loss, norm, nonfinite, fp, faults = evidence[step]
            e = Evidence(step, 0, loss, norm, nonfinite, 0, fp, None, past)
            fired = any(d.check(e) is not None for d in detectors)
            if not fired:
                past = past.after(e, 32)
            c["checked"] += 1
            c["faulty"] += faults > 0
            c["harmful"] += harmful(step)
            c["alarms"] += fired
            c["true"] += fired and faults > 0
            c["false"] += fired and faults == 0 and (first_fault is None or step < first_fault)
            c["harmful_caught"] += fired and harmful(step)
        counts[name] = c
    return counts


def read(run: Path) -> dict[int, tuple[float, float, int, int, int]]:
    """step -> (loss, gradient norm before clipping, NaN/Inf gradient elements, step fingerprint, fault events)."""
    grads: dict[int, list[tuple[str, int]]] = {}
    nonfinite: dict[int, int] = {}
    faults: dict[int, int] = {}
    done: dict[int, dict] = {}
    for r in records(run):
        if isinstance(r, TensorRecord) and r.phase == Phase.GRAD:
            grads.setdefault(r.step, []).append((r.name, r.fingerprint))
            nonfinite[r.step] = nonfinite.get(r.step, 0) + r.nan + r.inf
        elif isinstance(r, EventRecord) and r.kind == "fault":
            faults[r.step] = faults.get(r.step, 0) + 1
        elif isinstance(r, EventRecord) and r.kind == "step":
            done[r.step] = r.fields
    return {
        s: (f["loss"], f["grad_norm"], nonfinite[s], step_fingerprint(grads[s]), faults.get(s, 0))
        for s, f in done.items()
    }


def records(run: Path) -> list[TensorRecord | EventRecord]:
    return list(LogReader(rank_dir(run, 0)).records())


@pytest.mark.slow
def test_detector_scores_match_an_independent_count(scored: tuple[Path, dict[str, Path]]) -> None:
    db, runs = scored
    rows = {(r["node_label"], r["detector"]): r for r in LIBRARY.run(db, "guard_detector_scores").records()}
    assert {node for node, _ in rows} == {"spike", "spike-guarded"}
    for node in ("spike", "spike-guarded"):
        expected = by_hand(runs[node], runs["golden"])
        assert {d for n, d in rows if n == node} == set(expected)  # no ABFT in these runs: no abft_flags row
        for detector, c in expected.items():
            r = rows[node, detector]
            got = (
                r["checked_steps"],
                r["faulty_steps"],
                r["harmful_steps"],
                r["alarms"],
                r["true_alarms"],
                r["false_alarms"],
            )
            assert got == (c["checked"], c["faulty"], c["harmful"], c["alarms"], c["true"], c["false"]), (
                node,
                detector,
            )
            assert r["recall"] == (c["true"] / c["faulty"] if c["faulty"] else None)
            assert r["harmful_recall"] == (c["harmful_caught"] / c["harmful"] if c["harmful"] else None)
    # What the profile does, so that the counts above are not all zero: two faulty, harmful steps the loss catches.
    spike = rows["spike", "loss_spike"]
    assert (spike["faulty_steps"], spike["harmful_steps"], spike["true_alarms"], spike["false_alarms"]) == (2, 2, 2, 0)
    assert rows["spike-guarded", "guard"]["true_alarms"] == 2


@pytest.mark.slow
def test_guard_decisions_are_the_guard_events(scored: tuple[Path, dict[str, Path]]) -> None:
    db, runs = scored
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.execute(
            "SELECT step, detectors, outcome, action, accepted, runs, first_run_faults, "
            "accepted_run_faults FROM guard_decisions ORDER BY step"
        ).fetchall()
        guarded = con.execute("SELECT DISTINCT step FROM detector_alarms WHERE guarded ORDER BY step").fetchall()
        wall = con.execute("SELECT count(*) FROM detector_alarms WHERE wall_s > 0").fetchone()[0]
        schema = con.execute("SELECT version FROM sdctrace_schema").fetchall()
    finally:
        con.close()
    events = [r for r in records(runs["spike-guarded"]) if isinstance(r, EventRecord) and r.kind == "guard"]
    expected = [
        (
            e.step,
            [a["detector"] for a in e.fields["alarms"]],
            e.fields["outcome"],
            e.fields["action"],
            e.fields["accepted"],
            len(e.fields["runs"]),
            e.fields["runs"][0]["events"].get("fault", 0),
            None,
        )
        for e in events
    ]
    assert got == expected
    # p_call = 1: every re-run is hit too, elsewhere, so no two runs agree and the policy skips both steps.
    assert [(s, o, a, n) for s, _, o, a, _, n, *_ in got] == [
        (10, "unresolved", "skip", 3),
        (11, "unresolved", "skip", 3),
    ]
    assert guarded == [(10,), (11,)]
    assert wall > 0 and schema == [(SCHEMA_VERSION,)]


def test_the_step_event_holds_the_norm_before_clipping(tmp_path: Path) -> None:
    cfg = small_config("run.steps=2")
    record_run(cfg, tmp_path / "run", node_label="a", progress=False)
    logged = records(tmp_path / "run")
    for step in (0, 1):
        (done,) = [r for r in logged if isinstance(r, EventRecord) and r.kind == "step" and r.step == step]
        clipped = math.sqrt(
            sum(r.l2**2 for r in logged if isinstance(r, TensorRecord) and r.phase == Phase.GRAD and r.step == step)
        )
        assert clipped == pytest.approx(min(done.fields["grad_norm"], cfg.optim.grad_clip), rel=1e-3)


@pytest.mark.slow
def test_guard_outcome_sets_the_guarded_node_beside_the_unguarded_one(scored: tuple[Path, dict[str, Path]]) -> None:
    db, _ = scored
    (row,) = LIBRARY.run(db, "guard_outcome").records()
    assert (row["node_label"], row["guarded_node"], row["steps"]) == ("spike", "spike-guarded", STEPS)
    assert (
        row["flagged"],
        row["recomputed"],
        row["reruns"],
        row["unresolved"],
        row["skipped"],
        row["faulty_flagged"],
    ) == (2, 2, 4, 2, 2, 2)
    assert row["step_s"] > 0 and row["guarded_step_s"] > 0 and row["overhead"] is not None
    # Both runs left golden, differently: one took the corrupted updates, the other skipped two updates.
    assert row["drift"] > 0 and row["guarded_drift"] > 0 and row["drift"] != row["guarded_drift"]
    assert row["accuracy"] is None and row["guarded_accuracy"] is None  # not fine-tuned here
