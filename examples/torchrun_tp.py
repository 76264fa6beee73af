"""Trace a tensor-parallel (DTensor ``parallelize_module``) job under torchrun: each rank records its shards.

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_tp.py --out runs/tp
    sdc inspect runs/tp

To play an emulated unhealthy node, pass a fault profile (a rule's ``ranks`` picks the faulty rank)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_tp.py --out runs/tp-sick \
        --fault-profile my-rank1-fault.toml
    sdc diff --golden runs/tp --suspect runs/tp-sick --db tp.duckdb && sdc query summary --db tp.duckdb

A small model (embedding, two blocks of a norm and an ``mlp``, a head) whose MLPs are split Megatron-style
over a 1-D device mesh of the 2 ranks: ``ColwiseParallel`` on ``mlp.0`` (each rank computes half the hidden
units), ``RowwiseParallel`` on ``mlp.2`` (each rank's partial sums, all-reduced). Both ranks see the same
batch. The MLP weights are DTensors: each rank fingerprints its local shard and the header records which
slice (``extra["shards"]``); the traced sites are the parallelized linears themselves (``blocks.1.mlp.0``,
``blocks.1.mlp.2``): each rank records its half of ``mlp.0``'s output and the whole, all-reduced, output of
``mlp.2``. Run it twice and compare with ``tracer.compare.compare_runs`` or ``sdc diff``: bit-identical.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from faults.node import emulated_node, node_header
from faults.profile import load_profile
from tracer.determinism import configure_determinism
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer

SITES = r"blocks\.\d+\.mlp\.[02]"  # the parallelized linears


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (one rank-NNNNN log per rank)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--fault-profile", help="play an emulated unhealthy node: a shipped profile's name or a TOML file")
    p.add_argument("--fault-seed", type=int, default=0)
    args = p.parse_args()
    profile = load_profile(args.fault_profile) if args.fault_profile else None

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    settings = {"seed": 0, "threads": 1}
    configure_determinism(**settings)  # same init on every rank; bits depend on the thread count
    model = Model(args.vocab, args.width, blocks=2)
    for block in model.blocks:
        parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1000)  # tensor parallelism: every rank computes on the same batch
    config = {"example": "torchrun_tp", "width": args.width, "vocab": args.vocab, **settings}
    try:
        run = RunInfo(f"example-rank{rank}", config=config, extra=node_header(profile, args.fault_seed, False))
        tracer = Tracer(model, optimizer, out=args.out, run=run, options=TraceOptions(sites=SITES))
        with tracer, emulated_node(tracer, model, fault_profile=profile, fault_seed=args.fault_seed):
            for step in range(args.steps):
                with tracer.step(step):
                    tokens = torch.randint(args.vocab, (4, 9), generator=data)  # (B, T+1)
                    tracer.microbatch(0, inputs=tokens)
                    logits = model(tokens[:, :-1])
                    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
                    loss.backward()
                    tracer.loss(loss)
                    optimizer.step()
                    optimizer.zero_grad()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
