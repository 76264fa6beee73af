"""`sdc certify` and `sdc record --resume-from` on real recordings of the small workload, 10 steps with checkpoints
every 5: a suspect whose emulated fault hits step 7 certifies the checkpoint of step 5, its healthy twin the last
one (step 10), a run without a clean checkpoint exits 1, a run with nothing to compare with exits 2, and a run
resumed from the certified checkpoint on a healthy node matches golden bit for bit."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from faults import load_profile
from jobs.record import record_run
from sdc.cli import main
from tests.support import ONE_FLIP, SMALL, diff_first_divergence, small_config
from tracer.checkpoint import checkpoint_dir
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord

pytestmark = pytest.mark.slow  # records three runs of 10 steps and diffs them

STEPS = ["run.steps=10", "run.checkpoint_every=5"]
FAULT_STEP = 7


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("certify")
    profile = root / "flip.toml"
    profile.write_text(ONE_FLIP.replace("steps = [3]", f"steps = [{FAULT_STEP}]"), encoding="utf-8")
    r = SimpleNamespace(root=root, golden=root / "golden", suspect=root / "suspect", twin=root / "twin")
    record_run(small_config(*STEPS), r.golden, node_label="golden", progress=False)
    record_run(
        small_config(*STEPS), r.suspect, node_label="suspect", progress=False, fault_profile=load_profile(profile)
    )
    record_run(small_config(*STEPS), r.twin, node_label="twin", progress=False)
    return r


def certify(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, list[str]]:
    """`sdc certify ARGS`: exit status, stdout, and the lines of stderr after the diff's own."""
    code = main(["certify", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, [line for line in captured.err.splitlines() if line.startswith(("certified", "sdc"))]


def test_a_fault_at_step_7_certifies_the_checkpoint_of_step_5(runs: SimpleNamespace, capsys) -> None:
    code, out, err = certify(capsys, runs.suspect, "--golden", runs.golden)
    assert code == 0 and out == f"{checkpoint_dir(runs.suspect, 5)}\n"
    assert err == [
        f"certified: step 5 of {runs.suspect} (rank 0 diverged from {runs.golden} at step {FAULT_STEP} "
        "(layers.1.feed_forward forward))"
    ]


def test_the_healthy_twin_certifies_its_last_checkpoint(runs: SimpleNamespace, capsys) -> None:
    code, out, err = certify(capsys, runs.twin, "--golden", runs.golden)
    assert code == 0 and out == f"{checkpoint_dir(runs.twin, 10)}\n"
    assert "every record matched" in err[0] and "through step 9" in err[0]


def test_a_database_that_holds_the_pair_is_used_without_a_diff(runs: SimpleNamespace, capsys) -> None:
    db = runs.root / "study.duckdb"
    assert certify(capsys, runs.suspect, "--golden", runs.golden, "--db", db)[:2] == (
        0,
        f"{checkpoint_dir(runs.suspect, 5)}\n",
    )
    loaded = db.stat().st_mtime_ns
    code = main(["certify", str(runs.suspect), "--golden", str(runs.golden), "--db", str(db)])
    captured = capsys.readouterr()
    assert code == 0 and captured.out == f"{checkpoint_dir(runs.suspect, 5)}\n"
    assert db.stat().st_mtime_ns == loaded  # no diff ran: the pair's rows were there


def test_a_run_that_diverged_before_its_first_checkpoint_has_none_clean(runs: SimpleNamespace, capsys) -> None:
    # The suspect as a run that kept only its last checkpoint (step 10): the fault at step 7 came before it.
    kept = runs.root / "kept-last"
    shutil.copytree(runs.suspect, kept)
    for step in (0, 5):
        shutil.rmtree(checkpoint_dir(kept, step))
    code, out, err = certify(capsys, kept, "--golden", runs.golden)
    assert code == 1 and out == "" and len(err) == 1
    assert (
        err[0].startswith(
            f"sdc certify: no clean checkpoint in {kept}: rank 0 diverged from {runs.golden} at step {FAULT_STEP}"
        )
        and "steps 10)" in err[0]
    )


def test_without_golden_a_run_without_replicas_has_nothing_to_certify_against(runs: SimpleNamespace, capsys) -> None:
    code, out, err = certify(capsys, runs.twin)
    assert code == 2 and out == "" and len(err) == 1 and "nothing to certify" in err[0] and "--golden" in err[0]


def test_resuming_from_the_certified_checkpoint_on_a_healthy_node_matches_golden(runs: SimpleNamespace, capsys) -> None:
    code, certified, _ = certify(capsys, runs.suspect, "--golden", runs.golden)
    resumed = runs.root / "resumed"
    sets = [a for s in [*SMALL, *STEPS] for a in ("--set", s)]
    assert (
        code == 0
        and main(
            [
                "record",
                "--out",
                str(resumed),
                "--resume-from",
                certified.strip(),
                *sets,
                "--node-label",
                "healthy",
                "--quiet",
            ]
        )
        == 0
    )
    assert "resumed at step 5" in capsys.readouterr().out
    reader = LogReader(rank_dir(resumed, 0))
    assert reader.header.node_label == "healthy" and "fault_profile" not in reader.header.extra
    assert reader.header.extra["forked_from"] == {
        "run": str(runs.suspect),
        "run_id": LogReader(rank_dir(runs.suspect, 0)).header.run_id,
        "node_label": "suspect",
        "step": 5,
    }
    steps = [r.step for r in reader.records() if isinstance(r, EventRecord) and r.kind == "step"]
    assert steps == list(range(10)) and reader.status.complete
    assert diff_first_divergence(runs.golden, resumed, runs.root / "resumed.duckdb") == []  # bit for bit golden's
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["step-000000", "step-000005", "step-000010"]
    # The suspect itself, resumed from its own checkpoint again with its fault: the fault at step 7 comes back.
    again = runs.root / "again"
    fault = ["--fault-profile", str(runs.root / "flip.toml")]
    assert (
        main(
            [
                "record",
                "--out",
                str(again),
                "--resume-from",
                certified.strip(),
                *sets,
                *fault,
                "--node-label",
                "suspect",
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert [row[0] for row in diff_first_divergence(runs.golden, again, runs.root / "again.duckdb")] == [FAULT_STEP]


def test_resume_from_refuses_what_is_not_a_checkpoint_or_a_checkpoint_of_out_itself(
    runs: SimpleNamespace, capsys
) -> None:
    sets = [a for s in [*SMALL, *STEPS] for a in ("--set", s)]
    for target, out, said in (
        (runs.suspect, runs.root / "x", "expected a checkpoint directory"),
        (checkpoint_dir(runs.suspect, 3), runs.root / "x", "expected a checkpoint directory"),
        (checkpoint_dir(runs.twin, 5), runs.twin, "names a checkpoint of --out itself"),
    ):
        assert main(["record", "--out", str(out), "--resume-from", str(target), *sets, "--quiet"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert not (runs.root / "x").exists()
