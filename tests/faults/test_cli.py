"""`sdc faults list|show` and `sdc record --fault-profile/--fault-seed/--abft`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import load_profile
from sdc.cli import main
from tests.faults.support import SHIPPED, events
from tests.support import SMALL

SMALL_ARGS = [a for kv in SMALL if not kv.startswith("run.") for a in ("--set", kv)]


def test_faults_list_names_every_shipped_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faults", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {line.split()[0] for line in lines} == SHIPPED
    assert any("bursts" in line for line in lines if line.startswith("bursty-mismatch"))


def test_faults_show_prints_the_commented_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faults", "show", "rare-huge"]) == 0
    out = capsys.readouterr().out
    assert out == Path(load_profile("rare-huge").path).read_text(encoding="utf-8")
    assert out.startswith("# rare-huge:") and "[[fault]]" in out


@pytest.mark.slow
def test_record_with_a_profile_and_abft(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "suspect"
    args = [
        "record",
        "--out",
        str(out),
        "--steps",
        "2",
        "--quiet",
        "--fault-profile",
        "bursty-mismatch",
        "--fault-seed",
        "5",
        "--abft",
        *SMALL_ARGS,
    ]
    assert main(args) == 0
    capsys.readouterr()
    assert events(out, "fault") and events(out, "abft")
    assert main(["inspect", str(out), "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    assert summary["header"]["extra"]["fault_profile"]["name"] == "bursty-mismatch"
    assert summary["header"]["extra"]["fault_profile"]["seed"] == 5 and summary["header"]["extra"]["abft"] is True


def test_a_malformed_profile_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[fault]]\nops = ["matmul"]\nkind = "bitflip"\nbits = "exp"\n', encoding="utf-8")
    assert main(["record", "--out", str(tmp_path / "run"), "--fault-profile", str(bad), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sdc: error: {bad}: fault[0].bits = 'exp' must be \"sign\"") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
