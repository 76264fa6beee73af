"""Reading incident bundles on the analysis side: every field typed and bounded, errors naming the file, the field
and the fix; loading replaces a bundle's rows. (tests/replay/test_incident_fleet.py loads real bundles.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from analysis import queries
from analysis.incident_signatures import VERDICTS_BYTES, load_incidents, read_bundle
from tracer.errors import ValidationError

# The fields a manifest of `sdc incident` holds that the reader reads (the rest, ops and tensors, it skips).
MANIFEST = {
    "format": "sdctrace-incident/1",
    "site": {"step": 3, "microbatch": 0, "name": "layers.1.feed_forward", "phase": "forward"},
    "golden": {"path": "runs/golden", "run_id": "g-1", "node_label": "golden"},
    "suspect": {"node_label": "node-7", "kind": "run", "path": "runs/node-7", "run_id": "s-1"},
    "ops": [{"op": "aten.mm.default"}],
    "signatures": [
        {
            "output": 0,
            "dtype": "float32",
            "shape": [2, 32, 128],
            "shape_class": "2x32x128",
            "elements": 8192,
            "differing": 3,
            "fields": {"sign": 0, "exponent": 3, "mantissa": 1},
            "bits": {"27": 3, "2": 1},
            "ulps_max": 134217728.0,
            "ulps_median": 134217728.0,
            "positions": [5, 37, 69],
            "coordinates": [],
            "period": 32,
            "offset": 5,
            "op": "aten.mm.default",
            "step": 3,
            "site": "layers.1.feed_forward",
        }
    ],
}


def bundle(root: Path, name: str, manifest: dict[str, Any] | None = None, verdicts: str | None = None) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(manifest or MANIFEST), encoding="utf-8")
    if verdicts is not None:
        (folder / "verdicts.jsonl").write_text(verdicts, encoding="utf-8")
    return folder


VERDICT = {
    "machine": "host-1",
    "verdict": "persistent here",
    "emulated": None,
    "repeats": 5,
    "device": "cpu",
    "torch": "2.9.0",
    "unix": 1.0,
    "runs_matching_golden": 0,
    "runs_matching_suspect": 5,
}


def test_a_bundle_reads_into_typed_rows(tmp_path: Path) -> None:
    inc = read_bundle(bundle(tmp_path, "INC", verdicts=json.dumps(VERDICT) + "\n\n"))
    assert (inc.node_label, inc.run_id, inc.golden_run_id, inc.step, inc.site) == (
        "node-7",
        "s-1",
        "g-1",
        3,
        "layers.1.feed_forward",
    )
    (sig,) = inc.signatures
    assert sig.bits == {27: 3, 2: 1} and sig.top_bit == (27, 3) and sig.fields == (0, 3, 1)
    assert sig.period == 32 and sig.offset == 5 and sig.shape == (2, 32, 128)
    (v,) = inc.verdicts
    assert (v.machine, v.verdict, v.emulated, v.repeats) == ("host-1", "persistent here", None, 5)
    assert len(inc.incident_id) == 16


def broken(change: str, value: Any) -> dict[str, Any]:
    """MANIFEST with the field at dotted path ``change`` set to ``value``."""
    manifest = copy.deepcopy(MANIFEST)
    *parents, last = change.split(".")
    node: Any = manifest
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = value
    return manifest


@pytest.mark.parametrize(
    ("change", "value", "message"),
    [
        ("site.step", "3", "field site.step is str, expected int"),
        ("site.step", True, "field site.step is bool"),
        ("site.name", "x" * 5000, "field site.name is 5000 characters long"),
        ("suspect", [], "field suspect is list, expected dict"),
        ("signatures.0.bits", {"99": 1}, "has the key '99', expected a bit index"),
        ("signatures.0.differing", 10**6, "field signatures[0].differing = 1000000 lies outside"),
        ("signatures.0.period", 0, "field signatures[0].period = 0 lies outside"),
        ("signatures.0.ulps_max", -1, "is not a distance"),
        ("signatures.0.shape", [2, -1], "is not a list of dimensions"),
        ("signatures", [{}] * 5000, "holds 5000 entries, at most 4096"),
    ],
)
def test_a_damaged_manifest_is_refused_naming_the_file_and_field(
    tmp_path: Path, change: str, value: Any, message: str
) -> None:
    with pytest.raises(ValidationError, match="manifest.json: ") as info:
        read_bundle(bundle(tmp_path, "INC", broken(change, value)))
    assert message in str(info.value) and "capture it again with `sdc incident`" in str(info.value)


def test_files_beyond_their_bounds_and_bad_verdict_lines_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="INC/manifest.json: no such file"):
        read_bundle(tmp_path / "INC")
    with pytest.raises(
        ValidationError,
        match="field format is 'sdctrace-incident/9', this sdctrace reads "
        "sdctrace-incident/1; load it with the sdctrace that wrote it",
    ):
        read_bundle(bundle(tmp_path, "OLD", broken("format", "sdctrace-incident/9")))
    (tmp_path / "OLD" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValidationError, match="OLD/manifest.json: arrays and objects nest more than 32 deep"):
        read_bundle(tmp_path / "OLD")
    folder = bundle(tmp_path, "INC", verdicts=json.dumps(VERDICT) + "\n{not json\n")
    with pytest.raises(ValidationError, match=r"verdicts.jsonl: line 2: not valid JSON .*; remove that line"):
        read_bundle(folder)
    (folder / "verdicts.jsonl").write_text(json.dumps({**VERDICT, "repeats": "5"}) + "\n")
    with pytest.raises(ValidationError, match=r"field \(line 1\).repeats is str, expected int; remove that line"):
        read_bundle(folder)
    (folder / "verdicts.jsonl").write_text((json.dumps(VERDICT) + "\n") * (VERDICTS_BYTES // 100))
    with pytest.raises(ValidationError, match=r"bytes, more than a bundle's verdicts.jsonl may hold \(4,194,304\)"):
        read_bundle(folder)


def test_loading_replaces_a_bundles_rows_and_groups_them(tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    other = broken("suspect.node_label", "node-8")
    one, two = bundle(tmp_path, "A"), bundle(tmp_path, "B", other, json.dumps(VERDICT) + "\n")
    load_incidents(db, [one, two])
    load_incidents(db, [two])  # again: replaced, not doubled
    copy_of_two = bundle(tmp_path, "B-copy", other, json.dumps({**VERDICT, "machine": "host-2", "unix": 2.0}) + "\n")
    load_incidents(db, [copy_of_two])  # a copy of the bundle that travelled: its verdicts join the others
    (row,) = queries.run(db, "signature_groups").records()
    assert (row["top_bit"], row["period"], row["nodes"], row["incidents"], row["outputs"]) == (27, 32, 2, 2, 2)
    assert row["node_labels"] == ["node-7", "node-8"] and row["persistent_machines"] == ["host-1", "host-2"]
    assert row["reproductions"] == 2
    with pytest.raises(ValidationError, match="C/manifest.json: no such file"):
        load_incidents(db, [one, tmp_path / "C"])  # nothing is written when one bundle is unreadable
    assert queries.run(db, "SELECT count(*) FROM incident_signatures").rows == [(2,)]


def _load(tmp_path: Path, folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from sdc.cli import main

    code = main(["incident", "load", str(folder), "--db", str(tmp_path / "study.duckdb")])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("change", "value", "words"),
    [
        ("site.name", "layers.\ud800", "site.name: the string"),
        ("suspect.node_label", "node-\udfff", "lone surrogate"),
        ("signatures.0.bits", {"\u00b2": 3}, "has the key '²', expected a bit index"),  # superscript two
        ("signatures.0.bits", {"\u0662\u0667": 3}, "expected a bit index"),  # Arabic-Indic 27
        ("signatures.0.bits", {"\uff12\uff17": 3}, "expected a bit index"),  # full-width 27
        ("signatures.0.shape", [1 << 63], "is not a list of dimensions"),
        ("signatures.0.shape", [1 << 70], "shape[0]: an integer of 22 digits"),
        ("signatures.0.elements", 8193, "is not the product of the shape"),
        ("signatures.0.bits", {}, "do not fit 3 differing elements"),  # each differing element has a flipped bit
        ("signatures.0.bits", {"27": 4}, "do not fit 3 differing elements"),  # no bit flips in more than differ
        ("signatures.0.fields", {"sign": 0, "exponent": 0, "mantissa": 0}, "do not fit 3 differing elements"),
        ("signatures", [MANIFEST["signatures"][0]] * 2, "names an output a signature named before"),
        ("signatures.0.bits", {"27": 3, "2": 1, "02": 1}, "has the key '02'"),  # bit 2 twice, once normalised
        ("signatures.0.bits", {"27": 3, "32": 1}, "expected a bit index 0..31 of float32"),
        ("signatures.0.dtype", "float99", "dtype = 'float99' is none of float64"),
        ("signatures.0.shape_class", "1x1", "shape_class = '1x1' is not '2x32x128'"),  # grouped with other shapes
        ("signatures.0.ulps_median", 1e12, "exceeds ulps_max"),
        ("signatures.0.offset", 32, "is no offset within period = 32"),
        ("signatures.0.offset", None, "is no offset within period = 32"),
        ("site.phase", "sideways", "site.phase = 'sideways' is none of forward"),
    ],
)
def test_sdc_incident_load_refuses_a_crafted_manifest_in_one_line(
    tmp_path: Path, change: str, value: Any, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "INC"
    folder.mkdir()
    text = json.dumps(broken(change, value), ensure_ascii=True)  # lone surrogates as \ud800 escapes
    (folder / "manifest.json").write_text(text, encoding="utf-8")
    code, err = _load(tmp_path, folder, capsys)
    assert code == 1 and words in err and "manifest.json" in err and err.count("\n") == 0, err


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (json.dumps({**VERDICT, "verdict": "innocent"}), "(line 1).verdict = 'innocent' is none of transient"),
        (json.dumps({**VERDICT, "machine": "host-\ud800"}), "machine: the string"),
        ('{"machine": "a", "machine": "b"}', "the key 'machine' appears twice"),
        (json.dumps({**VERDICT, "repeats": 0}), "(line 1).repeats = 0 lies outside [1, 10000]"),  # a verdict of no run
        (json.dumps({**VERDICT, "repeats": 10_001}), "lies outside [1, 10000]"),  # more than reproduce runs
        (json.dumps({**VERDICT, "verdict": "nondeterministic", "repeats": 1}), "one run cannot differ from another"),
    ],
)
def test_sdc_incident_load_refuses_a_crafted_verdict_line(
    tmp_path: Path, line: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = bundle(tmp_path, "INC", verdicts=line + "\n")
    code, err = _load(tmp_path, folder, capsys)
    assert code == 1 and words in err and "verdicts.jsonl" in err and err.count("\n") == 0, err


def test_a_manifest_with_a_duplicate_key_is_refused(tmp_path: Path) -> None:
    folder = bundle(tmp_path, "INC")
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(text.replace('"format"', '"site": {}, "format"', 1))
    with pytest.raises(ValidationError, match="the key 'site' appears twice in one object"):
        read_bundle(folder)


def test_the_dtypes_shape_classes_and_repeats_it_checks_are_those_of_replay(tmp_path: Path) -> None:
    import torch

    from analysis.incident_signatures import MAX_REPEATS, WIDTHS, shape_class
    from faults.corrupt import LAYOUTS
    from replay import signature
    from replay.bundle_check import BundleError
    from replay.bundle_reproduce import reproduce

    assert WIDTHS == {str(dtype).removeprefix("torch."): layout[0] for dtype, layout in LAYOUTS.items()}
    with pytest.raises(BundleError, match=f"give 1 to {MAX_REPEATS} "):
        reproduce(tmp_path, repeats=MAX_REPEATS + 1)
    for shape in [(), (0,), (1,), (3, 100), (2, 32, 128), (5, 1, 7, 1025)]:
        assert shape_class(shape) == signature.shape_class(torch.Size(shape))
