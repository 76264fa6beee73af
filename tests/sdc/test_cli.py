"""The `sdc` command line: its public surface, its happy paths and its one-line errors."""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sdc.cli import build_parser, main
from tests.support import SMALL

SMALL_ARGS = [a for kv in SMALL if not kv.startswith("run.") for a in ("--set", kv)]

# Changing the CLI is a deliberate act: update this snapshot with it.
SURFACE = {
    "record": [
        "--abft",
        "--capture-every",
        "--capture-names",
        "--capture-steps",
        "--checkpoint-every",
        "--config",
        "--device",
        "--fault-profile",
        "--fault-seed",
        "--node-label",
        "--out",
        "--overwrite",
        "--quiet",
        "--resume",
        "--segment-mb",
        "--set",
        "--sites",
        "--steps",
        "--nproc",
        "--tp",
        "--sp",
        "--dp",
        "--rank-timeout",
        "--workload",
        "--guard",
        "--resume-from",
    ],
    "inspect": ["--json", "--skip-corrupt"],
    "verify-determinism": [
        "--config",
        "--device",
        "--keep",
        "--quiet",
        "--set",
        "--steps",
        "--nproc",
        "--tp",
        "--sp",
        "--dp",
        "--rank-timeout",
        "--workload",
        "--report",
        "--capture-steps",
        "--margin",
    ],
    "replay": [
        "--at-first-divergence",
        "--fault-profile",
        "--fault-seed",
        "--golden",
        "--golden-from",
        "--mode",
        "--out",
        "--overwrite",
        "--quiet",
        "--steps",
        "--suspect",
        "--window",
        "--nproc",
        "--rank-timeout",
        "--workload",
    ],
    "incident": [
        "--at",
        "--fault-profile",
        "--fault-seed",
        "--golden",
        "--out",
        "--overwrite",
        "--suspect",
        "--workload",
    ],
    "faults": [],
    "diff": [
        "--baseline",
        "--db",
        "--golden",
        "--replay",
        "--skip-corrupt",
        "--staging",
        "--steps-per-bucket",
        "--suspect",
        "--twin",
        "--tolerance",
    ],
    "certify": ["--db", "--golden", "--skip-corrupt"],
    "watch": ["--golden", "--idle-timeout", "--keep-going", "--max-pending", "--progress-every", "--suspect"],
    "finetune": [
        "--fault-profile",
        "--fault-seed",
        "--from",
        "--node-label",
        "--out",
        "--overwrite",
        "--quiet",
        "--shuffle-seed",
        "--steps",
        "--tasks",
    ],
    "query": ["--db", "--format", "--list", "--sql"],
    "report": ["--db", "--out", "--overwrite", "--quiet"],
    "study": ["--out", "--overwrite", "--quiet", "--resume", "--set"],
    "demo": ["--out", "--overwrite", "--quiet", "--resume", "--set"],
}


def surface(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: sorted(o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help")
        for name, p in sub.choices.items()
    }


def test_public_surface_is_deliberate() -> None:
    assert surface(build_parser()) == {name: sorted(options) for name, options in SURFACE.items()}


def test_sdc_diff_builds_one_typed_request() -> None:
    from pipelines.arguments import DiffRequest
    from sdc.commands.diff import request

    args = build_parser().parse_args(
        [
            "diff",
            "--golden",
            "runs/A",
            "--suspect",
            "gs://bucket/B",
            "--db",
            "study.duckdb",
            "--replay",
            "runs/R1",
            "--replay",
            "runs/R2",
            "--twin",
            "runs/T",
            "--skip-corrupt",
            "--steps-per-bucket",
            "8",
            "--",
            "--runner=DirectRunner",
            "--direct_num_workers=2",
        ]
    )
    assert request(args) == DiffRequest(
        golden="runs/A",
        suspect="gs://bucket/B",
        db=Path("study.duckdb"),
        replays=("runs/R1", "runs/R2"),
        twin="runs/T",
        skip_corrupt=True,
        steps_per_bucket=8,
        beam_args=("--runner=DirectRunner", "--direct_num_workers=2"),
    )
    defaults = request(build_parser().parse_args(["diff", "--golden", "A", "--suspect", "B", "--db", "s.duckdb"]))
    assert defaults == DiffRequest(golden="A", suspect="B", db=Path("s.duckdb"))


def sdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sdc.cli", *args], capture_output=True, text=True, timeout=300)


def test_record_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "golden"
    assert main(["record", "--out", str(out), "--node-label", "g", "--steps", "3", "--quiet", *SMALL_ARGS]) == 0
    assert "recorded 3 steps" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "clean close" in text and "node 'g'" in text and "steps        0..2 (3 steps)" in text
    assert main(["inspect", str(out), "--json"]) == 0
    assert '"complete": true' in capsys.readouterr().out


@pytest.mark.slow
def test_verify_determinism_reports_bit_identical(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify-determinism", "--steps", "2", "--quiet", *SMALL_ARGS]) == 0
    assert capsys.readouterr().out.startswith("bit-identical:")


@pytest.mark.parametrize(
    "args, message",
    [
        (["record", "--config", "missing.toml", "--out", "{tmp}/x"], "missing.toml"),
        (["record", "--set", "model.dimm=3", "--out", "{tmp}/x"], "model.dimm"),
        (["record", "--set", "model.dim=abc", "--out", "{tmp}/x"], "model.dim"),
        (["inspect", "{tmp}/nothing"], "no such run directory"),
        (["inspect", "{tmp}/file.txt"], "not a directory"),
        (["inspect", "{tmp}"], "holds no rank-NNNNN"),
        (["record", "--out", "{tmp}/file.txt"], "is not a directory"),
        (["record", "--out", "{tmp}/file.txt/run"], "file.txt is a file, not a directory"),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # In process: main() returns 1 only for an SdcError it caught; anything else raises here. The tests that run
    # `sdc` as a process (test_existing_run_needs_overwrite_and_bad_logs_are_named) check the exit and the stream.
    (tmp_path / "file.txt").write_text("not a run")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 1
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("sdc: error: ") and message in lines[0], err


def build_without_sites(config: dict, device: object) -> object:
    """examples/own_workload.py's workload on a model with no attention or MLP block: no default sites."""
    import dataclasses

    import torch
    from torch import nn

    from examples import own_workload

    w = own_workload.build(config, device)
    m = w.config["model"]
    model = nn.Sequential(nn.Embedding(m["vocab"], m["dim"]), nn.Linear(m["dim"], m["vocab"]))
    return dataclasses.replace(w, model=model, optimizer=torch.optim.SGD(model.parameters()), scheduler=None)


def test_an_error_in_several_lines_prints_its_line_breaks_and_indents_the_later_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = "tests.sdc.test_cli:build_without_sites"
    assert main(["record", "--workload", workload, "--steps", "1", "--quiet", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "\\n" not in err, err
    first, *rest = err.rstrip("\n").split("\n")
    assert first.startswith("sdc: error: the Tracer found no default sites in Sequential"), err
    assert first.endswith("The model's modules:") and rest == ["  Sequential", "    0 Embedding", "    1 Linear"], err


@pytest.mark.slow
def test_existing_run_needs_overwrite_and_bad_logs_are_named(run_factory, tmp_path: Path) -> None:
    run = run_factory("golden")
    result = sdc("record", "--out", str(run), "--steps", "1", *SMALL_ARGS)
    assert result.returncode == 1 and "pass --overwrite" in result.stderr and "Traceback" not in result.stderr

    seg = run / "rank-00000" / "000000.sdclog"
    data = bytearray(seg.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0xFF
    seg.write_bytes(bytes(data))
    result = sdc("inspect", str(run))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert str(seg) in result.stderr and "byte" in result.stderr
    result = sdc("inspect", str(run), "--skip-corrupt")
    assert result.returncode == 0 and "skipped" in result.stdout

    newer = bytearray(data)
    newer[8:10] = struct.pack("<H", 99)
    seg.write_bytes(bytes(newer))
    result = sdc("inspect", str(run))
    assert result.returncode == 1 and "newer sdctrace" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_overwrite_replaces_a_run(run_factory, capsys: pytest.CaptureFixture[str]) -> None:
    run = run_factory("golden")
    assert main(["record", "--out", str(run), "--overwrite", "--steps", "1", "--quiet", *SMALL_ARGS]) == 0
    assert main(["inspect", str(run)]) == 0
    assert "steps        0..0 (1 step)" in capsys.readouterr().out


@pytest.mark.slow
def test_finetune_prints_accuracy_per_task(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ft"
    args = [
        "finetune",
        "--from",
        str(pretrained),
        "--out",
        str(out),
        "--node-label",
        "n",
        "--steps",
        "2",
        "--tasks",
        "copy,max",
        "--shuffle-seed",
        "3",
        "--quiet",
    ]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"fine-tuned 2 steps to {out}")
    assert [ln.split()[0] for ln in lines[1:]] == ["copy", "max"] and all("/128, chance 25%)" in ln for ln in lines[1:])
    result = sdc(*args)  # the run exists now
    assert result.returncode == 1 and "pass --overwrite" in result.stderr and "Traceback" not in result.stderr
    result = sdc("finetune", "--from", str(pretrained), "--out", str(tmp_path / "x"), "--tasks", "copy,nope")
    assert result.returncode == 1 and "nope" in result.stderr and "Traceback" not in result.stderr
