"""Names from a crafted log reach the terminal escaped: `sdc inspect` and `sdc diff` print no control characters
(ANSI escapes, \\r, bidirectional overrides) a log or database holds ("output safe to print", issue 31)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sdc.cli import main
from tests.watch.support import HEADER, steps_records
from tracer.log import LogWriter, TensorRecord, rank_dir

EVIL = "layers.0.\x1b[2J\x1b[31mattention\r\u202e"
SHOWN = "layers.0.\\x1b[2J\\x1b[31mattention\\r\\u202e"
RAW = ("\x1b", "\r", "\u202e")


def crafted(out: Path, run_id: str, flip_step: int | None) -> Path:
    """Five steps whose first site is named EVIL; with `flip_step`, that site's forward fingerprint differs there."""
    header = dataclasses.replace(HEADER, run_id=run_id, node_label=f"node-\x1b[31m{run_id}")
    with LogWriter(rank_dir(out, 0), header) as w:
        for rec in steps_records(range(5)):
            if isinstance(rec, TensorRecord):
                rec = dataclasses.replace(rec, name=EVIL) if rec.name == "layers.0.attention" else rec
                if rec.name == EVIL and rec.step == flip_step and rec.phase.name == "FORWARD":
                    rec = dataclasses.replace(rec, fingerprint=rec.fingerprint ^ 1)
                w.write_tensor(rec)
            else:
                w.write_event(rec)
    return out


def printed(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0
    out = capsys.readouterr()
    assert not any(ch in out.out + out.err for ch in RAW), repr(out)
    return out.out


def test_inspect_escapes_names_from_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = crafted(tmp_path / "golden", "golden", None)
    out = printed(capsys, ["inspect", str(run)])
    assert SHOWN in out and "node-\\x1b[31mgolden" in out


@pytest.mark.slow
def test_diff_escapes_names_from_the_logs_and_the_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden = crafted(tmp_path / "golden", "golden", None)
    suspect = crafted(tmp_path / "suspect", "suspect", 2)
    out = printed(
        capsys, ["diff", "--golden", str(golden), "--suspect", str(suspect), "--db", str(tmp_path / "study.duckdb")]
    )
    assert f"step 2, microbatch 0, forward {SHOWN}" in out, out
    assert "node-\\x1b[31msuspect" in out
