"""Trace your own data-parallel job under torchrun: every rank writes its own log.

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_ddp.py --out runs/ddp
    sdc inspect runs/ddp

To play an emulated unhealthy node, pass a fault profile (a rule's ``ranks`` picks the faulty rank)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_ddp.py --out runs/ddp-sick \
        --microbatches 2 --fault-profile my-rank1-fault.toml
    sdc diff --golden runs/ddp --suspect runs/ddp-sick --db ddp.duckdb && sdc query summary --db ddp.duckdb

Any model and optimizer work; here a small MLP wrapped in DistributedDataParallel
on gloo, accumulating gradients over ``--microbatches`` (DDP all-reduces in the last
one's backward). The Tracer reads rank and world size from torch.distributed, writes
``runs/ddp/rank-NNNNN/`` and records the layout (pure data parallelism unless you
pass ``parallel=Layout(...)``). Names leave out DDP's ``module.`` (sites ``0.mlp``, not ``module.0.mlp``), so
the job pairs with the same model trained unwrapped. Run it twice and compare with
``tracer.compare.compare_runs``: a deterministic job gives bit-identical logs.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from faults import emulated_node, load_profile, node_header
from tracer import RunInfo, TraceOptions, Tracer, configure_determinism


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (one rank-NNNNN log per rank)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=1, help="gradient accumulation steps per optimizer step")
    p.add_argument("--fault-profile", help="play an emulated unhealthy node: a shipped profile's name or a TOML file")
    p.add_argument("--fault-seed", type=int, default=0)
    args = p.parse_args()
    profile = load_profile(args.fault_profile) if args.fault_profile else None

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    settings = {"seed": 0, "threads": 1}
    configure_determinism(**settings)  # same init on every rank; bits depend on the thread count
    model = nn.Sequential(nn.Linear(args.width, args.width), *(Block(args.width) for _ in range(2)))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)  # each replica its own shard of the data
    config = {"example": "torchrun_ddp", "width": args.width, "microbatches": args.microbatches, **settings}
    last = args.microbatches - 1
    try:
        run = RunInfo(f"example-rank{rank}", config=config, extra=node_header(profile, args.fault_seed, False))
        tracer = Tracer(ddp, optimizer, out=args.out, run=run, options=TraceOptions(sites=r"\d+\.mlp"))
        with tracer, emulated_node(tracer, ddp, fault_profile=profile, fault_seed=args.fault_seed):
            for step in range(args.steps):
                with tracer.step(step):
                    for mb in range(args.microbatches):
                        x = torch.randn(16, args.width, generator=data)  # (B, C)
                        tracer.microbatch(mb, inputs=x)
                        # DDP averages the gradients over the ranks in the last microbatch's backward.
                        with contextlib.nullcontext() if mb == last else ddp.no_sync():
                            loss = (ddp(x) - x.flip(-1)).pow(2).mean() / args.microbatches
                            loss.backward()
                        tracer.loss(loss)
                    optimizer.step()
                    optimizer.zero_grad()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
