"""A step's checkpoint, plain or sharded: the one place that decides which, for saving and for restoring.

    save_step_checkpoint(run_dir, step, rank, model, optimizer, data={"step": step}, states=w.states())
    restore_step_checkpoint(run_dir, step, rank, model, optimizer, states=w.states())   # data cursor: the caller's
    list_step_checkpoints(run_dir, rank)                                                 # steps either kind has

A model with DTensor parameters (FSDP2's ``fully_shard``, DTensor tensor parallelism) is saved as a sharded
checkpoint through ``torch.distributed.checkpoint`` (`tracer.checkpoint.sharded`: each rank its own shards, a
collective every rank calls), any other as the plain per-rank one (`tracer.checkpoint.plain`). A restore loads what
the step has on disk: the sharded one where its folder exists (every rank sees the same folder, so every rank
takes the same branch of the collective), else the plain one. The `Tracer`, a resumed recording
(`jobs.record`) and the `Replayer` all go through here.

`tracer.checkpoint.sharded` is imported when a sharded checkpoint is saved or restored, not with this module:
``torch.distributed.checkpoint`` takes 0.8 s to import, which every traced process would pay.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tracer.checkpoint.dcp_manifest import list_sharded_checkpoints
from tracer.checkpoint.interface import Stateful, sharded_checkpoint_dir
from tracer.checkpoint.plain import list_checkpoints, load_checkpoint, save_checkpoint
from tracer.sharding import dtensor_type


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` has DTensor parameters, whose state only a sharded checkpoint saves."""
    cls = dtensor_type()
    return cls is not None and any(isinstance(p, cls) for p in model.parameters())


def save_step_checkpoint(
    run_dir: str | Path,
    step: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    data: Mapping[str, Any],
    states: Mapping[str, Stateful] | None = None,
) -> Path:
    """Write the state before ``step``: sharded (a collective) when the model is, else this rank's plain one."""
    if is_sharded(model):
        from tracer.checkpoint.sharded import save_sharded_checkpoint  # see the module's docstring: imported when used

        return save_sharded_checkpoint(run_dir, step, model, optimizer, data, states)
    return save_checkpoint(run_dir, step, rank, model, optimizer, dict(data), states)


def restore_step_checkpoint(
    run_dir: str | Path,
    step: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    states: Mapping[str, Stateful] | None = None,
) -> None:
    """Restore model, optimizer, the named states and RNG from the checkpoint of ``step``, of the kind it is."""
    if sharded_checkpoint_dir(run_dir, step).is_dir():
        from tracer.checkpoint.sharded import load_sharded_checkpoint  # see the module's docstring: imported when used

        load_sharded_checkpoint(run_dir, step, model, optimizer, states)
    else:
        load_checkpoint(run_dir, step, rank).restore(model, optimizer, states)


def list_step_checkpoints(run_dir: str | Path, rank: int = 0) -> list[int]:
    """Steps with a complete checkpoint of ``rank``, plain or sharded (its manifest is written last), ascending."""
    return sorted(set(list_checkpoints(run_dir, rank)) | set(list_sharded_checkpoints(run_dir, rank)))
