"""Sharded (DTensor) parameters: the local shard a rank fingerprints, and which slice of the parameter it is.

FSDP2's ``fully_shard``, DTensor tensor parallelism (``parallelize_module``) and HSDP make parameters and
gradients DTensors, of which each rank holds a shard. The Tracer fingerprints each rank's local shard
(``to_local()``, never an all-gather) and its run header records, per sharded parameter, the device mesh,
the placements, the global shape and this rank's slice (``extra["shards"]``, docs/log-format.md)::

    local = local_shard(p.grad)                      # the tensor itself when it is no DTensor
    shards = parameter_shards(named_parameters(model))
    header_extra["shards"] = {s.name: s.header() for s in shards}
    ParameterShard.from_header("blocks.0.mlp.0.weight", header.extra["shards"]["blocks.0.mlp.0.weight"])

DTensor's module takes a second to import; while it is not loaded no DTensor can exist, so a job without
one never loads it here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tracer.fingerprint import own_bytes
from tracer.torch_internals import local_shape_and_global_offset, waited

if TYPE_CHECKING:  # read by the checker only: importing it here would load DTensor's module
    from torch.distributed.tensor import DTensor

DTENSOR = "torch.distributed.tensor"
SHARD_FIELDS = ("mesh_shape", "mesh_dims", "placements", "global_shape", "offsets", "local_shape")


def dtensor_type() -> type[DTensor] | None:
    """torch's ``DTensor`` class, or None while its module is not loaded (no DTensor exists then)."""
    return getattr(sys.modules.get(DTENSOR), "DTensor", None)


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's local shard of ``t`` if it is a DTensor (no communication), the result of a DTensor
    collective once it is done, else ``t`` itself: the plain tensor a fingerprint reads."""
    if own_bytes(t):  # a plain tensor, every site's on an unsharded model: one attribute lookup
        return t
    cls = dtensor_type()
    if cls is None or not isinstance(t, cls):
        return waited(t)
    with torch.no_grad():
        return waited(t.to_local())


def as_shard_of(t: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` in the place of ``t``'s local shard: a DTensor on ``t``'s mesh with its placements and global
    shape if ``t`` is a DTensor (what a site hook returns for the `local_shard` it was given), else ``local``."""
    cls = dtensor_type()
    if cls is None or not isinstance(t, cls):
        return local
    return cls.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())


def local_shards(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """`local_shard` of every tensor of ``named`` (the list itself when none is a DTensor)."""
    cls = dtensor_type()
    if cls is None or not any([isinstance(t, cls) for _, t in named]):  # one call, not one a tensor
        return named
    return [(name, local_shard(t)) for name, t in named]


def placement_name(placement: Any) -> str:
    """``Shard(0)``, ``Replicate()``, ``Partial(sum)``: a placement as headers and messages write it."""
    return repr(placement).replace("dim=", "")


@dataclass(frozen=True)
class ParameterShard:
    """Which slice of parameter ``name`` one rank holds: ``local_shape`` elements from ``offsets`` of a tensor of
    ``global_shape``, laid out by ``placements`` (one per mesh dimension) over a mesh of ``mesh_shape``."""

    name: str
    mesh_shape: tuple[int, ...]
    mesh_dims: tuple[str, ...]  # the mesh's dimension names; empty where the mesh has none
    placements: tuple[str, ...]
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    local_shape: tuple[int, ...]

    def header(self) -> dict[str, list[Any]]:
        """What the run header records under ``extra["shards"][name]``."""
        return {field: list(getattr(self, field)) for field in SHARD_FIELDS}

    @classmethod
    def from_header(cls, name: str, fields: Mapping[str, Any]) -> ParameterShard:
        return cls(name, *(tuple(fields.get(field) or ()) for field in SHARD_FIELDS))

    def slice(self) -> str:
        """The slice as indexing writes it: ``[0:64, 0:32]``."""
        return "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(self.offsets, self.local_shape)) + "]"


def parameter_shard(name: str, t: torch.Tensor) -> ParameterShard | None:
    """The slice of ``t`` this rank holds, or None if ``t`` is no DTensor."""
    cls = dtensor_type()
    if cls is None or not isinstance(t, cls):
        return None
    mesh, placements, shape = t.device_mesh, tuple(t.placements), tuple(t.shape)
    local_shape, offsets = local_shape_and_global_offset(shape, mesh, placements)
    return ParameterShard(
        name=name,
        mesh_shape=tuple(mesh.shape),
        mesh_dims=tuple(mesh.mesh_dim_names or ()),
        placements=tuple(placement_name(p) for p in placements),
        global_shape=shape,
        offsets=offsets,
        local_shape=local_shape,
    )


def parameter_shards(named: Iterable[tuple[str, torch.Tensor]]) -> list[ParameterShard]:
    """The shard of every DTensor among ``named`` (model order)."""
    return [s for name, t in named if (s := parameter_shard(name, t)) is not None]


def shards_of(extra: Mapping[str, Any]) -> dict[str, ParameterShard]:
    """The shards a run header's ``extra`` records (none for a run without sharded parameters)."""
    return {name: ParameterShard.from_header(name, f) for name, f in (extra.get("shards") or {}).items()}
