"""`sdc` never destroys data it was not asked to: its own inputs, files it did not write, another kind of run,
a run another process is writing; and a header cannot make it start an unbounded number of processes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobs.record import record_run
from sdc.cli import main
from tests.sdc.test_cli import SMALL_ARGS
from tests.support import hold_run_dir, rewrite_header, small_config
from tracer.checkpoint import list_checkpoints
from tracer.log import LogReader, list_ranks, rank_dir
from tracer.log.records import MAX_WORLD_SIZE


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a refused command printed."""
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("sdc: error: "), lines
    return lines[0]


def _recording(run: Path) -> bool:
    """``run`` still holds the recording it held: every rank's log and its checkpoints."""
    return list_ranks(run) == [0] and LogReader(rank_dir(run, 0)).header.role == "train" and bool(list_checkpoints(run))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two small recordings that pair, ``golden`` and ``suspect``, recorded once; tests get copies (`runs`)."""
    root = tmp_path_factory.mktemp("recorded")
    for name in ("golden", "suspect"):
        record_run(small_config(), root / name, node_label=name, progress=False)
    return {name: root / name for name in ("golden", "suspect")}


@pytest.fixture
def runs(recorded: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """This test's own copies of `recorded`: a command that wrongly wrote into one cannot reach another test."""
    return {name: shutil.copytree(run, tmp_path / name) for name, run in recorded.items()}


@pytest.mark.parametrize("side", ["golden", "suspect"])
def test_replay_never_writes_over_its_own_input(
    runs: dict[str, Path], side: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "replay",
        "--golden",
        str(runs["golden"]),
        "--suspect",
        str(runs["suspect"]),
        "--steps",
        "1",
        "--out",
        str(runs[side]),
        "--overwrite",
        "--quiet",
    ]
    assert main(args) == 1
    assert f"is the input run {runs[side]}" in _error(capsys) and _recording(runs[side])


def test_finetune_never_writes_over_the_run_it_starts_from(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    golden = runs["golden"]
    args = [
        "finetune",
        "--from",
        str(golden),
        "--out",
        str(golden),
        "--overwrite",
        "--steps",
        "1",
        "--tasks",
        "copy",
        "--quiet",
    ]
    assert main(args) == 1
    assert "is the input run" in _error(capsys) and _recording(golden)


def test_replay_does_not_replace_a_recording(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    golden, other = runs["golden"], runs["suspect"]
    args = [
        "replay",
        "--golden",
        str(golden),
        "--fault-profile",
        "healthy-node",
        "--steps",
        "1",
        "--out",
        str(other),
        "--overwrite",
        "--quiet",
    ]
    assert main(args) == 1
    assert "holds a recording, and this command writes a replay log" in _error(capsys) and _recording(other)


def test_overwrite_refuses_a_folder_with_files_sdctrace_did_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "thesis"
    (out / "checkpoints").mkdir(parents=True)
    (out / "thesis.tex").write_text("years of work")
    assert main(["record", "--out", str(out), "--overwrite", "--steps", "1", "--quiet", *SMALL_ARGS]) == 1
    assert "holds thesis.tex, which sdctrace did not write; nothing was deleted" in _error(capsys)
    assert (out / "thesis.tex").read_text() == "years of work" and (out / "checkpoints").is_dir()


def test_a_second_writer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    holder = hold_run_dir(out)
    try:
        assert main(["record", "--out", str(out), "--overwrite", "--steps", "1", "--quiet", *SMALL_ARGS]) == 1
        assert f"{out}: another process (pid {holder.pid}) is writing this run" in _error(capsys)
        assert list_ranks(out) == []
    finally:
        holder.communicate("")


def test_replay_refuses_a_header_that_claims_ranks_the_run_does_not_hold(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = runs["golden"]
    # The most ranks a header may claim at all (tracer.log.records); one rank folder is on disk.
    header = LogReader(rank_dir(golden, 0)).header
    parallel = {**header.extra["parallel"], "dp": MAX_WORLD_SIZE}
    rewrite_header(golden, world_size=MAX_WORLD_SIZE, extra={**header.extra, "parallel": parallel})
    args = [
        "replay",
        "--golden",
        str(golden),
        "--fault-profile",
        "healthy-node",
        "--steps",
        "1",
        "--out",
        str(tmp_path / "replay"),
        "--quiet",
    ]
    assert main(args) == 1  # before any rank is launched: the launcher would start them one by one
    assert f"holds the logs of ranks [0], but its header's world_size is {MAX_WORLD_SIZE}" in _error(capsys)
    assert not (tmp_path / "replay").exists()
