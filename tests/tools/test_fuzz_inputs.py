"""tools/fuzz_inputs.py on a small sample: every crafted bundle, incident load, tolerance map, fault profile and
study file is refused in one line naming the crafted file; none ends in a traceback, a hang, a silent acceptance,
a changed database or code run. (The claims one by one: tests/tracer/test_bounded_read.py,
tests/replay/test_bundle_*.py, tests/analysis/test_incident_signatures.py, tests/pipelines/test_tolerance_map.py.)"""

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
    assert sum(counts.values()) == 100 and kinds == {"bundle", "load", "tolerance", "profile", "study"}


def test_each_outcome_is_classified(tmp_path: Path) -> None:
    bundle = tmp_path / "x.json"
    bundle.write_text("{}")
    refused = fuzz_inputs.Case("profile", "empty", ("faults", "show", str(bundle)), str(bundle))
    assert fuzz_inputs.run_case(refused)[0] == "one-line error"
    elsewhere = fuzz_inputs.Case("profile", "named elsewhere", ("faults", "show", str(bundle)), "/nowhere")
    assert fuzz_inputs.run_case(elsewhere)[0] == "silently accepted"
    shipped = fuzz_inputs.Case("profile", "shipped", ("faults", "show", "healthy-node"), "healthy-node")
    assert fuzz_inputs.run_case(shipped)[0] == "silently accepted"  # exit 0 on a case built to be refused
