"""Noise-to-signal of a sharded run's gradients, over the whole parameters: every rank's shards summed.

    noises = gradient_noise(local_suspect, local_golden)           # this rank's shards (replay.metrics)
    noises = whole_model_noise(noises, header.extra, header.world_size)  # a collective: every rank calls it

A rank of an FSDP2 or DTensor run holds only a shard of each gradient, so its own norms are those of its slice.
The squared norms of every rank's slices add up to the whole parameter's (``||g||^2 = sum of the shards'``):
an all-reduce of them gives every rank the noise a single process would compute on the gathered gradients.
An element several ranks hold (a ``Replicate()`` mesh dimension, or a plain parameter beside the sharded ones)
counts once: its squares are divided by the number of ranks that hold it.

A pipeline stage holds its own parameters whole and no other rank holds them: its per-parameter noise is already
the whole parameter's, and only the total is summed over the stages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from replay.metrics import TOTAL, Noise
from tracer.parallel import pipeline_of
from tracer.sharding import ParameterShard, shards_of


def whole_model_noise(noises: list[Noise], extra: dict[str, Any], world_size: int) -> list[Noise]:
    """This rank's ``noises`` as the whole model's, by the run header's ``extra``: over whole parameters for a
    sharded run (`whole_parameter_noise`), the total over every stage for a pipeline (`whole_pipeline_noise`),
    unchanged otherwise. A collective on a sharded or pipeline run: every rank calls it."""
    if shards := shards_of(extra):
        return whole_parameter_noise(noises, shards, world_size)
    if pipeline_of(extra) is not None:
        return whole_pipeline_noise(noises)
    return noises


def holders(shard: ParameterShard | None, world_size: int) -> int:
    """How many ranks hold each element of a parameter: all of them for a plain one; for a DTensor, those of
    its replicated mesh dimensions (and of the ranks outside its mesh, which hold copies of it)."""
    if shard is None:
        return world_size
    mesh = math.prod(shard.mesh_shape)
    replicated = math.prod(n for n, p in zip(shard.mesh_shape, shard.placements) if "Shard" not in p)
    return max(world_size // mesh, 1) * replicated


def whole_parameter_noise(noises: list[Noise], shards: Mapping[str, ParameterShard], world_size: int) -> list[Noise]:
    """The per-parameter and total noise of whole parameters from this rank's ``noises`` of its shards."""
    per_param = [n for n in noises if n.name != TOTAL]
    squares = torch.tensor(
        [
            [
                n.diff_l2**2 / holders(shards.get(n.name), world_size),
                n.golden_l2**2 / holders(shards.get(n.name), world_size),
            ]
            for n in per_param
        ],
        dtype=torch.float64,
    ).reshape(-1, 2)
    if dist.is_initialized():
        dist.all_reduce(squares)
    out = [Noise(n.name, math.sqrt(d), math.sqrt(g)) for n, (d, g) in zip(per_param, squares.tolist())]
    diff_sq, gold_sq = squares.sum(dim=0).tolist()
    return [*out, Noise(TOTAL, math.sqrt(diff_sq), math.sqrt(gold_sq))]


def whole_pipeline_noise(noises: list[Noise]) -> list[Noise]:
    """This stage's per-parameter ``noises`` and the whole model's total: every stage's squares summed (a
    collective: every stage calls it)."""
    per_param = [n for n in noises if n.name != TOTAL]
    squares = torch.tensor(
        [sum(n.diff_l2**2 for n in per_param), sum(n.golden_l2**2 for n in per_param)], dtype=torch.float64
    )
    if dist.is_initialized():
        dist.all_reduce(squares)
    diff_sq, gold_sq = squares.tolist()
    return [*per_param, Noise(TOTAL, math.sqrt(diff_sq), math.sqrt(gold_sq))]
