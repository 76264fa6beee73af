"""tools/fuzz_props.py's promise: every verdict line and tolerance-map place it draws is outside its reader's rule,
so the readers refuse each in one line naming the file and the field (the campaign counts an acceptance as bad).
Property-based: Hypothesis drives these tests and the generators they check (skipped without the [test] extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from analysis.incident_signatures import read_verdicts  # noqa: E402
from pipelines.tolerance import load_tolerance_map  # noqa: E402
from tools import fuzz_props  # noqa: E402
from tools.fuzz_inputs import MAP  # noqa: E402
from tracer.errors import ConfigError, ValidationError  # noqa: E402

SETTINGS = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _field(what: str) -> str:
    return what.split(" ", 1)[0]


@SETTINGS
@given(drawn=fuzz_props.verdict_lines())
def test_every_drawn_verdict_line_is_refused_naming_its_field(tmp_path: Path, drawn: tuple[str, dict]) -> None:
    what, line = drawn
    path = tmp_path / "verdicts.jsonl"
    path.write_text(json.dumps(line, ensure_ascii=True) + "\n", encoding="utf-8")
    with pytest.raises(ValidationError) as e:
        read_verdicts(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(path)) and _field(what) in message, (what, message)


@SETTINGS
@given(drawn=fuzz_props.map_places())
def test_every_drawn_tolerance_place_is_refused_naming_its_field(tmp_path: Path, drawn: tuple[str, dict]) -> None:
    what, place = drawn
    path = tmp_path / "map.json"
    path.write_text(json.dumps({**MAP, "places": [place]}, ensure_ascii=True), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_tolerance_map(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(path)) and _field(what) in message, (what, message)


def test_draws_are_the_same_for_a_seed() -> None:
    first = fuzz_props.draws(fuzz_props.verdict_lines(), 20, seed=5)
    assert len(first) == 20 and repr(first) == repr(fuzz_props.draws(fuzz_props.verdict_lines(), 20, seed=5))
