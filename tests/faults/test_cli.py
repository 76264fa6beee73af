"""`sdc faults list|show`."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdc.cli import main
from tests.faults.support import SHIPPED
from tracer.faults import load_profile


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
