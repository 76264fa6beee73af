"""A sharded (FSDP2, ``fully_shard``) job under torchrun, traced, diffed and replayed: every rank fingerprints
its own shards, and the same module is the workload factory ``build`` that ``sdc replay`` rebuilds it with.

From the repository root (``-m`` and ``--workload`` import ``examples.torchrun_fsdp2`` from there)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m examples.torchrun_fsdp2 --out runs/fsdp2
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m examples.torchrun_fsdp2 --out runs/fsdp2-sick \\
        --fault-profile my-rank1-fault.toml             # an emulated unhealthy node: a rule's ``ranks`` picks it
    sdc diff --golden runs/fsdp2 --suspect runs/fsdp2-sick --db fsdp2.duckdb && sdc query summary --db fsdp2.duckdb
    sdc replay --golden runs/fsdp2 --suspect runs/fsdp2-sick --workload examples.torchrun_fsdp2:build --nproc 2 \\
        --steps 3:4 --mode lockstep --out runs/fsdp2-lockstep
    python -m torch.distributed.run --standalone --nproc-per-node 4 -m examples.torchrun_fsdp2 --out runs/hsdp \\
        --replicate 2                                   # HSDP: 2 replicas x 2 shards

``sdc record --workload examples.torchrun_fsdp2:build --nproc 2 --checkpoint-every 2 --out runs/f`` records the
same training without torchrun (`jobs.launch` starts the ranks), and ``sdc verify-determinism --workload
examples.torchrun_fsdp2:build --nproc 2`` checks it.

A small transformer (embedding, two blocks of attention and an ``mlp``, a head) with ``fully_shard`` on each
block and on the root, AdamW and ``clip_grad_norm_`` on the DTensor gradients, on gloo; each rank draws its
own batches (FSDP2 is data parallel). Parameters and gradients are DTensors: the Tracer fingerprints each
rank's local shard (no all-gather) and records in the header which slice of which parameter each rank holds
(``extra["shards"]``, docs/log-format.md). Site names are the model's own (``blocks.1.mlp``). Two runs are
bit-identical on every rank. The script trains through the workload protocol (`workload.protocol.run_step`)
and saves sharded checkpoints (DCP, `tracer.checkpoint.step`) every ``--checkpoint-every`` steps, so replay
rebuilds exactly what it recorded from the header's config (``[parallel]`` holds the sharding options, which
the config fingerprint leaves to pairing's field-by-field layout check).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

from faults import emulated_node, load_profile, node_header
from tracer import Layout, RunInfo, TraceOptions, Tracer, configure_determinism
from workload import Workload, run_step

SETTINGS = {"seed": 0, "threads": 1}  # the bits depend on the thread count
CONFIG: dict[str, dict[str, Any]] = {
    "model": {"vocab": 64, "width": 32, "blocks": 2},
    "train": {**SETTINGS, "lr": 1e-2, "batch": 4, "seq": 8, "microbatches": 2, "clip": 1.0},
    "parallel": {"shard_dim": 0, "replicate": 1},  # fully_shard's split; HSDP's replicas
    "run": {"steps": 6, "checkpoint_every": 2},
}


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
        # A linear on (B, T, C) returns a view of its 2-D product, and FSDP2 warns when a sharded module (the root
        # here) returns a view: an in-place op on it would skip the all-gather. The logits as a tensor of their own.
        return self.head(x).clone()  # (B, T, V)


def with_defaults(config: Mapping[str, Any], defaults: Mapping[str, Mapping[str, Any]] = CONFIG) -> dict[str, Any]:
    """``config``'s sections over ``defaults``' (a run header's config is complete: it comes back as it is)."""
    return {**config, **{section: {**values, **config.get(section, {})} for section, values in defaults.items()}}


class RandomTokensLM(Workload):
    """Next-token prediction on random tokens, a pure function of the step: each data-parallel replica draws its
    own batches (FSDP2: every rank), the ranks of a tensor-parallel group the same ones."""

    def microbatches(self, step: int) -> Sequence[torch.Tensor]:
        t, vocab = self.config["train"], self.config["model"]["vocab"]
        replica = self.layout.coords(dist.get_rank() if dist.is_initialized() else 0)["dp"]
        g = torch.Generator().manual_seed((t["seed"] * 1_000_003 + step) * 1024 + replica)
        tokens = torch.randint(vocab, (t["microbatches"] * t["batch"], t["seq"] + 1), generator=g)  # (B, T+1)
        return list(tokens.split(t["batch"]))

    def loss(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        logits = self.model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        return loss / self.config["train"]["microbatches"]


def language_model(config: Mapping[str, Any], device: torch.device, layout: Layout, parallelize: Any) -> RandomTokensLM:
    """The example's workload on ``config`` (complete: `with_defaults`): the same initial weights on every rank,
    then ``parallelize(model)`` splits them over the ranks (under a process group), and AdamW."""
    m, t = config["model"], config["train"]
    configure_determinism(t["seed"], t["threads"])  # the same initial weights on every rank, before sharding
    model = Transformer(m["vocab"], m["width"], m["blocks"]).to(device)
    if dist.is_initialized():
        parallelize(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], foreach=False)
    return RandomTokensLM(
        model=model,
        optimizer=optimizer,
        config=config,
        seed=t["seed"],
        layout=layout,
        data_order_fingerprint=f"random-tokens/seed={t['seed']}/replicas={layout.dp}",
        grad_clip=t["clip"],
    )


def build(config: Mapping[str, Any], device: torch.device) -> RandomTokensLM:
    """The workload factory (`workload.protocol`): ``fully_shard`` on each block and the root over the ranks
    (HSDP with ``parallel.replicate`` > 1); unsharded without a process group (``--nproc 1``)."""
    config = with_defaults(config)
    p = config["parallel"]

    def shard(model: nn.Module) -> None:
        placement: dict[str, Any] = {"shard_placement_fn": lambda x: Shard(p["shard_dim"] if x.ndim > 1 else 0)}
        if p["replicate"] > 1:  # HSDP: shard within a replica, all-reduce gradients across the replicas
            world = dist.get_world_size()
            placement["mesh"] = init_device_mesh(
                "cpu", (p["replicate"], world // p["replicate"]), mesh_dim_names=("replicate", "shard")
            )
        for block in model.blocks:
            fully_shard(block, **placement)
        fully_shard(model, **placement)

    world = dist.get_world_size() if dist.is_initialized() else 1
    return language_model(config, device, Layout(dp=world), shard)


def job_arguments(description: str | None) -> argparse.ArgumentParser:
    """The options this example and examples/torchrun_tp.py share."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (one rank-NNNNN log per rank)")
    p.add_argument("--steps", type=int, default=CONFIG["run"]["steps"])
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=CONFIG["run"]["checkpoint_every"],
        help="steps between the sharded checkpoints replay restarts from (0 = none: no replay)",
    )
    p.add_argument("--width", type=int, default=CONFIG["model"]["width"])
    p.add_argument("--vocab", type=int, default=CONFIG["model"]["vocab"])
    p.add_argument("--fault-profile", help="play an emulated unhealthy node: a shipped profile's name or a TOML file")
    p.add_argument("--fault-seed", type=int, default=0)
    return p


def job_config(args: argparse.Namespace, **sections: dict[str, Any]) -> dict[str, Any]:
    """The config the command line gives the factory (the run header records it; replay rebuilds from it)."""
    return {
        "model": {"vocab": args.vocab, "width": args.width},
        "run": {"steps": args.steps, "checkpoint_every": args.checkpoint_every},
        **sections,
    }


def record(w: Workload, args: argparse.Namespace, *, entry: str, sites: str | None = None) -> None:
    """Train ``w`` for its ``run.steps`` under a Tracer into ``args.out`` (and an emulated node's faults), with a
    checkpoint every ``run.checkpoint_every`` steps; the header names the factory ``entry`` for replay."""
    rank = dist.get_rank()
    profile = load_profile(args.fault_profile) if args.fault_profile else None
    run = RunInfo(
        f"example-rank{rank}",
        config=w.config,
        seed=w.seed,
        data_order_fingerprint=w.data_order_fingerprint,
        extra={"workload": entry, **node_header(profile, args.fault_seed, False)},
    )
    tracer = Tracer(w.model, w.optimizer, out=args.out, run=run, options=TraceOptions(sites=sites), parallel=w.layout)
    every, steps = w.run.checkpoint_every, w.run.steps
    with tracer, emulated_node(tracer, w.model, fault_profile=profile, fault_seed=args.fault_seed):
        for step in range(steps):
            if every and step % every == 0:
                tracer.checkpoint(step, data={"step": step}, states=w.states())  # sharded: each rank its own
            with tracer.step(step):
                run_step(w, step, tracer)  # FSDP2 reduce-scatters each block's gradients: every rank keeps its shard
        if every:
            tracer.checkpoint(steps, data={"step": steps}, states=w.states())


def main() -> None:
    p = job_arguments(__doc__)
    p.add_argument(
        "--shard-dim",
        type=int,
        choices=(0, 1),
        default=0,
        help="the dimension of each matrix fully_shard splits (another layout: another run's bits)",
    )
    p.add_argument(
        "--replicate",
        type=int,
        default=1,
        metavar="R",
        help="HSDP: R replicas of a model sharded over world size / R ranks each (a 2-D device mesh)",
    )
    args = p.parse_args()
    dist.init_process_group("gloo")
    try:
        config = job_config(args, parallel={"shard_dim": args.shard_dim, "replicate": args.replicate})
        record(build(config, torch.device("cpu")), args, entry="examples.torchrun_fsdp2:build")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
