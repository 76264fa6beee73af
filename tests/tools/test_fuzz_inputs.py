"""tools/fuzz_inputs.py on a small sample: every crafted bundle, incident load, tolerance map, fault profile, study
file and study database is refused in one line naming the crafted file (or, a database still sdctrace's, read);
none ends in a traceback, a hang, a silent acceptance, a changed database or code run. (The claims one by one:
tests/tracer/test_bounded_read.py, tests/replay/test_bundle_*.py, tests/analysis/test_incident_signatures.py,
tests/pipelines/test_tolerance_map.py, tests/pipelines/test_foreign_db.py, tests/sdc/test_certify_files.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import fuzz_inputs


@pytest.mark.slow  # about 100 crafted inputs through their commands; the tests named above cover each claim
def test_a_small_campaign_has_nothing_bad(tmp_path: Path) -> None:
    counts = fuzz_inputs.campaign(tmp_path, 100, seed=0)
    bad = {key: n for key, n in counts.items() if key[1] in fuzz_inputs.BAD}
    assert not bad, bad
    kinds = {kind for kind, _ in counts}
    assert sum(counts.values()) == 100 and kinds == {"bundle", "load", "tolerance", "profile", "study", "database"}
    assert counts[("database", "one-line error")] > 0 and counts[("database", "ok")] > 0


def test_each_outcome_is_classified(tmp_path: Path) -> None:
    bundle = tmp_path / "x.json"
    bundle.write_text("{}")
    refused = fuzz_inputs.Case("profile", "empty", ("faults", "show", str(bundle)), str(bundle))
    assert fuzz_inputs.run_case(refused)[0] == "one-line error"
    elsewhere = fuzz_inputs.Case("profile", "named elsewhere", ("faults", "show", str(bundle)), "/nowhere")
    assert fuzz_inputs.run_case(elsewhere)[0] == "silently accepted"
    shipped = fuzz_inputs.Case("profile", "shipped", ("faults", "show", "healthy-node"), "healthy-node")
    assert fuzz_inputs.run_case(shipped)[0] == "silently accepted"  # exit 0 on a case built to be refused


def test_a_database_is_watched_by_whose_it_is(tmp_path: Path) -> None:
    """`sdc incident load` writes into a study database and exits 0: right for sdctrace's own (``ok``), ``data
    changed`` for one sdctrace did not create, whatever the exit."""
    bundle = fuzz_inputs.good_load_bundle(tmp_path)
    for i, (foreign, may_succeed, outcome) in enumerate([(False, True, "ok"), (True, False, "data changed")]):
        db = tmp_path / f"db-{i}.duckdb"
        assert fuzz_inputs.sdc_main(["incident", "load", str(bundle), "--db", str(db)]) == 0
        (bundle / "manifest.json").write_text((bundle / "manifest.json").read_text().replace('"s-1"', f'"s-{i + 2}"'))
        argv = ("incident", "load", str(bundle), "--db", str(db))
        case = fuzz_inputs.Case("database", "load", argv, str(db), str(db), foreign=foreign, may_succeed=may_succeed)
        assert fuzz_inputs.run_case(case)[0] == outcome
