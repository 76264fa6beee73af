"""Sharded (DCP) checkpoints on one rank: FSDP2 on a 1-rank gloo mesh, real files, no pickle."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors import safe_open

from tests.parallel.dcp_ranks import build_fsdp2, flip_byte_of, local_fingerprints, save_then_resume, train
from tracer.checkpoint.dcp_manifest import list_sharded_checkpoints
from tracer.checkpoint.sharded import load_sharded_checkpoint, save_sharded_checkpoint
from tracer.errors import LogError
from tracer.log.layout import written_by_sdctrace

TRACER = Path(__file__).resolve().parents[2] / "tracer"


@contextlib.contextmanager
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    with one_rank_group(tmp_path):
        yield


def saved(run: Path) -> Path:
    """A 1-rank FSDP2 checkpoint of step 2 in ``run``."""
    model, optimizer, scheduler = build_fsdp2(seed=0)
    train(model, optimizer, scheduler, range(2))
    return save_sharded_checkpoint(run, 2, model, optimizer, {"step": 2}, {"scheduler": scheduler})


def test_a_resumed_fsdp2_run_is_bit_identical_to_an_uninterrupted_one(tmp_path: Path, group: None) -> None:
    result = save_then_resume(str(tmp_path / "run"), save_at=2, steps=5)
    assert result["straight"] == result["resumed"]  # losses, dropout and the scheduler's lr included
    assert result["fingerprints"] == result["resumed_fingerprints"]
    assert list_sharded_checkpoints(tmp_path / "run") == [2]


def test_only_safetensors_and_manifests_are_written_and_every_shard_is_fingerprinted(
    tmp_path: Path, group: None
) -> None:
    folder = saved(tmp_path / "run")
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["__0_0.distcp", "rank-00000.msgpack"]  # no DCP .metadata: that one is a pickle
    run = tmp_path / "run"
    assert all(written_by_sdctrace(p.relative_to(run).parts, p.is_dir()) for p in run.rglob("*"))
    with safe_open(str(folder / "__0_0.distcp"), "pt") as f:
        keys = set(f.keys())
        weight = f.get_tensor("model/0.0.weight")
    assert {"model/0.0.weight", "optim/0.0.weight/exp_avg", "rank-00000/rng/torch"} <= keys
    model, _, _ = build_fsdp2(seed=0)
    assert weight.shape == (10, 10) and weight.dtype == torch.float32
    assert set(local_fingerprints(model)) == {k.removeprefix("model/") for k in keys if k.startswith("model/")}


def test_a_damaged_shard_is_refused_naming_the_file_the_tensor_and_both_fingerprints(
    tmp_path: Path, group: None
) -> None:
    folder = saved(tmp_path / "run")
    flip_byte_of(folder / "__0_0.distcp", "optim/1.0.bias/exp_avg_sq")
    model, optimizer, scheduler = build_fsdp2(seed=1)
    with pytest.raises(LogError) as caught:
        load_sharded_checkpoint(tmp_path / "run", 2, model, optimizer, {"scheduler": scheduler})
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(
        r"__0_0\.distcp: tensor 'optim/1\.0\.bias/exp_avg_sq' has fingerprint [0-9a-f]{16}, "
        r"\S+rank-00000\.msgpack recorded [0-9a-f]{16} \(corrupted on disk",
        message,
    ), message
    found, recorded = re.findall(r"[0-9a-f]{16}", message)[:2]
    assert found != recorded


def test_a_checkpoint_of_another_layout_is_refused_in_one_line_naming_the_field(tmp_path: Path, group: None) -> None:
    saved(tmp_path / "run")
    plain, optimizer, _ = build_fsdp2(seed=1, shard=False)  # the same model, not sharded: plain tensors
    with pytest.raises(
        LogError,
        match=r"tensor 'model/0\.0\.weight' of the checkpoint of step 2: mesh saved \(1,\), "
        r"now None; placements saved \('S\(0\)',\), now None: resume on the mesh "
        r"and placements it was saved with; sdctrace does not reshard",
    ) as caught:
        load_sharded_checkpoint(tmp_path / "run", 2, plain, optimizer)
    assert "\n" not in str(caught.value)


def test_a_missing_step_says_which_steps_have_checkpoints(tmp_path: Path, group: None) -> None:
    saved(tmp_path / "run")
    model, optimizer, _ = build_fsdp2(seed=1)
    with pytest.raises(
        LogError,
        match=r"no complete sharded checkpoint for step 3, rank 0 \(sharded checkpoints "
        r"at steps \[2\]; record with a smaller checkpoint interval\)",
    ):
        load_sharded_checkpoint(tmp_path / "run", 3, model, optimizer)


def test_a_damaged_manifest_is_refused_naming_it(tmp_path: Path, group: None) -> None:
    folder = saved(tmp_path / "run")
    (folder / "rank-00000.msgpack").write_bytes(b"\x81\xa6format\xa4nope")
    model, optimizer, _ = build_fsdp2(seed=1)
    with pytest.raises(
        LogError,
        match=r"rank-00000\.msgpack: checkpoint manifest field 'format' must be "
        r"'sdctrace-dcp-1', found 'nope': the checkpoint is damaged",
    ):
        load_sharded_checkpoint(tmp_path / "run", 2, model, optimizer)


def test_a_checkpoint_without_a_process_group_restores_a_plain_model(tmp_path: Path) -> None:
    model, optimizer, scheduler = build_fsdp2(seed=0, shard=False)
    train(model, optimizer, scheduler, range(2))
    save_sharded_checkpoint(tmp_path, 2, model, optimizer, {"step": 2}, {"scheduler": scheduler})
    straight = train(model, optimizer, scheduler, range(2, 4))
    other, optimizer2, scheduler2 = build_fsdp2(seed=1, shard=False)
    restored = load_sharded_checkpoint(tmp_path, 2, other, optimizer2, {"scheduler": scheduler2})
    assert restored.data == {"step": 2} and restored.world_size == 1
    assert train(other, optimizer2, scheduler2, range(2, 4)) == straight
    assert local_fingerprints(other) == local_fingerprints(model)


def test_checkpoint_modules_never_unpickle() -> None:
    unpickling = re.compile(r"import pickle|from pickle|pickle\.|torch\.load\(|\.read_metadata\(|FileSystemReader")
    modules = sorted((TRACER / "checkpoint").glob("*.py"))
    assert {"sharded.py", "dcp_storage.py", "dcp_manifest.py", "plain.py"} <= {m.name for m in modules}
    for module in modules:
        assert not unpickling.search(module.read_text()), module.name


def test_a_checkpoint_before_the_first_step_changes_no_bit_of_training_and_resumes_from_there(
    tmp_path: Path, group: None
) -> None:
    # DCP creates a stateless optimizer's state by stepping it at lr 0 (AdamW: step 1, zero moments): a
    # checkpoint taken before the first step must leave the optimizer as it found it, and restore it so.
    model, optimizer, scheduler = build_fsdp2(seed=0)
    plain = train(model, optimizer, scheduler, range(3))
    plain_fingerprints = local_fingerprints(model)
    result = save_then_resume(str(tmp_path / "run"), save_at=0, steps=3)
    assert result["straight"] == plain and result["fingerprints"] == plain_fingerprints
    assert result["resumed"] == plain and result["resumed_fingerprints"] == plain_fingerprints
