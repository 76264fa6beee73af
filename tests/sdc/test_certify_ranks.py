"""`sdc certify` and `sdc record --resume-from` on 2 real data-parallel ranks (gloo, CPU) of the small workload:
a fault on rank 1 at step 3 reaches rank 0 through the gradient all-reduce in the same step, so the run's
certified checkpoint is step 2 (checkpoints every 2 steps) on both ranks; resumed from it on 2 healthy ranks, the
run matches golden bit for bit on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import queries
from faults import load_profile
from jobs.record import RecordRequest, record
from sdc.cli import main
from tests.support import ONE_FLIP, SMALL, small_config
from tracer.checkpoint import checkpoint_dir
from tracer.log import list_ranks

pytestmark = pytest.mark.slow  # records two runs on 2 ranks, diffs them, and resumes one on 2 ranks

SETTINGS = ["run.steps=6", "run.checkpoint_every=2", "parallel.dp=2"]


def test_two_ranks_certify_the_checkpoint_before_the_fault_and_resume_from_it(tmp_path: Path, capsys) -> None:
    profile = tmp_path / "flip.toml"
    profile.write_text(ONE_FLIP + "ranks = [1]\n", encoding="utf-8")  # step 3, rank 1 only
    golden, suspect, resumed = tmp_path / "golden", tmp_path / "suspect", tmp_path / "resumed"
    record(small_config(*SETTINGS), RecordRequest(out=golden, node_label="golden", progress=False), nproc=2)
    record(
        small_config(*SETTINGS),
        RecordRequest(out=suspect, node_label="suspect", progress=False, fault_profile=load_profile(profile)),
        nproc=2,
    )
    db = tmp_path / "study.duckdb"
    assert main(["certify", str(suspect), "--golden", str(golden), "--db", str(db)]) == 0
    certified = capsys.readouterr().out.strip()
    assert certified == str(checkpoint_dir(suspect, 2))
    rows = [
        (r["rank"], r["verified_until"], r["certified_step"], r["run_certified_step"])
        for r in queries.run(db, "last_clean_checkpoint").records()
    ]
    assert rows == [(0, 3, 2, 2), (1, 3, 2, 2)]

    sets = [a for s in [*SMALL, *SETTINGS] for a in ("--set", s)]
    assert (
        main(
            [
                "record",
                "--out",
                str(resumed),
                "--resume-from",
                certified,
                *sets,
                "--nproc",
                "2",
                "--node-label",
                "healthy",
                "--quiet",
            ]
        )
        == 0
    )
    assert "(resumed at step 2) on 2 ranks" in capsys.readouterr().out
    assert list_ranks(resumed) == [0, 1]
    assert main(["certify", str(resumed), "--golden", str(golden)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(checkpoint_dir(resumed, 6))
    assert "every record matched" in captured.err and "through step 5" in captured.err
