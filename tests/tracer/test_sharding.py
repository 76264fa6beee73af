"""Sharded-parameter headers (tracer/sharding.py) and how pairing compares them (tracer/pairing.py); the 2-rank
FSDP2 and tensor-parallel runs that write them are tests/parallel/test_fsdp2.py and test_tp.py."""

from __future__ import annotations

import torch

from tracer.pairing import shard_differences
from tracer.sharding import ParameterShard, local_shard, local_shards, placement_name, shards_of


def shard(mesh: list[int], placements: list[str], shape: tuple[int, int] = (64, 32)) -> dict:
    """A header's record of a (64, 32) parameter split along its rows over ``mesh``."""
    return {
        "mesh_shape": mesh,
        "mesh_dims": [],
        "placements": placements,
        "global_shape": list(shape),
        "offsets": [0, 0],
        "local_shape": [shape[0] // mesh[0], shape[1]],
    }


def test_a_header_shard_reads_back_and_says_its_slice() -> None:
    extra = {"shards": {"embed.weight": {**shard([2], ["Shard(0)"]), "offsets": [32, 0]}}}
    (s,) = shards_of(extra).values()
    assert s == ParameterShard("embed.weight", (2,), (), ("Shard(0)",), (64, 32), (32, 0), (32, 32))
    assert s.slice() == "[32:64, 0:32]"
    assert ParameterShard.from_header(s.name, s.header()) == s
    assert shards_of({}) == {}


def test_pairing_names_each_differing_layout_field_once() -> None:
    names = ["embed.weight", "head.weight", "blocks.0.mlp.0.weight"]
    golden = {"shards": {n: shard([2], ["Shard(0)"]) for n in names}}
    assert shard_differences(golden, golden) == []
    other = {"shards": {n: shard([4], ["Shard(1)"]) for n in names[:2]}}
    differences = shard_differences(golden, other)
    assert differences[0] == "shards: 1 parameters sharded only in the first run (blocks.0.mlp.0.weight)"
    assert differences[1] == "shards.mesh_shape: [2] vs [4] for 2 parameters (embed.weight, head.weight)"
    assert differences[2].startswith("shards.placements: ['Shard(0)'] vs ['Shard(1)'] for 2 parameters (embed.weight,")
    assert differences[2].endswith("(record both with the same device mesh and fully_shard/parallelize_module plan)")
    assert len(differences) == 3


def test_a_plain_tensor_is_its_own_local_shard() -> None:
    t = torch.ones(3)
    assert local_shard(t) is t
    named = [("w", t)]
    assert local_shards(named) is named
    assert placement_name(type("Shard", (), {"__repr__": lambda self: "Shard(dim=1)"})()) == "Shard(1)"
