"""A recording's header sizes what replay, fine-tune and verify make, so every resource it asks for is bounded by
this machine before use (issue 31, case 13: ``train.threads = 2000`` started 4,002 threads, ``data.batch_size =
10^8`` allocated until bad_alloc). Each bound exceeded is one line naming the run, the field and what the machine
has; nothing is claimed or written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobs.machine import THREADS_PER_CPU, check_resources, cpus, max_local_ranks
from sdc.cli import main
from tests.log.test_log_schema import craft_header
from tracer.errors import UsageError
from tracer.log import LogReader, rank_dir
from workload.reference_config import load_config


@pytest.fixture
def run(pretrained: Path, tmp_path: Path) -> Path:
    shutil.copytree(pretrained, tmp_path / "run")
    return tmp_path / "run"


def with_config(run: Path, section: str, key: str, value: int) -> None:
    config = LogReader(rank_dir(run, 0)).header.config
    config[section][key] = value
    craft_header(run, config=config)


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("train", "threads", 2000, "the recording asks for 2000 threads (train.threads) per rank; this machine has"),
        ("data", "batch_size", 10**8, "of memory ("),
    ],
)
def test_replay_of_a_header_asking_for_more_than_this_machine_has_is_one_line(
    run: Path, tmp_path: Path, capsys, section: str, key: str, value: int, message: str
) -> None:
    with_config(run, section, key, value)
    out = tmp_path / "replay"
    assert (
        main(
            [
                "replay",
                "--golden",
                str(run),
                "--fault-profile",
                "healthy-node",
                "--steps",
                "1",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.startswith(f"sdc: error: {run}") and err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_fine_tune_of_a_header_asking_for_more_threads_is_one_line(run: Path, tmp_path: Path, capsys) -> None:
    with_config(run, "train", "threads", 2000)
    out = tmp_path / "ft"
    assert main(["finetune", "--from", str(run), "--out", str(out), "--steps", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sdc: error: {run}") and err.count("\n") == 1 and "2000 threads" in err, err
    assert not out.exists()


def test_bounds_follow_this_machine() -> None:
    small = load_config("tiny").to_dict()
    check_resources(small, 1, "tiny")  # the shipped config runs anywhere
    with pytest.raises(UsageError, match=f"asks for {max_local_ranks() + 1} ranks; this machine has {cpus()} core"):
        check_resources(small, max_local_ranks() + 1, "tiny")
    small["train"]["threads"] = THREADS_PER_CPU * cpus()
    check_resources(small, 1, "tiny")
    small["data"]["seq_len"] = 10**9
    with pytest.raises(UsageError, match=r"data.seq_len = 1000000000 tokens, on 1 rank\(s\)\); this machine has"):
        check_resources(small, 1, "tiny")


def test_a_recording_whose_config_asks_for_more_threads_than_this_machine_has_is_one_line(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    assert main(["record", "--out", str(out), "--set", "train.threads=2000", "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sdc: error: {out}") and err.count("\n") == 1 and "2000 threads" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["record", "--out", "{tmp}/r", "--fault-seed", str(2**63)],
        ["replay", "--golden", "{tmp}/g", "--fault-profile", "healthy-node", "--fault-seed", "-1", "--out", "{tmp}/o"],
        ["finetune", "--from", "{tmp}/g", "--out", "{tmp}/o", "--shuffle-seed", str(10**20)],
        ["faults", "fleet", "--seed", str(2**64), "--out", "{tmp}/f"],
    ],
)
def test_a_seed_torch_or_numpy_cannot_take_is_refused_on_the_command_line(
    tmp_path: Path, capsys, argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"is not in 0..{2**63 - 1}" in err and not list(tmp_path.iterdir()), err
