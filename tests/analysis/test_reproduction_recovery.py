"""Recovery rows: the measured numbers beside the injected ground truth, from the fault events, and the table that
names the two kinds of row.

The ground-truth columns of `rq1_fleet_nodes` are checked on a small DuckDB study database built here (fault events
with their original and corrupted values); each recovery function on hand-built rows with that query's columns.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest

from analysis import reproduction_recovery as rec
from analysis.load import ensure_schema
from analysis.queries import LIBRARY
from analysis.reproduction import FINDING, FINDINGS, RECOVERY, Reproduction, Row, models_markdown, to_html
from analysis.reproduction_provenance import Provenance
from analysis.reproduction_rules import Verdict
from tests.analysis.test_reproduction_rules import GOLDEN, TWINS, acc, rq1
from tests.analysis.test_reproduction_rules import rule as profile_rule


def truth(label: str, **kw: object) -> dict[str, object]:
    """An rq1_fleet_nodes row with the ground-truth columns."""
    injected = {"injected_median_rel": None, "injected_max_rel": None, "faults_traced": 0, "faults_detected": 0}
    base = rq1(label, **{k: v for k, v in kw.items() if k not in injected and k not in ("fano", "flagged")})
    return (
        base
        | {"fano": kw.get("fano"), "abft_flagged": kw.get("flagged", 0)}
        | {k: kw.get(k, v) for k, v in injected.items()}
    )


def test_the_rows_of_what_the_fault_model_injects_are_recovery_rows() -> None:
    kinds = {i: f.kind for i, f in enumerate(FINDINGS, 1)}
    assert [i for i, k in kinds.items() if k == RECOVERY] == [1, 2, 3, 4, 5, 6, 7, 15]
    assert [i for i, k in kinds.items() if k == FINDING] == list(range(8, 15))


def test_silence_and_frequency_set_measured_beside_injected() -> None:
    rows = [
        truth("node-01", calls=0, faults=0),
        truth("node-02", calls=0, faults=3, steps=0, fault_steps=2),  # faults injected, nothing measured
        truth("node-03", calls=9, faults=9, steps=12, fault_steps=9),
    ]
    r = rec.silence(rows, [])
    assert "node-02 silent vs 3 fault(s) injected" in r.beside and r.error == "1 of 3 node(s) misread (node-02)"
    r = rec.frequency(rows, [])
    assert "node-03 12 vs 9 of 24 steps" in r.beside and r.error == "at most 3 step(s) of 24 apart (node-03)"


def test_dispersion_severity_and_tail_give_the_factor_between_measured_and_injected() -> None:
    rows = [
        truth(
            "node-01",
            fano=2.0,
            fault_fano=1.0,
            severity=1e-4,
            injected_median_rel=1e-3,
            max_rel=516.0,
            injected_max_rel=0.5,
        ),
        truth(
            "node-02",
            fano=3.0,
            fault_fano=3.0,
            severity=1e-5,
            injected_median_rel=1e-5,
            max_rel=50.0,
            injected_max_rel=math.inf,
        ),
    ]
    assert "node-01 2 vs 1" in rec.dispersion(rows, []).beside
    assert rec.dispersion(rows, []).error.startswith("measured / injected: median factor 1.41 (0.15 decades)")
    assert rec.severity(rows, []).error.startswith("measured / injected: median factor 3.16 (0.5 decades)")
    tail = rec.tail(rows, [])
    assert "node-01 516 vs 0.5" in tail.beside and "node-02 50 vs inf" in tail.beside
    assert tail.error.startswith("1 node(s) measured 100x or more off where no injected element was (node-01")
    assert "1 injected 100x or more and not measured so (node-02)" in tail.error


def test_abft_noise_and_destroyed_against_the_ground_truth() -> None:
    rows = [truth("node-01", faults=10, outside=6, flagged=1, recall=0.1, faults_traced=8, faults_detected=7)]
    r = rec.abft_recall(rows, [])
    assert r.beside == "node-01 1 of 10 flagged vs 4 in checked matmuls"
    assert r.error == "fingerprints missed 1 of 8 injected faults in traced sites"
    noisy = [
        {"node_label": "node-01", "worst_ratio": 0.01, "faults": 0},
        {"node_label": "node-02", "worst_ratio": 0.0, "faults": 0},
    ]
    assert rec.noise(noisy, []).error == "1 of 2 node(s) with noise but no fault or faults but no noise (node-01)"
    accuracy = [
        *GOLDEN,
        *TWINS,
        acc("node-03", "suspect", "copy", 0.2),
        acc("node-04", "suspect", "copy", 0.8),
        # at chance on the task golden did not learn ("match"), as every node is there: not a destroyed node
        acc("node-04", "suspect", "match", 0.25),
        acc("node-05", "suspect", "match", 0.24),
    ]
    script = [profile_rule("node-03", "stuck", roles='["finetune"]', steps="[60]")]
    r = rec.destroyed(accuracy, script)
    assert r.beside == "at chance: node-03 vs scripted destroyer: node-03" and r.error == "0 node(s) on one side only"
    assert rec.destroyed(accuracy, []).error == "1 node(s) on one side only (node-03)"


def test_the_ground_truth_columns_come_from_the_fault_events(tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    con = duckdb.connect(str(db))
    ensure_schema(con)
    con.execute(
        "INSERT INTO runs (run_id, rank, path, node_label, role, extra) VALUES "
        "('g', 0, '/g', 'golden', 'train', '{}'), "
        "('s', 0, '/s', 'node-01', 'train', '{\"fault_profile\": {\"name\": \"node-01\"}}')"
    )
    con.execute(
        "INSERT INTO pairs (pair_id, golden_path, suspect_path, golden_run_id, suspect_run_id) VALUES "
        "('p', '/g', '/s', 'g', 's')"
    )
    for step in (1, 2, 3):
        con.execute(
            "INSERT INTO site_mismatch VALUES ('p', 'r', 0, ?, 0, 'layers.0', 'forward', 10, 1, 0.1, 0.5, 2.0)", [step]
        )
    faults = [  # (step, original, corrupted, fingerprint_detected)
        (1, [2.0, 4.0], [3.0, 4.0], True),  # one element changed by 0.5
        (2, [1.0], [1.001], False),  # by 1e-3
        (3, [1.0], [math.inf], None),  # Inf written, in an untraced site
        (9, [1.0], [1000.0], True),  # outside the replayed steps: not in the window's truth
    ]
    for i, (step, original, corrupted, seen) in enumerate(faults):
        con.execute(
            'INSERT INTO faults (pair_id, side, rank, step, kind, original, corrupted, segment, "offset", '
            "fingerprint_detected) VALUES ('p', 'suspect', 0, ?, 'bitflip', ?, ?, 0, ?, ?)",
            [step, original, corrupted, i, seen],
        )
    con.close()
    (row,) = LIBRARY.run(db, "rq1_fleet_nodes").records()
    assert row["injected_median_rel"] == pytest.approx(0.5)  # median of 0.5, 1e-3 and Inf
    assert row["injected_max_rel"] == math.inf
    assert (row["faults_traced"], row["faults_detected"]) == (2, 1)
    assert row["faults_in_window"] == 3 and row["faults"] == 4


def test_the_table_names_each_kind_of_row_in_words() -> None:
    recovery, finding = FINDINGS[0], FINDINGS[8]
    rep = Reproduction(
        (
            Row(recovery, Verdict("2 of 5", "reproduced"), Provenance("built in", "x"), rec.Recovery("a vs b", "0")),
            Row(finding, Verdict("3x", "not reproduced"), Provenance("emergent", "y")),
        )
    )
    text = models_markdown({"study": rep, "hardware": rep}, "t")
    assert "**RECOVERY rows (1) restate the fault model**" in text and "**FINDING rows (2) are about what" in text
    assert "| 1 | RECOVERY of what the fault model injects | RQ1 |" in text
    assert "| 2 | FINDING about what training does | RQ3 |" in text
    assert "| a vs b; recovery error: 0 |" in text and "**consistent** (built in)" in text
    assert "**not reproduced** (emergent)" in text
    assert "Totals, study: recovery rows: 1 consistent; finding rows: 1 not reproduced." in text
    page = to_html(rep, {})
    assert "RECOVERY rows (1) restate the fault model" in page and '<td class="consistent">consistent</td>' in page
