"""A small FSDP2 training job for the sharded-checkpoint tests, and the targets the multi-rank ones launch.

model, optimizer, scheduler = build_fsdp2(seed=0)       # every rank, inside a process group
losses = train(model, optimizer, scheduler, range(2, 5))
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from tracer.checkpoint.sharded import load_sharded_checkpoint, save_sharded_checkpoint
from tracer.fingerprint import fingerprint

WIDTH = 10  # not a multiple of 4: FSDP2 shards some parameters unevenly on 4 ranks


def build_fsdp2(seed: int, shard: bool = True) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """Two blocks (Linear, GELU, Dropout) and a head, each block `fully_shard`-ed, then the root; AdamW; StepLR."""
    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(0.1)) for _ in range(2)]
    model = nn.Sequential(*blocks, nn.Linear(WIDTH, 3))
    if shard:
        for block in blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, WIDTH, generator=g), torch.randn(4, 3, generator=g)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, steps: range) -> list[float]:
    """Train ``steps`` (dropout draws from the global RNG, so a resumed run needs it restored); the losses."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    losses = []
    for step in steps:
        x, y = batch(step, rank)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(float(loss.detach()))
    return losses


def local_fingerprints(model: nn.Module) -> dict[str, str]:
    """This rank's shard of every parameter, fingerprinted."""
    return {
        n: f"{fingerprint((p.to_local() if hasattr(p, 'to_local') else p).detach()):016x}"
        for n, p in model.named_parameters()
    }


def save_then_resume(out: str, save_at: int, steps: int) -> dict[str, Any]:
    """An uninterrupted run that checkpoints before step ``save_at``, and one resumed there from another init."""
    model, optimizer, scheduler = build_fsdp2(seed=0)
    train(model, optimizer, scheduler, range(save_at))
    save_sharded_checkpoint(out, save_at, model, optimizer, {"step": save_at}, {"scheduler": scheduler})
    straight = train(model, optimizer, scheduler, range(save_at, steps))
    model2, optimizer2, scheduler2 = build_fsdp2(seed=1)
    restored = load_sharded_checkpoint(out, save_at, model2, optimizer2, {"scheduler": scheduler2})
    resumed = train(model2, optimizer2, scheduler2, range(restored.data["step"], steps))
    return {
        "straight": straight,
        "resumed": resumed,
        "fingerprints": local_fingerprints(model),
        "resumed_fingerprints": local_fingerprints(model2),
        "files": sorted(p.name for p in Path(out).rglob("*")),
    }


def load_only(out: str, step: int) -> int:
    """Restore the checkpoint of ``step`` into a fresh model (fails on a damaged or foreign one)."""
    model, optimizer, scheduler = build_fsdp2(seed=1)
    return load_sharded_checkpoint(out, step, model, optimizer, {"scheduler": scheduler}).step


def flip_byte_of(path: Path, tensor: str) -> None:
    """Flip one bit in the data of ``tensor`` inside a safetensors file."""
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    start = 8 + n + json.loads(raw[8 : 8 + n])[tensor]["data_offsets"][0]
    raw[start] ^= 0x01
    path.write_bytes(bytes(raw))
