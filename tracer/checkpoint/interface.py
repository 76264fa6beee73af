"""The checkpoint interface: what a checkpoint is, what a training names to be saved with it, and where it lies.

Both implementations take and give these, as ``torch.distributed.checkpoint`` keeps its planner and storage
interfaces apart from their defaults: the plain per-rank checkpoint (`tracer.checkpoint.plain`) and the sharded one
through DCP (`tracer.checkpoint.sharded`); `tracer.checkpoint.step` chooses between them.

    <run>/checkpoints/step-000010/rank-00000.msgpack          a plain checkpoint's manifest (renamed in last)
    <run>/checkpoints/step-000010/rank-00000.safetensors      ... and its tensors
    <run>/checkpoints/step-000010/dcp/rank-00000.msgpack      a sharded checkpoint's manifest of rank 0
    <run>/checkpoints/step-000010/dcp/__0_0.distcp            ... and the shards rank 0 wrote
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from tracer.checkpoint.state import set_rng_state
from tracer.errors import LogError
from tracer.log.layout import CHECKPOINT_DIR, DCP_DIR
from tracer.sites import module_path, wrappers

CHECKPOINT_GLOB = f"{CHECKPOINT_DIR}/step-*/rank-*.msgpack"  # every complete checkpoint's manifest (renamed in last)
STEP_DIR = re.compile(r"^step-(\d{6,})$")  # a step's checkpoint folder (`checkpoint_dir`)
_MANIFEST = re.compile(r"step-(\d{6,})/rank-(\d{5,})\.msgpack$")


@dataclass
class Checkpoint:
    """Everything needed to resume training at ``step``."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    rng: dict[str, Any]
    data: dict[str, Any]
    states: dict[str, Any] = field(default_factory=dict)  # name -> state_dict of another stateful object

    def restore(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        states: Mapping[str, Stateful] | None = None,
    ) -> None:
        """Load model, optimizer, the named objects' and RNG state (the data cursor is the caller's)."""
        # Saved under the names of the model as written (no DDP `module.`, no `_orig_mod.`): put back its own.
        top = wrappers(model)
        own = {module_path(k, top): k for k in model.state_dict()}
        model.load_state_dict({own.get(k, k): v for k, v in self.model.items()}, strict=True)
        if optimizer is not None and self.optimizer is not None:
            optimizer.load_state_dict(self.optimizer)
        for name, obj in (states or {}).items():
            if name not in self.states:
                raise LogError(
                    f"checkpoint of step {self.step} holds no state for {name!r} "
                    f"(it has {sorted(self.states) or 'none'}); was the run recorded with it?"
                )
            obj.load_state_dict(self.states[name])
        set_rng_state(self.rng)


class Stateful(Protocol):
    """What a training names to be saved with a checkpoint besides model and optimizer (an LR scheduler, a
    sampler): its ``state_dict`` holds tensors, numbers, strings, lists and dicts (stored without pickle)."""

    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any) -> Any: ...


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:06d}"


@dataclass(frozen=True)
class RestoredCheckpoint:
    """What `tracer.checkpoint.sharded.load_sharded_checkpoint` restored: its step, the world size that wrote it, the
    data cursor."""

    step: int
    world_size: int
    data: dict[str, Any]


def checkpoint_files(step: int, rank: int) -> tuple[str, str]:
    """(manifest, tensors) of a checkpoint, relative to its run directory, '/'-separated for any file system."""
    base = f"{CHECKPOINT_DIR}/step-{step:06d}/rank-{rank:05d}"
    return f"{base}.msgpack", f"{base}.safetensors"


def parse_checkpoint_path(path: str) -> tuple[int, int] | None:
    """(step, rank) of a checkpoint manifest path or URL; None for any other file."""
    m = _MANIFEST.search(path.replace("\\", "/"))
    return (int(m[1]), int(m[2])) if m else None


def sharded_checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(run_dir, step) / DCP_DIR


def manifest_name(rank: int) -> str:
    return f"rank-{rank:05d}.msgpack"
