"""Sharded (DCP) checkpoints of a 2-rank FSDP2 job: resumed bit for bit, a damaged shard and another world size
refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch import launch
from tests.parallel.dcp_ranks import build_fsdp2, flip_byte_of
from tracer.checkpoint.dcp_manifest import parse_manifest
from tracer.checkpoint.interface import sharded_checkpoint_dir
from tracer.checkpoint.sharded import load_sharded_checkpoint
from tracer.errors import LogError

pytestmark = pytest.mark.slow  # ranks are processes


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("dcp") / "run"
    return out, launch(
        "tests.parallel.dcp_ranks:save_then_resume", {"out": str(out), "save_at": 2, "steps": 5}, nproc=2
    )


def test_two_ranks_resume_an_fsdp2_run_bit_for_bit(run: tuple[Path, list[dict]]) -> None:
    out, results = run
    for rank, result in enumerate(results):
        assert result["straight"] == result["resumed"], rank
        assert result["fingerprints"] == result["resumed_fingerprints"], rank
    assert results[0]["fingerprints"] != results[1]["fingerprints"]  # each rank holds its own shard
    folder = sharded_checkpoint_dir(out, 2)
    assert sorted(p.name for p in folder.iterdir()) == [
        "__0_0.distcp",
        "__1_0.distcp",
        "rank-00000.msgpack",
        "rank-00001.msgpack",
    ]
    manifests = [parse_manifest((folder / f"rank-0000{r}.msgpack").read_bytes(), "m") for r in (0, 1)]
    assert [m.world_size for m in manifests] == [2, 2]
    w0, w1 = (m.shards["model/0.0.weight"] for m in manifests)
    assert (w0.file, w0.offsets, w0.sizes) == ("__0_0.distcp", (0, 0), (5, 10))
    assert (w1.file, w1.offsets, w1.sizes) == ("__1_0.distcp", (5, 0), (5, 10))
    layout = manifests[1].layout["model/0.0.weight"]
    assert (layout.shape, layout.mesh, layout.placements) == ((10, 10), (2,), ("S(0)",))


def test_a_checkpoint_of_two_ranks_is_refused_on_one_naming_the_fix(run: tuple[Path, list[dict]]) -> None:
    out, _ = run
    model, optimizer, _ = build_fsdp2(seed=1, shard=False)
    with pytest.raises(
        LogError,
        match=r"the checkpoint of step 2 was written by 2 ranks, this run has 1: resume it "
        r"with 2 ranks \(--nproc 2\); sdctrace does not reshard checkpoints$",
    ):
        load_sharded_checkpoint(out, 2, model, optimizer)


def test_a_damaged_shard_of_rank_1_is_refused_on_every_rank(run: tuple[Path, list[dict]], tmp_path: Path) -> None:
    out, _ = run
    damaged = tmp_path / "run"
    folder = sharded_checkpoint_dir(damaged, 2)
    folder.mkdir(parents=True)
    for p in sharded_checkpoint_dir(out, 2).iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    flip_byte_of(folder / "__1_0.distcp", "model/1.0.weight")
    with pytest.raises(
        LogError,
        match=r"rank \d: \S+__1_0\.distcp: tensor 'model/1\.0\.weight' has fingerprint "
        r"[0-9a-f]{16}, \S+rank-00001\.msgpack recorded [0-9a-f]{16} \(corrupted",
    ):
        launch("tests.parallel.dcp_ranks:load_only", {"out": str(damaged), "step": 2}, nproc=2)
