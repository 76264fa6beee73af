"""Trace a sharded (FSDP2, ``fully_shard``) job under torchrun: every rank fingerprints its own shards.

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_fsdp2.py --out runs/fsdp2
    sdc inspect runs/fsdp2
    python -m torch.distributed.run --standalone --nproc-per-node 4 examples/torchrun_fsdp2.py --out runs/hsdp \
        --replicate 2                                   # HSDP: 2 replicas x 2 shards

To play an emulated unhealthy node, pass a fault profile (a rule's ``ranks`` picks the faulty rank)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_fsdp2.py --out runs/fsdp2-sick \
        --fault-profile my-rank1-fault.toml
    sdc diff --golden runs/fsdp2 --suspect runs/fsdp2-sick --db fsdp2.duckdb && sdc query summary --db fsdp2.duckdb

A small transformer (embedding, two blocks of attention and an ``mlp``, a head) with ``fully_shard`` on each
block and on the root, AdamW and ``clip_grad_norm_`` on the DTensor gradients, on gloo. Parameters and
gradients are DTensors: the Tracer fingerprints each rank's local shard (no all-gather) and records in the
header which slice of which parameter each rank holds (``extra["shards"]``, docs/log-format.md). Site names are
the model's own (``blocks.1.mlp``). Run it twice and compare with ``tracer.compare.compare_runs`` or
``sdc diff``: the logs are bit-identical on every rank.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

from faults.node import emulated_node, node_header
from faults.profile import load_profile
from tracer.determinism import configure_determinism
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer

SETTINGS = {"seed": 0, "threads": 1}


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        y = torch.softmax(q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads=2)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int, width: int, blocks: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def job_arguments(description: str | None) -> argparse.ArgumentParser:
    """The options this example and examples/torchrun_tp.py share."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (one rank-NNNNN log per rank)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--fault-profile", help="play an emulated unhealthy node: a shipped profile's name or a TOML file")
    p.add_argument("--fault-seed", type=int, default=0)
    return p


def traced_training(
    model: nn.Module, args: argparse.Namespace, *, example: str, data_seed: int, sites: str | None = None,
    clip: bool = True,
) -> None:
    """Train ``model`` with AdamW for ``args.steps`` steps of next-token prediction on random tokens drawn from
    ``data_seed``, clipping the gradient norm to 1 if ``clip``, with a Tracer around it (and an emulated node's
    faults)."""
    rank = dist.get_rank()
    profile = load_profile(args.fault_profile) if args.fault_profile else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(data_seed)
    config = {"example": example, "width": args.width, "vocab": args.vocab, **SETTINGS}
    run = RunInfo(f"example-rank{rank}", config=config, extra=node_header(profile, args.fault_seed, False))
    tracer = Tracer(model, optimizer, out=args.out, run=run, options=TraceOptions(sites=sites))
    with tracer, emulated_node(tracer, model, fault_profile=profile, fault_seed=args.fault_seed):
        for step in range(args.steps):
            with tracer.step(step):
                tokens = torch.randint(args.vocab, (4, 9), generator=data)  # (B, T+1)
                tracer.microbatch(0, inputs=tokens)
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
                loss.backward()  # FSDP2 reduce-scatters each block's gradients: every rank keeps its shard
                tracer.loss(loss)
                if clip:
                    tracer.gradient_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))  # on DTensors
                optimizer.step()
                optimizer.zero_grad()


def main() -> None:
    p = job_arguments(__doc__)
    p.add_argument("--shard-dim", type=int, choices=(0, 1), default=0,
                   help="the dimension of each matrix fully_shard splits (another layout: another run's bits)")
    p.add_argument("--replicate", type=int, default=1, metavar="R",
                   help="HSDP: R replicas of a model sharded over world size / R ranks each (a 2-D device mesh)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    try:
        configure_determinism(**SETTINGS)  # same init on every rank; bits depend on the thread count
        model = Transformer(args.vocab, args.width, blocks=2)
        placement = {"shard_placement_fn": lambda p: Shard(args.shard_dim if p.ndim > 1 else 0)}
        if args.replicate > 1:  # HSDP: shard within a replica, all-reduce gradients across the replicas
            world = dist.get_world_size()
            placement["mesh"] = init_device_mesh("cpu", (args.replicate, world // args.replicate),
                                                 mesh_dim_names=("replicate", "shard"))
        for block in model.blocks:
            fully_shard(block, **placement)
        fully_shard(model, **placement)
        # Each rank its own shard of the data.
        traced_training(model, args, example="torchrun_fsdp2", data_seed=1000 + dist.get_rank())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
