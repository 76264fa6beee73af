"""Trace a tensor-parallel (DTensor ``parallelize_module``) job under torchrun: each rank records its shards.

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_tp.py --out runs/tp
    sdc inspect runs/tp

To play an emulated unhealthy node, pass a fault profile (a rule's ``ranks`` picks the faulty rank)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_tp.py --out runs/tp-sick \
        --fault-profile my-rank1-fault.toml
    sdc diff --golden runs/tp --suspect runs/tp-sick --db tp.duckdb && sdc query summary --db tp.duckdb

examples/torchrun_fsdp2.py's small transformer (embedding, two blocks of attention and an ``mlp``, a head)
and training loop (AdamW), with the MLPs split Megatron-style
over a 1-D device mesh of the 2 ranks: ``ColwiseParallel`` on ``mlp.0`` (each rank computes half the hidden
units), ``RowwiseParallel`` on ``mlp.2`` (each rank's partial sums, all-reduced). Both ranks see the same
batch. The MLP weights are DTensors: each rank fingerprints its local shard and the header records which
slice (``extra["shards"]``); the traced sites are the parallelized linears themselves (``blocks.1.mlp.0``,
``blocks.1.mlp.2``): each rank records its half of ``mlp.0``'s output and the whole, all-reduced, output of
``mlp.2``. Run it twice and compare with ``tracer.compare.compare_runs`` or ``sdc diff``: bit-identical.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torchrun_fsdp2 import SETTINGS, Transformer, job_arguments, traced_training  # the script beside this one

from tracer.determinism import configure_determinism

SITES = r"blocks\.\d+\.mlp\.[02]"  # the parallelized linears


def main() -> None:
    args = job_arguments(__doc__).parse_args()
    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
        configure_determinism(**SETTINGS)  # same init on every rank; bits depend on the thread count
        model = Transformer(args.vocab, args.width, blocks=2)
        for block in model.blocks:
            parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        # Tensor parallelism: every rank computes on the same batch.
        # No clip_grad_norm_: torch refuses a norm over DTensor and plain parameters together.
        traced_training(model, args, example="torchrun_tp", data_seed=1000, sites=SITES, clip=False)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
