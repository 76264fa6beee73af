"""The manifest each rank writes beside its shards of a sharded (DCP) checkpoint, and its one parser.

A sharded checkpoint (`tracer.checkpoint.sharded`) goes through ``torch.distributed.checkpoint``, but DCP's own
index (``.metadata``) is a pickle, so sdctrace writes none and reads none: each rank's manifest says what the
rank holds and what it wrote, and a loader builds DCP's metadata from the manifests of all ranks::

    path = sharded_checkpoint_dir(run_dir, step) / manifest_name(rank)   # where a rank's manifest lies
    manifest = parse_manifest(read_manifest(path, tensors), str(path))
    manifest.world_size, manifest.layout["model/w"].placements, manifest.shards["model/w"].fingerprint

``layout`` has every tensor of the rank's state (global shape, dtype, and for a DTensor its mesh and
placements); ``shards`` the ones this rank wrote (DCP writes a replicated tensor once), each with its file,
offsets and sizes in the global tensor and the 8-byte fingerprint (`tracer.fingerprint`) of the shard as it
was in memory. The rest (optimizer scalars and param_groups, RNG, data cursor, other states) is plain msgpack.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import torch

from tracer.checkpoint.interface import STEP_DIR, manifest_name
from tracer.checkpoint.manifest_bounds import decode_manifest
from tracer.checkpoint.state import rng_problem
from tracer.errors import LogError
from tracer.log.layout import CHECKPOINT_DIR, DCP_DIR
from tracer.log.records import MAX_DEPTH, MAX_STEP, MAX_WORLD_SIZE, nesting_depth_over

MANIFEST_FORMAT = "sdctrace-dcp-1"  # a manifest names its format; a later one changes the name
_HEX16 = re.compile(r"[0-9a-f]{16}")
_FILE = re.compile(r"__\d+_\d+\.distcp")


@dataclass(frozen=True)
class TensorLayout:
    """One tensor of a rank's state: global shape and dtype; mesh shape, mesh dimension names and placements
    (as ``str(placement)``: ``S(0)``, ``R``) for a DTensor, None for a plain tensor."""

    shape: tuple[int, ...]
    dtype: str
    mesh: tuple[int, ...] | None = None
    mesh_dims: tuple[str, ...] | None = None
    placements: tuple[str, ...] | None = None

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorLayout:
        dtype = str(t.dtype).removeprefix("torch.")
        mesh = getattr(t, "device_mesh", None)
        if mesh is None:
            return cls(tuple(t.shape), dtype)
        return cls(
            tuple(t.shape),
            dtype,
            tuple(mesh.shape),
            tuple(mesh.mesh_dim_names or ()) or None,
            tuple(str(p) for p in t.placements),  # type: ignore[attr-defined]  # a DTensor: it has a mesh
        )

    def differences(self, other: TensorLayout) -> list[str]:
        """Each field in which ``other`` (this run's) differs, as 'field saved X, now Y'."""
        return [
            f"{name} saved {getattr(self, name)}, now {getattr(other, name)}"
            for name in ("shape", "dtype", "mesh", "mesh_dims", "placements")
            if getattr(self, name) != getattr(other, name)
        ]


@dataclass(frozen=True)
class ShardRecord:
    """A shard a rank wrote: the DCP file holding it, its place in the global tensor, its fingerprint."""

    file: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    fingerprint: str  # 16 hex digits, as the log writes fingerprints


@dataclass(frozen=True)
class DcpManifest:
    step: int
    rank: int
    world_size: int
    layout: Mapping[str, TensorLayout]
    shards: Mapping[str, ShardRecord]
    optimizer: dict[str, Any] | None  # {"param_groups": [...], "state": {fqn: {key: plain value}}}
    rng: dict[str, Any]
    data: dict[str, Any]
    states: dict[str, Any]

    def encode(self) -> bytes:
        return msgpack.packb(
            {
                "format": MANIFEST_FORMAT,
                "step": self.step,
                "rank": self.rank,
                "world_size": self.world_size,
                "layout": {
                    k: [list(v.shape), v.dtype, _list(v.mesh), _list(v.mesh_dims), _list(v.placements)]
                    for k, v in self.layout.items()
                },
                "shards": {k: [v.file, list(v.offsets), list(v.sizes), v.fingerprint] for k, v in self.shards.items()},
                "optimizer": self.optimizer,
                "rng": self.rng,
                "data": self.data,
                "states": self.states,
            },
            use_bin_type=True,
        )


def list_sharded_checkpoints(run_dir: str | Path, rank: int = 0) -> list[int]:
    """Steps whose sharded checkpoint has ``rank``'s manifest (written last: the rank's part is complete),
    ascending."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(
        int(m[1])
        for d in root.iterdir()
        if (m := STEP_DIR.match(d.name)) and (d / DCP_DIR / manifest_name(rank)).is_file()
    )


def parse_manifest(raw: bytes, source: str) -> DcpManifest:
    """Decode and check a manifest; anything out of shape is one `LogError` naming ``source`` and the field."""
    m = decode_manifest(raw, source)
    try:
        return _parse(m)
    except (KeyError, TypeError, ValueError) as exc:
        raise LogError(
            f"{source}: checkpoint manifest field {exc.args[0] if exc.args else exc}: "
            "the checkpoint is damaged; record it again"
        ) from None


def _parse(m: Any) -> DcpManifest:
    if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT:
        raise ValueError(
            f"'format' must be {MANIFEST_FORMAT!r}, found {m.get('format') if isinstance(m, dict) else m!r:.60}"
        )
    step, rank, world = m["step"], m["rank"], m["world_size"]
    if not (type(step) is int and 0 <= step <= MAX_STEP):
        raise ValueError(f"'step' must be an int in 0..{MAX_STEP}, found {step!r:.60}")
    if not (type(world) is int and 1 <= world <= MAX_WORLD_SIZE and type(rank) is int and 0 <= rank < world):
        raise ValueError(
            f"'rank' and 'world_size' must be ints, 0 <= rank < world_size <= {MAX_WORLD_SIZE}, "
            f"found {rank!r:.20} and {world!r:.20}"
        )
    layout = {_key(k): _layout(k, v) for k, v in _map(m, "layout").items()}
    shards = {_key(k): _shard(k, v) for k, v in _map(m, "shards").items()}
    for name in ("data", "states"):
        if nesting_depth_over(_map(m, name)):
            raise ValueError(f"{name!r} must be nested at most {MAX_DEPTH} deep")
    problem = rng_problem(m["rng"])
    if problem:
        raise ValueError(problem)
    opt = m["optimizer"]
    if opt is not None and not (
        isinstance(opt, dict)
        and isinstance(opt.get("param_groups"), list)
        and isinstance(opt.get("state"), dict)
        and not nesting_depth_over(opt)
    ):
        raise ValueError(f"'optimizer' must be nil or {{param_groups: list, state: map}}, found {opt!r:.60}")
    return DcpManifest(step, rank, world, layout, shards, opt, m["rng"], m["data"], m["states"])


def _map(m: dict[str, Any], name: str) -> dict[Any, Any]:
    if not isinstance(m[name], dict):
        raise ValueError(f"{name!r} must be a map, found {type(m[name]).__name__}")
    return m[name]


def _key(k: Any) -> str:
    if not (isinstance(k, str) and 0 < len(k) <= 1024):
        raise ValueError(f"tensor names must be strings, found {k!r:.60}")
    return k


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not (isinstance(v, list) and len(v) <= 64 and all(type(x) is int and 0 <= x < 1 << 62 for x in v)):
        raise ValueError(f"{what} must be a list of sizes, found {v!r:.60}")
    return tuple(v)


def _strs(v: Any, what: str) -> tuple[str, ...] | None:
    if v is None:
        return None
    if not (isinstance(v, list) and len(v) <= 64 and all(isinstance(x, str) for x in v)):
        raise ValueError(f"{what} must be nil or a list of strings, found {v!r:.60}")
    return tuple(v)


def _layout(k: str, v: Any) -> TensorLayout:
    if not (
        isinstance(v, list)
        and len(v) == 5
        and isinstance(v[1], str)
        and isinstance(getattr(torch, v[1], None), torch.dtype)
    ):
        raise ValueError(f"'layout.{k:.80}' must be [shape, dtype, mesh, mesh_dims, placements], found {v!r:.60}")
    mesh = None if v[2] is None else _ints(v[2], f"'layout.{k:.80}' mesh")
    return TensorLayout(
        _ints(v[0], f"'layout.{k:.80}' shape"),
        v[1],
        mesh,
        _strs(v[3], f"'layout.{k:.80}' mesh_dims"),
        _strs(v[4], f"'layout.{k:.80}' placements"),
    )


def _shard(k: str, v: Any) -> ShardRecord:
    if not (
        isinstance(v, list)
        and len(v) == 4
        and isinstance(v[0], str)
        and _FILE.fullmatch(v[0])
        and isinstance(v[3], str)
        and _HEX16.fullmatch(v[3])
    ):
        raise ValueError(f"'shards.{k:.80}' must be [__R_N.distcp, offsets, sizes, 16 hex digits], found {v!r:.60}")
    offsets, sizes = _ints(v[1], f"'shards.{k:.80}' offsets"), _ints(v[2], f"'shards.{k:.80}' sizes")
    if len(offsets) != len(sizes):
        raise ValueError(f"'shards.{k:.80}' offsets and sizes must have one entry per dimension")
    return ShardRecord(v[0], offsets, sizes, v[3])


def _list(v: tuple[Any, ...] | None) -> list[Any] | None:
    return None if v is None else list(v)
