"""Targets the multi-rank tests launch in every rank (``tracer.launch``); they return JSON."""

from __future__ import annotations

from typing import Any

from workload.config import Config
from workload.protocol import run_step
from workload.reference import build


def train_and_report(config: dict[str, Any], steps: int) -> dict[str, Any]:
    """Train ``steps`` steps; the losses and each parameter's squared L2 norm (of this rank's shard)."""
    w = build(Config.from_dict(config))
    losses = [run_step(w, step) for step in range(steps)]
    squares = {n: float(p.detach().double().pow(2).sum()) for n, p in w.model.named_parameters()}
    sharded = [n for n, _ in w.model.named_parameters() if w.model.shard_dim(n) is not None]
    return {"losses": losses, "squares": squares, "sharded": sharded, "coords": w.layout.coords(w.groups.rank)}


def hang_on_rank_1() -> None:
    """Rank 1 never reaches the barrier rank 0 waits in."""
    import time

    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


def claim_on_rank_0(out: str) -> str:
    """Claim ``out`` on rank 0, as the ranks of `sdc record` do."""
    from pathlib import Path

    import torch.distributed as dist

    from tracer.log import claim_out_dir

    if dist.get_rank() == 0:
        with claim_out_dir(Path(out), role="train", overwrite=False):
            pass
    return "claimed"
