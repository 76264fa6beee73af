"""Each row's provenance on both fault models, from the profiles their generators write, read back by the real query.

The profiles go into a small DuckDB study database as run headers record them (``runs.extra``, written as
pipelines/log_source.py writes it), `rq1_fleet_profiles` reads them back, and every finding's provenance function
judges them: the answer must follow from the rules actually drawn (NaN/Inf and exponent-bit flips make row 5 built
in, the injected-count rule makes row 3 built in for any model) and name the project's own choices as such.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from analysis.load import ensure_schema
from analysis.queries import LIBRARY
from analysis.reproduction import FINDINGS
from analysis.reproduction_provenance import CHOSEN
from analysis.reproduction_rules import Rows
from faults import load_profile
from faults.fleet import FleetSpec, fleet
from faults.fleet_hardware import hardware_fleet

# row -> provenance kind, per model (rows numbered as in the table)
EXPECTED = {
    "study": {1: "built in", 2: "built in", 3: "built in", 4: "built in", 5: "built in", 6: "built in"}
    | {7: "calibrated", 15: "built in"}
    | dict.fromkeys(range(8, 15), "emergent"),
    "hardware": {1: "built in", 2: "built in", 3: "built in", 4: "built in", 5: "built in", 6: "built in"}
    | {7: "built in", 15: "emergent"}
    | dict.fromkeys(range(8, 15), "emergent"),
}


def profile_rows(tmp_path: Path, model: str, nodes: int = 15) -> Rows:
    """rq1_fleet_profiles' rows for a fleet of `model` (seed 1), its profiles recorded as run headers record them."""
    spec = FleetSpec(nodes=nodes, seed=1, model=model)
    drawn = hardware_fleet(spec) if model == "hardware" else fleet(spec)
    db = tmp_path / f"{model}.duckdb"
    con = duckdb.connect(str(db))
    try:
        ensure_schema(con)
        for i, node in enumerate(drawn):
            path = tmp_path / f"{model}-{node.label}.toml"
            path.write_text(node.text, encoding="utf-8")
            extra = json.dumps({"fault_profile": load_profile(path).header(7)}, sort_keys=True, default=repr)
            con.execute(
                "INSERT INTO runs (run_id, rank, path, node_label, role, extra) VALUES (?, 0, ?, ?, 'train', ?)",
                [f"run-{i}", str(path), node.label, extra],
            )
    finally:
        con.close()
    return LIBRARY.run(db, "rq1_fleet_profiles").records()


@pytest.mark.parametrize("model", ["study", "hardware"])
def test_every_rows_provenance_follows_the_rules_drawn(tmp_path: Path, model: str) -> None:
    rows = profile_rows(tmp_path, model)
    got = {i: f.provenance(rows).kind for i, f in enumerate(FINDINGS, 1)}
    assert got == EXPECTED[model]


@pytest.mark.parametrize("model", ["study", "hardware"])
def test_row_3_is_built_in_because_its_rule_counts_injected_faults(tmp_path: Path, model: str) -> None:
    why = FINDINGS[2].provenance(profile_rows(tmp_path, model)).why
    assert "counts the injected faults" in why and "whatever the model" in why
    # even a fleet with no burst chain: the rule reads the draw back
    steady = [r for r in profile_rows(tmp_path, "hardware") if r["p_enter"] is None]
    assert steady and FINDINGS[2].provenance(steady).kind == "built in"
    assert FINDINGS[2].provenance(steady).why.startswith("0 of 15 nodes' rules follow a burst chain")


def test_row_5_is_built_in_on_the_hardware_model_by_nan_inf_and_exponent_flips(tmp_path: Path) -> None:
    rows = profile_rows(tmp_path, "hardware")
    assert not [r for r in rows if r["kind"] == "scale"]  # no 100-1000x rule: the old check said emergent
    why = FINDINGS[4].provenance(rows).why
    assert "15 of 15 nodes have NaN/Inf outputs" in why and "15 of 15 nodes have exponent-bit flips" in why
    # each cause alone suffices
    nan_only = [r for r in rows if r["kind"] == "stuck"]
    assert {r["value"] for r in nan_only} == {"NaN", "Infinity", "-Infinity"}
    assert FINDINGS[4].provenance(nan_only).kind == "built in"
    flips = [r for r in rows if r["kind"] == "bitflip"]
    assert FINDINGS[4].provenance(flips).kind == "built in"
    mantissa = [{**r, "bits": "mantissa"} for r in flips]
    assert FINDINGS[4].provenance(mantissa).kind == "emergent"


def test_the_projects_own_choices_are_labelled(tmp_path: Path) -> None:
    hardware = profile_rows(tmp_path, "hardware")
    assert f"uniform bit positions, 23 of 32 bits mantissa: {CHOSEN}" in FINDINGS[3].provenance(hardware).why
    study = profile_rows(tmp_path, "study")
    assert CHOSEN not in FINDINGS[3].provenance(study).why  # mantissa flips: no position was chosen
    for rows in (study, hardware):
        assert f"the rates' range is {CHOSEN}" in FINDINGS[0].provenance(rows).why


def test_scripted_and_fine_tune_only_rules_do_not_count_for_pretraining_rows(tmp_path: Path) -> None:
    rows = profile_rows(tmp_path, "study")
    destroyer = [r for r in rows if r["steps"] is not None]
    assert destroyer and all(r["kind"] == "stuck" and r["value"] == "Infinity" for r in destroyer)
    # the destroyer's stuck-at-inf rule fires in one fine-tuning step only: it builds in row 15, not row 5
    assert FINDINGS[14].provenance(destroyer).kind == "built in"
    assert FINDINGS[4].provenance(destroyer).kind == "emergent"
