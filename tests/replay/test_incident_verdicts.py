"""A bundle's verdicts.jsonl: what reproduce.py appends is what the analysis side reads back, it is never written
through a link, and `sdc incident load` refuses capture options and names a folder that is no bundle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from analysis.incident_signatures import read_verdicts
from replay.bundle_check import VERDICTS_FILE
from replay.bundle_reproduce import record_verdict
from sdc.cli import main


def result(verdict: str, emulated: str | None = None) -> dict:
    """The fields of `bundle_reproduce.reproduce`'s result that a verdict line keeps."""
    found = {
        "verdict": verdict,
        "repeats": 3,
        "runs_matching_golden": 3 if verdict == "transient" else 0,
        "runs_matching_suspect": 3 if verdict == "persistent here" else 0,
        "device": "cpu",
        "torch": "2.x",
    }
    return found | ({"emulated": {"profile": emulated}} if emulated else {})


def test_recorded_verdicts_read_back_in_order(tmp_path: Path) -> None:
    record_verdict(tmp_path, result("transient"))
    record_verdict(tmp_path, result("persistent here", "sick"), machine="node-2")
    first, second = read_verdicts(tmp_path / VERDICTS_FILE)
    assert first.machine and first.verdict == "transient" and first.emulated is None and first.repeats == 3
    assert (second.machine, second.verdict, second.emulated) == ("node-2", "persistent here", "sick")


def test_a_verdict_is_never_written_through_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("mine\n")
    bundle = tmp_path / "INC"
    bundle.mkdir()
    os.symlink(elsewhere, bundle / VERDICTS_FILE)
    with pytest.raises(OSError):
        record_verdict(bundle, result("transient"))
    assert elsewhere.read_text() == "mine\n"


def test_load_takes_bundles_alone_and_names_a_folder_without_a_manifest(tmp_path: Path, capsys) -> None:
    db = str(tmp_path / "study.duckdb")
    assert main(["incident", "--golden", "G", "load", str(tmp_path), "--db", db]) == 1
    assert "takes bundles alone" in capsys.readouterr().err
    assert main(["incident", "load", str(tmp_path), "--db", db]) == 1
    assert f"{tmp_path / 'manifest.json'}: no such file" in capsys.readouterr().err and not Path(db).exists()
