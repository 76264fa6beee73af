"""What the multi-rank user-workload tests launch in each rank (`jobs.launch`): the full gradients of a step.

launch("tests.parallel.user_ranks:full_gradients", {"run": str(golden), "profile": str(toml), "step": 3,
       "checkpoint": 2, "workload": "examples.torchrun_fsdp2:build"}, 2)
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

from faults import FaultEmulator
from faults.profile import load_profile
from replay.injection import StepClock, passthrough_hooks, sync_parameters
from tracer.checkpoint import restore_step_checkpoint
from tracer.log import LogReader, rank_dir
from tracer.sharding import dtensor_type
from tracer.sites import sites_named
from workload.protocol import build_workload, run_step


def full_gradients(run: str, profile: str, step: int, checkpoint: int, workload: str) -> dict[str, Any]:
    """Rebuild ``run`` with the factory ``workload`` at ``checkpoint``, train up to ``step``, and gather ``step``'s
    gradients (all-gathered from the shards) of the golden run and of a suspect with the parameters synced and
    ``profile``'s faults, traced at the run's sites."""
    rank = dist.get_rank()
    header = LogReader(rank_dir(run, rank)).header
    sites = tuple({re.sub(r"\[.*\]$", "", s): None for s in header.extra["sites"]})
    golden, suspect = (build_workload(workload, header.config, torch.device("cpu")) for _ in range(2))
    restore_step_checkpoint(run, checkpoint, rank, golden.model, golden.optimizer, golden.states())
    for s in range(checkpoint, step):
        run_step(golden, s)
    sync_parameters(golden.model, suspect.model)
    run_step(golden, step, update=False)
    clock = StepClock(step)
    emulator = FaultEmulator(
        load_profile(profile),
        suspect.model,
        sink=lambda kind, fields: None,
        sites=sites,
        clock=lambda: (clock.step_index, clock.microbatch_index),
    )
    with emulator, passthrough_hooks(sites_named(suspect.model, sites)):
        run_step(suspect, step, clock, update=False)
    return {
        name: [whole(p.grad).double().flatten().tolist() for p in (g, s)]
        for (name, g), (_, s) in zip(golden.model.named_parameters(), suspect.model.named_parameters())
    }


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor's gathered from every rank's shard, a plain one (the same on every rank) as
    it is."""
    return t.full_tensor() if isinstance(t, dtensor_type() or ()) else t
