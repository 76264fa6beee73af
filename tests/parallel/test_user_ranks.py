"""A user's sharded (FSDP2) workload on 2 gloo ranks through the CLI (examples/torchrun_fsdp2.py's factory
``build``, without torchrun): verified bit-identical, recorded with sharded checkpoints, replayed on both ranks in
lockstep and parameter sync.

Launches: verify-determinism, two records, two replays and one of `full_gradients`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from jobs.launch import launch
from sdc.cli import main
from tests.parallel.test_fsdp2 import RANK1_FAULT, lockstep_hits
from tests.parallel.test_ranks import rank_events
from tracer.checkpoint import list_step_checkpoints
from tracer.checkpoint.dcp_manifest import parse_manifest
from tracer.checkpoint.interface import manifest_name, sharded_checkpoint_dir
from tracer.checkpoint.logged_parameters import logged_parameters
from tracer.log import LogReader, rank_dir

pytestmark = pytest.mark.slow  # ranks are processes

WORKLOAD = ["--workload", "examples.torchrun_fsdp2:build"]
RECORD = [*WORKLOAD, "--nproc", "2", "--checkpoint-every", "2", "--quiet"]


def record(out: Path, *args: str) -> Path:
    assert main(["record", "--out", str(out), "--node-label", out.name, *RECORD, *args]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("user-ranks")
    profile = root / "rank1.toml"
    profile.write_text(RANK1_FAULT)
    return SimpleNamespace(
        root=root,
        profile=profile,
        golden=record(root / "golden"),
        suspect=record(root / "suspect", "--fault-profile", str(profile)),
    )


def test_verify_determinism_of_an_fsdp2_workload_on_2_ranks(capsys: pytest.CaptureFixture) -> None:
    assert main(["verify-determinism", *WORKLOAD, "--nproc", "2", "--steps", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bit-identical:") and "on 2 ranks" in out


def test_record_writes_sharded_checkpoints(runs: SimpleNamespace) -> None:
    for rank in (0, 1):
        assert list_step_checkpoints(runs.golden, rank) == [0, 2, 4, 6]
        assert (sharded_checkpoint_dir(runs.golden, 4) / manifest_name(rank)).is_file()
        header = LogReader(rank_dir(runs.golden, rank)).header
        assert (header.world_size, header.extra["parallel"]["dp"], len(header.extra["shards"])) == (2, 2, 27)


def test_every_sharded_checkpoint_holds_the_parameter_shards_each_rank_logged_before_its_step(
    runs: SimpleNamespace,
) -> None:
    for rank in (0, 1):
        for step in (2, 4, 6):
            path = sharded_checkpoint_dir(runs.golden, step) / manifest_name(rank)
            shards = {
                k.removeprefix("model/"): int(v.fingerprint, 16)
                for k, v in parse_manifest(path.read_bytes(), str(path)).shards.items()
                if k.startswith("model/")
            }
            logged = logged_parameters(runs.golden, rank, step)
            assert logged is not None and logged.log_step == step - 1 and len(shards) > 20, (rank, step)
            assert shards == {n: logged.fingerprints[n] for n in shards}, (rank, step)


def test_lockstep_replay_finds_the_fault_on_rank_1_in_block_1s_mlp_forward(runs: SimpleNamespace) -> None:
    hits = lockstep_hits(runs.golden, runs.suspect, WORKLOAD[1], runs.root / "lockstep")
    # The site only: its backward reads the activations its own faulty forward saved, so it mismatches too.
    assert hits == {1: {(3, "blocks.1.mlp", "forward"), (3, "blocks.1.mlp", "backward")}, 0: set()}, hits


def param_sync_noise(golden: Path, suspect: Path, profile: Path, workload: str, out: Path) -> tuple[float, list]:
    """``sdc replay --mode param-sync`` of step 3 (from the checkpoint at 2) on both ranks: numpy's noise-to-signal
    on the full gradients gathered from the shards, and each rank's total ``grad_noise`` ratios."""
    assert (
        main(
            [
                "replay",
                "--golden",
                str(golden),
                "--suspect",
                str(suspect),
                "--workload",
                workload,
                "--nproc",
                "2",
                "--steps",
                "3:4",
                "--mode",
                "param-sync",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    grads = launch(
        "tests.parallel.user_ranks:full_gradients",
        {"run": str(golden), "profile": str(profile), "step": 3, "checkpoint": 2, "workload": workload},
        2,
    )[0]
    golden_grads = np.concatenate([np.array(g) for g, _ in grads.values()])
    suspect_grads = np.concatenate([np.array(s) for _, s in grads.values()])
    expected = float(np.linalg.norm(suspect_grads - golden_grads) / np.linalg.norm(golden_grads))
    return expected, [
        [e.fields["ratio"] for e in rank_events(out, rank, "grad_noise") if e.fields["name"] == "*"] for rank in (0, 1)
    ]


def test_param_sync_noise_is_that_of_the_full_gradients(runs: SimpleNamespace) -> None:
    expected, totals = param_sync_noise(runs.golden, runs.suspect, runs.profile, WORKLOAD[1], runs.root / "param-sync")
    assert expected > 0
    assert totals == [pytest.approx([expected], rel=1e-6)] * 2
