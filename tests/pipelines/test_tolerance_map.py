"""The tolerance map (pipelines/tolerance.py): written and read back as the same frozen object, every field
checked and bounded with an error that names the file, the field and the fix; `within_band` decides by the
stats; the audit's ulp distance and relative error on real tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.nondeterminism import relative_error, ulp_distance
from pipelines.tolerance import (
    MAX_BYTES,
    ToleranceMap,
    TolerancePlace,
    load_tolerance_map,
    stats_band,
    within_band,
    write_tolerance_map,
)
from tracer.errors import ConfigError

PLACE = TolerancePlace("mix", "forward", 3, 12, 3, 1e-7, 2e-7, 4e-7)


def written(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "map.json"
    write_tolerance_map(path, ToleranceMap(("a", "b"), (0, 1), (0,), 2.0, {("mix", "forward"): PLACE}))
    doc = json.loads(path.read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    path.write_text(json.dumps(doc))
    return path


def test_a_map_reads_back_as_written(tmp_path: Path) -> None:
    tolerance = load_tolerance_map(written(tmp_path))
    assert tolerance.places == {("mix", "forward"): PLACE}
    assert (tolerance.runs, tolerance.steps, tolerance.ranks, tolerance.margin) == (("a", "b"), (0, 1), (0,), 2.0)
    with pytest.raises(AttributeError):
        tolerance.margin = 3.0  # type: ignore[misc]  # frozen: what the test expects to fail


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"format": "other"}, "format"),
        ({"version": 2}, "version"),
        ({"version": True}, "version"),  # equal to 1 in Python, found by tools/fuzz_inputs.py
        ({"margin": 0.5}, "margin"),
        ({"margin": float("nan")}, "margin"),
        ({"places__0__phase": "sideways"}, "places[0].phase"),
        ({"places__0__max_ulps": -1}, "places[0].max_ulps"),
        ({"places__0__band": "wide"}, "places[0].band"),
        ({"places__0__name": ""}, "places[0].name"),
        ({"measured__steps": [0] * ((1 << 20) + 1)}, "measured.steps"),
        ({"places": {"mix": 1}}, "places"),
        ({"places__0__band": 1e300}, "places[0].band"),  # it would excuse any difference there
        ({"places__0__band": 8.8e-7}, "places[0].band"),  # just past 2 x (2e-7 + the stats' rounding)
        ({"places__0__ulp_events": 4}, "places[0].ulp_events"),  # more than the 3 that differed
        ({"places__0__max_ulps": None}, "places[0].max_ulps"),  # while 3 events were measured in ulps
    ],
)
def test_every_bad_field_is_named_with_the_file_and_the_fix(tmp_path: Path, changes: dict, field: str) -> None:
    path = written(tmp_path, **changes)
    with pytest.raises(ConfigError) as e:
        load_tolerance_map(path)
    assert str(e.value).startswith(f"{path}: {field}: ") and "sdc verify-determinism --report" in str(e.value)


def test_a_duplicate_place_and_an_oversized_file_are_refused(tmp_path: Path) -> None:
    path = written(tmp_path)
    doc = json.loads(path.read_text())
    doc["places"].append(doc["places"][0])
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"places\[1\]: 'mix' forward listed twice"):
        load_tolerance_map(path)
    with path.open("r+b") as f:
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(ConfigError, match="more than a tolerance map may hold"):
        load_tolerance_map(path)


def test_within_band_compares_stats_at_listed_places_only() -> None:
    tolerance = ToleranceMap(("a", "b"), (0,), (0,), 2.0, {("mix", "forward"): PLACE})
    names = ["mix", "out"]
    name, phase = np.array([0, 0, 1, 0, 0]), np.array([0, 0, 0, 1, 0])  # mix fwd, mix fwd, out fwd, mix bwd, mix fwd
    g_l2 = np.array([1.0, 1.0, 1.0, 1.0, 1.0], np.float32)
    s_l2 = np.array([1.0 + 2e-7, 1.0 + 1e-3, 1.0, 1.0, 1.0], np.float32)
    same = np.zeros(5, np.int64)
    stats = {
        "l2": (g_l2, s_l2),
        "absmax": (g_l2, g_l2),
        "nan": (same, same),
        "inf": (same, same + [0, 0, 0, 0, 1]),
        "meta": (same, same),
    }
    assert within_band(tolerance, names, name, phase, stats).tolist() == [True, False, False, False, False]


def test_ulps_and_relative_error_of_real_tensors() -> None:
    a = torch.tensor([1.0, -2.0, 0.0, 3.0])
    b = a.clone()
    b[0] = torch.nextafter(torch.nextafter(a[0], torch.tensor(2.0)), torch.tensor(2.0))  # two ulps up
    b[2] = -0.0
    assert ulp_distance(a, b) == 2
    assert ulp_distance(a, a.double()) is None and ulp_distance(a, torch.full((4,), float("nan"))) is None
    assert relative_error(a, b) == pytest.approx(2 * 2.0**-23 / 1.0 * 1.0 / 3.0)  # max|a-b| / max|a|
    assert stats_band(1e-7, None, 2.0) == 2e-7 and stats_band(0.0, 1e-6, 1.0) > 1e-6


def _diff(tmp_path: Path, tolerance: Path, capsys: pytest.CaptureFixture[str], suspect: str = "S") -> tuple[int, str]:
    from sdc.cli import main

    args = ["diff", "--golden", "G", "--suspect", suspect, "--db", str(tmp_path / "x.duckdb")]
    code = main([*args, "--tolerance", str(tolerance)])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    "text, words",
    [
        ("[" * 100_000 + "]" * 100_000, "nest more than 16 deep"),
        ('{"format": "sdctrace-tolerance-map", "version": 1, "margin": 10e400}', "margin: the number 10e400"),
        ('{"format": "sdctrace-tolerance-map", "version": 1, "margin": ' + "9" * 5000 + "}", "margin: an integer"),
        ('{"format": "sdctrace-tolerance-map", "format": "x"}', "the key 'format' appears twice"),
    ],
)
def test_sdc_diff_refuses_an_unbounded_map_in_one_line(
    tmp_path: Path, text: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "map.json"
    path.write_text(text)
    code, err = _diff(tmp_path, path, capsys)
    assert code == 1 and words in err and str(path) in err and err.count("\n") == 0, err


def test_a_map_measured_on_the_suspect_itself_is_named_in_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = written(tmp_path)  # measured on runs "a" and "b"
    code, err = _diff(tmp_path, path, capsys, suspect="b")
    warning, error = err.splitlines()  # the warning, then the diff's own refusal of run folders that hold no log
    assert warning.startswith(f"sdc: warning: {path}: measured.runs names b, the suspect run itself"), err
    assert code == 1 and error.startswith("sdc: error: G: holds no log segments"), err
    (tmp_path / "b").mkdir()
    runs = (str(tmp_path / "a"), str(tmp_path / "b"))
    write_tolerance_map(path, ToleranceMap(runs, (0,), (0,), 2.0, {("mix", "forward"): PLACE}))
    code, err = _diff(tmp_path, path, capsys, suspect=str(tmp_path / "b" / ".." / "b"))  # the same folder
    assert f"names {tmp_path / 'b'}, the suspect run itself" in err.splitlines()[0], err
    code, err = _diff(tmp_path, path, capsys, suspect=str(tmp_path / "c"))
    assert "sdc: warning" not in err, err
