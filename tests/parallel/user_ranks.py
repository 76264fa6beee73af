"""What the multi-rank user-workload tests launch in each rank (`jobs.launch`): the full gradients of a step.

    launch("tests.parallel.user_ranks:full_gradients", {"run": str(golden), "profile": str(toml), "step": 3}, 2)
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

from examples.fsdp2_workload import build
from faults import FaultEmulator
from faults.profile import load_profile
from replay.injection import StepClock, passthrough_hooks, sync_parameters
from tracer.log import LogReader, rank_dir
from tracer.sites import find_sites
from tracer.step_checkpoint import restore_step_checkpoint
from workload.protocol import run_step

SITES = "|".join(re.escape(f"blocks.{b}.{part}") for b in (0, 1) for part in ("attention", "mlp"))


def full_gradients(run: str, profile: str, step: int, checkpoint: int) -> dict[str, Any]:
    """Rebuild ``run`` at ``checkpoint``, train up to ``step``, and gather ``step``'s gradients (all-gathered from
    the shards) of the golden run and of a suspect with the parameters synced and ``profile``'s faults."""
    rank = dist.get_rank()
    config = LogReader(rank_dir(run, rank)).header.config
    golden, suspect = build(config, torch.device("cpu")), build(config, torch.device("cpu"))
    restore_step_checkpoint(run, checkpoint, rank, golden.model, golden.optimizer, golden.states())
    for s in range(checkpoint, step):
        run_step(golden, s)
    sync_parameters(golden.model, suspect.model)
    run_step(golden, step, update=False)
    clock = StepClock(step)
    emulator = FaultEmulator(load_profile(profile), suspect.model, sink=lambda kind, fields: None, sites=SITES,
                             clock=lambda: (clock.step_index, clock.microbatch_index))
    with emulator, passthrough_hooks(find_sites(suspect.model, SITES)):
        run_step(suspect, step, clock, update=False)
    return {name: [p.grad.full_tensor().double().flatten().tolist() for p in (g, s)]
            for (name, g), (_, s) in zip(golden.model.named_parameters(), suspect.model.named_parameters())}
