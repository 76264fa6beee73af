"""The target `tests/sdc/test_certify_replicas.py` launches in every rank (``jobs.launch``): the tiny DDP MLP of
tests/parallel/ddp_guard.py on gloo, traced with replica agreement and checkpointed, under the fault emulator."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from faults.node import emulated_node
from faults.profile import load_profile
from tests.parallel.ddp_guard import tiny_ddp
from tracer.guard import Guard, NonFinite, ReplicaAgreement
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer


def train_with_checkpoints(out: str, steps: int, every: int, profile_path: str = "") -> dict[str, Any]:
    """``steps`` steps with replica agreement on, a checkpoint every ``every`` steps and after the last."""
    rank = dist.get_rank()
    ddp, optimizer = tiny_ddp()
    data = torch.Generator().manual_seed(100 + rank)  # each replica its own data
    profile = load_profile(profile_path) if profile_path else None
    tracer = Tracer(ddp, optimizer, out=out, run=RunInfo(f"rank{rank}"), options=TraceOptions(activations=False),
                    guard=Guard(detectors=(NonFinite(),), replicas=ReplicaAgreement()), echo=None)
    with tracer, emulated_node(tracer, ddp, fault_profile=profile, fault_seed=0):
        for step in range(steps):
            if step % every == 0:
                tracer.checkpoint(step)
            with tracer.step(step):
                x = torch.randn(4, 8, generator=data)
                loss = (ddp(x) - x.flip(-1)).pow(2).mean()
                loss.backward()
                tracer.loss(loss)
                optimizer.step()
                optimizer.zero_grad()
        tracer.checkpoint(steps)
    return {}
