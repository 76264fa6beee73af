"""Checkpoints: the state before a step, saved so a later process resumes or replays that step bit for bit.

What a training calls::

    from tracer.checkpoint import restore_step_checkpoint, save_step_checkpoint
    save_step_checkpoint(run_dir, step, rank, model, optimizer, data={"step": step}, states={"sched": sched})
    restore_step_checkpoint(run_dir, step, rank, model, optimizer, states={"sched": sched})
    list_step_checkpoints(run_dir, rank)            # the steps with a checkpoint of either kind

The interface is apart from the implementations, as ``torch.distributed.checkpoint`` keeps its planner and storage
interfaces apart from their defaults:

- `tracer.checkpoint.interface`: the types (`Checkpoint`, `Stateful`, `RestoredCheckpoint`) and where a
  checkpoint lies (`checkpoint_dir`, ...).
- `tracer.checkpoint.step`: the one place that chooses the implementation for a step, saving and restoring.
- `tracer.checkpoint.plain`: each rank's own safetensors and msgpack files (a model without DTensor parameters).
- `tracer.checkpoint.sharded`: FSDP2 / DTensor state through ``torch.distributed.checkpoint``, with its manifest
  (`dcp_manifest`) and pickle-free storage (`dcp_storage`); imported only when a sharded checkpoint is saved or
  restored, since importing DCP takes most of a second.
- What both use: `state` (RNG and other states without pickle), `manifest_bounds` (bounded manifest reads) and
  `logged_parameters` (the log as a second witness of the model's tensors).
"""

from __future__ import annotations

from tracer.checkpoint.interface import Checkpoint, RestoredCheckpoint, Stateful, checkpoint_dir
from tracer.checkpoint.plain import list_checkpoints, load_checkpoint, save_checkpoint
from tracer.checkpoint.step import list_step_checkpoints, restore_step_checkpoint, save_step_checkpoint

__all__ = [
    "Checkpoint",
    "RestoredCheckpoint",
    "Stateful",
    "checkpoint_dir",
    "list_checkpoints",
    "list_step_checkpoints",
    "load_checkpoint",
    "restore_step_checkpoint",
    "save_checkpoint",
    "save_step_checkpoint",
]
