"""Targets the replica-agreement and multi-rank guard tests launch in every rank (``jobs.launch``): a tiny MLP
under DistributedDataParallel on gloo, traced with a guard, and the fault emulator playing a profile (a fault in
one rank's optimizer update, or in its forward)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from faults.node import emulated_node
from faults.profile import load_profile
from tracer.determinism import configure_determinism
from tracer.guard import Guard, NonFinite, ReplicaAgreement
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, Phase, TensorRecord
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer

# One rank's AdamW update at one step: one element of what each ``addcdiv_`` (one call per parameter: AdamW's
# update on the CPU) writes scaled by 1.5, in the optimizer phase. A DTensor parameter (HSDP): its local shard.
UPDATE_ON_ONE_RANK = """
[[fault]]
ops = ["addcdiv_"]
phases = ["optimizer"]
steps = [{step}]
ranks = [{rank}]
elements = 1
kind = "scale"
factor = 1.5
"""


def tiny_ddp(width: int = 8) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    configure_determinism(seed=0, threads=1)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
    ddp = DistributedDataParallel(model)
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-2)


def tiny_hsdp(width: int = 8) -> tuple[nn.Module, torch.optim.Optimizer, dist.ProcessGroup]:
    """The same MLP under HSDP: ``fully_shard`` on a (replicate, shard) mesh of 2 x (world size / 2); and the
    replicate group, whose ranks hold the same shards."""
    configure_determinism(seed=0, threads=1)
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("replicate", "shard"))
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), mesh.get_group("replicate")


def train_with_replica_check(
    out: str, steps: int, profile_path: str = "", hsdp: bool = False, checkpoint_every: int = 0
) -> dict[str, Any]:
    """Train ``steps`` steps with replica agreement on (DDP, or HSDP with the mesh's replicate group), under the
    fault emulator with the profile at ``profile_path`` if given (`UPDATE_ON_ONE_RANK`), with a checkpoint every
    ``checkpoint_every`` steps and after the last (0: none). Returns the ``replicas``, ``guard`` and ``fault``
    events this rank logged, as (step, fields)."""
    rank = dist.get_rank()
    if hsdp:
        ddp, optimizer, group = tiny_hsdp()
    else:
        (ddp, optimizer), group = tiny_ddp(), None
    data = torch.Generator().manual_seed(100 + rank)  # each replica its own data
    guard = Guard(detectors=(NonFinite(),), replicas=ReplicaAgreement(group=group))
    events: dict[str, list] = {"replicas": [], "guard": [], "fault": []}
    profile = load_profile(profile_path) if profile_path else None
    tracer = Tracer(
        ddp,
        optimizer,
        out=out,
        run=RunInfo(f"rank{rank}"),
        options=TraceOptions(activations=False),
        guard=guard,
        echo=None,
    )
    with tracer, emulated_node(tracer, ddp, fault_profile=profile, fault_seed=0):
        for step in range(steps):
            if checkpoint_every and step % checkpoint_every == 0:
                tracer.checkpoint(step)
            with tracer.step(step):
                x = torch.randn(4, 8, generator=data)
                loss = (ddp(x) - x.flip(-1)).pow(2).mean()
                loss.backward()
                tracer.loss(loss)
                optimizer.step()
                optimizer.zero_grad()
        if checkpoint_every:
            tracer.checkpoint(steps)
    for r in LogReader(rank_dir(Path(out), rank)).records():
        if isinstance(r, EventRecord) and r.kind in events:
            events[r.kind].append([r.step, r.fields])
    return events


# Rank 1 only, at one step's first run only: one element of the last layer's forward matmul stuck at infinity.
TRANSIENT_ON_RANK_1 = """
[[fault]]
ops = ["matmul"]
sites = "2"
phases = ["forward"]
steps = [{step}]
ranks = [1]
attempts = [0]
elements = 1
kind = "stuck"
value = inf
"""


def train_guarded(out: str, steps: int, profile_path: str = "") -> dict[str, Any]:
    """Train ``steps`` steps under the guard (`NonFinite`, re-running a flagged step), with the fault profile at
    ``profile_path`` if given. Returns this rank's ``guard`` events and its last parameter fingerprints."""
    rank = dist.get_rank()
    ddp, optimizer = tiny_ddp()
    data = torch.Generator().manual_seed(100 + rank)
    profile = load_profile(profile_path) if profile_path else None
    tracer = Tracer(
        ddp,
        optimizer,
        out=out,
        run=RunInfo(f"rank{rank}"),
        options=TraceOptions(sites="0|2"),
        guard=Guard(detectors=(NonFinite(),)),
        echo=None,
    )
    with tracer, emulated_node(tracer, ddp, fault_profile=profile, fault_seed=0):
        for step in range(steps):
            x = torch.randn(4, 8, generator=data)

            def forward_backward(x: torch.Tensor = x) -> None:
                optimizer.zero_grad(set_to_none=True)
                tracer.microbatch(0, inputs=x)
                loss = (ddp(x) - x.flip(-1)).pow(2).mean()
                loss.backward()
                tracer.loss(loss)

            with tracer.step(step, rerun=forward_backward):
                forward_backward()
                optimizer.step()
    records = list(LogReader(rank_dir(Path(out), rank)).records())
    last = {
        r.name: r.fingerprint
        for r in records
        if isinstance(r, TensorRecord) and r.phase == Phase.PARAM and r.step == steps - 1
    }
    guards = [[r.step, r.fields] for r in records if isinstance(r, EventRecord) and r.kind == "guard"]
    return {"guard": guards, "params": {n: str(fp) for n, fp in last.items()}}
