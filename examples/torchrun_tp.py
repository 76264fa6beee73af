"""A tensor-parallel (DTensor ``parallelize_module``) job under torchrun, traced, diffed and replayed: each rank
records its shards, and the same module is the workload factory ``build`` that ``sdc replay`` rebuilds it with.

From the repository root (``-m`` and ``--workload`` import ``examples.torchrun_tp`` from there)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m examples.torchrun_tp --out runs/tp
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m examples.torchrun_tp --out runs/tp-sick \\
        --fault-profile my-rank1-fault.toml             # an emulated unhealthy node: a rule's ``ranks`` picks it
    sdc diff --golden runs/tp --suspect runs/tp-sick --db tp.duckdb && sdc query summary --db tp.duckdb
    sdc replay --golden runs/tp --suspect runs/tp-sick --workload examples.torchrun_tp:build --nproc 2 \\
        --steps 3:4 --mode lockstep --out runs/tp-lockstep

examples/torchrun_fsdp2.py's small transformer (embedding, two blocks of attention and an ``mlp``, a head),
workload (random tokens, AdamW) and recording loop (sharded checkpoints every ``--checkpoint-every`` steps),
with the MLPs split Megatron-style over a 1-D device mesh of the ranks: ``ColwiseParallel`` on ``mlp.0`` (each
rank computes its share of the hidden units), ``RowwiseParallel`` on ``mlp.2`` (each rank's partial sums,
all-reduced). Every rank sees the same batches (``Layout(tp=N)``: one data-parallel replica). The MLP weights
are DTensors: each rank fingerprints its local shard and the header records which slice (``extra["shards"]``);
the traced sites are the parallelized linears themselves (``blocks.1.mlp.0``, ``blocks.1.mlp.2``) and the GELU
between them (``blocks.1.mlp.1``): each rank records its half of ``mlp.0``'s and the GELU's output and the whole,
all-reduced, output of ``mlp.2``. A fault in a rank's GELU stays on that rank's ``mlp.1`` in a lockstep replay.
(The fault emulator cannot corrupt a DTensor op's result yet: the linears themselves compute on DTensors.) Two runs are
bit-identical. No ``clip_grad_norm_``: torch refuses a norm over DTensor and plain parameters together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from examples.torchrun_fsdp2 import (
    CONFIG,
    RandomTokensLM,
    job_arguments,
    job_config,
    language_model,
    record,
    with_defaults,
)
from tracer import Layout

SITES = r"blocks\.\d+\.mlp\.[012]"  # the parallelized linears and the GELU between them
TP_CONFIG = {**CONFIG, "train": {**CONFIG["train"], "clip": 0.0}, "parallel": {}}


def build(config: Mapping[str, Any], device: torch.device) -> RandomTokensLM:
    """The workload factory (`workload.protocol`): each block's MLP split over a 1-D mesh of all the ranks;
    unsplit without a process group (``--nproc 1``)."""
    world = dist.get_world_size() if dist.is_initialized() else 1

    def split(model: nn.Module) -> None:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        for block in model.blocks:
            parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

    return language_model(with_defaults(config, TP_CONFIG), device, Layout(tp=world), split)


def main() -> None:
    args = job_arguments(__doc__).parse_args()
    dist.init_process_group("gloo")
    try:
        record(build(job_config(args), torch.device("cpu")), args, entry="examples.torchrun_tp:build", sites=SITES)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
