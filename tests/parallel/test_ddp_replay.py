"""A third-party model under DDP (transformers' GPT-2, tests/parallel/ddp_gpt2.py) on 2 gloo ranks: recorded with
and without a fault on rank 1, then replayed in parameter sync against the faulty recording.

Launches: two records, one replay and one of `full_gradients`."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdc.cli import main
from tests.parallel.test_fsdp2 import rank1_fault
from tests.parallel.test_user_ranks import param_sync_noise
from tracer.log import LogReader, rank_dir

pytestmark = pytest.mark.slow  # ranks are processes

WORKLOAD = "tests.parallel.ddp_gpt2:build"


def record(out: Path, *args: str) -> Path:
    command = ["record", "--out", str(out), "--node-label", out.name, "--workload", WORKLOAD, "--nproc", "2"]
    assert main([*command, "--checkpoint-every", "2", "--quiet", *args]) == 0
    return out


def test_param_sync_replay_of_a_rank_1_fault_gives_the_noise_of_the_gathered_gradients(tmp_path: Path) -> None:
    profile = tmp_path / "rank1.toml"
    profile.write_text(rank1_fault("matmul", sites="transformer[.]h[.]1[.]mlp"))
    golden, suspect = record(tmp_path / "golden"), record(tmp_path / "suspect", "--fault-profile", str(profile))
    assert LogReader(rank_dir(golden, 1)).header.extra["wrappers"] == ["module"]  # names leave DDP's out
    expected, totals = param_sync_noise(golden, suspect, profile, WORKLOAD, tmp_path / "param-sync")
    assert expected > 0
    assert totals == [pytest.approx([expected], rel=1e-6)] * 2  # DDP all-reduced: both ranks the same noise
