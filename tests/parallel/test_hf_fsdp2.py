"""HF LLaMA (built from its config, random init) sharded with FSDP2 on 2 gloo ranks: a model sdctrace did not
design records bit-identically, and a fault on rank 1 in layer 1's MLP is found at exactly that site."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch import launch
from tests.parallel.test_fsdp2 import rank1_fault
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase
from tracer.sharding import shards_of

pytestmark = pytest.mark.slow  # launches ranks

TARGET = "tests.parallel.hf_fsdp2_ranks:train_llama"

RANK1_MLP_AT_2 = rank1_fault("matmul", sites="model[.]layers[.]1[.]mlp", step=2)


def test_hf_llama_under_fsdp2_is_bit_identical_and_a_rank_1_fault_is_found_at_its_site(tmp_path: Path) -> None:
    profile = tmp_path / "rank1.toml"
    profile.write_text(RANK1_MLP_AT_2, encoding="utf-8")
    runs = {name: tmp_path / name for name in ("golden", "again", "sick")}
    for name, out in runs.items():
        launch(
            TARGET,
            {"out": str(out), "steps": 4, "profile_path": str(profile) if name == "sick" else ""},
            2,
            timeout_s=180,
        )
    shards = shards_of(LogReader(rank_dir(runs["golden"], 1)).header.extra)
    assert shards["model.layers.1.mlp.up_proj.weight"].slice() == "[32:64, 0:32]"  # (64, 32) rows split in two
    assert compare_runs(runs["golden"], runs["again"]).first is None
    first = compare_runs(runs["golden"], runs["sick"]).first
    assert first is not None
    assert (first.rank, first.step, first.microbatch, first.name, first.phase) == (
        1,
        2,
        0,
        "model.layers.1.mlp",
        Phase.FORWARD,
    )
