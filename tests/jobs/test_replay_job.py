"""The replay job: the output directory is claimed once, by the job, and a launched rank gets the request
serialised (the fault profile in its header form) and hands back its summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.replay import golden_header, replay, replay_rank
from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile, suspect_from_run
from replay.results import ReplaySummary
from sdc.cli import main
from tests.support import ONE_FLIP, events, hold_run_dir
from tracer.errors import UsageError
from tracer.log import claim_out_dir, list_ranks


def test_the_replayer_writes_into_the_directory_its_job_claimed(run_factory, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=3", "run.checkpoint_every=2")
    request = ReplayRequest(
        golden, tmp_path / "replay", parse_steps("2"), suspect_from_profile("healthy-node"), progress=False
    )
    # The job's one claim: the Replayer claims nothing itself (a second claim in this process would be refused).
    with claim_out_dir(request.out, role="replay", overwrite=False, inputs=(golden,)):
        summary = Replayer(request).run()
    assert [r.step for r in summary.steps] == [2] and events(request.out, "site_mismatch")


def test_a_held_directory_is_refused_before_anything_is_written(run_factory, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=3", "run.checkpoint_every=2")
    out = tmp_path / "replay"
    holder = hold_run_dir(out)
    try:
        request = ReplayRequest(golden, out, parse_steps("2"), suspect_from_profile("healthy-node"), progress=False)
        with pytest.raises(UsageError, match=f"another process \\(pid {holder.pid}\\) is writing this run"):
            replay(request, golden_header(golden))
        assert list_ranks(out) == []
    finally:
        holder.communicate("")


def test_a_launched_rank_gets_the_parsed_request_back_and_returns_its_summary(run_factory, tmp_path: Path) -> None:
    profile = tmp_path / "one-site.toml"
    profile.write_text(ONE_FLIP, encoding="utf-8")
    golden = run_factory("golden", "run.steps=4", "run.checkpoint_every=3")
    twin = run_factory("twin", "run.steps=4", "run.checkpoint_every=3")
    header = golden_header(golden)
    for suspect in (suspect_from_profile(str(profile), fault_seed=3), suspect_from_run(twin, header, golden)):
        request = ReplayRequest(golden, tmp_path / "r", parse_steps("3"), suspect, mode="param-sync", progress=False)
        assert ReplayRequest.from_json(request.to_json()) == request  # the profile, parsed again from its header form
    summary = ReplaySummary.from_json(replay_rank(request.to_json()))
    assert summary.out == request.out and [r.step for r in summary.steps] == [3] and summary.checked > 0


def test_a_wrong_nproc_is_refused_in_one_line_naming_the_golden_runs_ranks(
    run_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = run_factory("golden", "run.steps=3", "run.checkpoint_every=2")
    assert golden_header(golden, 1).world_size == 1
    out = tmp_path / "replay"
    code = main(
        [
            "replay",
            "--golden",
            str(golden),
            "--fault-profile",
            "healthy-node",
            "--steps",
            "2",
            "--out",
            str(out),
            "--nproc",
            "2",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and not out.exists() and len(err.strip().splitlines()) == 1
    assert (
        f"--nproc 2: {golden} was recorded on 1 rank(s), and a replay runs each of them with its own shard, "
        "checkpoints and log: give --nproc 1, or leave --nproc out"
    ) in err


@pytest.mark.slow  # launches 2 ranks (the fast lane launches none: Makefile)
def test_a_2_rank_replay_refusal_is_one_line(tmp_path: Path, capfd, monkeypatch) -> None:
    # Rank 1's checkpoint changed together with its manifest: rank 1 refuses it. The ranks' processes write to the
    # same stderr as this one (capfd): one error that names rank 1 once, a warning every rank gives (no digest kernel
    # built where they look) once on one line, no traceback.
    from jobs.record import RecordRequest, record
    from tests.support import small_config
    from tests.tracer.checkpoint_tamper import tamper_both
    from tracer.kernel import DIR_ENV

    golden = tmp_path / "golden"
    record(small_config("parallel.dp=2"), RecordRequest(out=golden, node_label="golden", progress=False), nproc=2)
    tamper_both(golden, 2, rank=1)
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "no-kernels"))
    capfd.readouterr()
    argv = ["replay", "--golden", str(golden), "--suspect", str(golden), "--steps", "2", "--nproc", "2", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "replay")]) == 1
    lines = capfd.readouterr().err.splitlines()
    errors = [line for line in lines if not line.startswith("sdc: warning: ")]
    assert len(errors) == 1 and errors[0].startswith("sdc: error: rank 1: "), lines
    assert errors[0].count("rank 1") == 1 and "changed after it was written" in errors[0]
    assert len(set(lines)) == len(lines) and len(lines) > 1  # the kernel's warning, given by every rank, once
