"""torchtitan's own debug Qwen3-MoE (its model code: router, token dispatcher, grouped experts; random init, no
download), cut to a few layers and experts, under torchtitan's own ``parallelize_qwen3`` with expert parallelism:
the experts split over the ranks, tokens routed to them by all-to-all, the rest sharded by FSDP2. Trained under the
workload protocol on gloo.

Needs the ``[torchtitan]`` extra. From the repository root (``--workload`` imports ``examples.torchtitan_moe``)::

    sdc record --workload examples.torchtitan_moe:build --nproc 2 --sites 'layers\\.\\d+\\.moe\\.experts\\.\\d+' \\
        --out runs/titan-moe
    sdc record --workload examples.torchtitan_moe:build --nproc 2 --sites 'layers\\.\\d+\\.moe\\.experts\\.\\d+' \\
        --out runs/titan-moe-sick --fault-profile my-expert3-fault.toml   # ranks = [1], sites on expert 3
    sdc diff --golden runs/titan-moe --suspect runs/titan-moe-sick --db moe.duckdb && sdc query summary --db moe.duckdb
    sdc replay --golden runs/titan-moe --suspect runs/titan-moe-sick --workload examples.torchtitan_moe:build \\
        --nproc 2 --steps 3:4 --mode lockstep --out runs/titan-moe-lockstep

The model is ``Qwen3Model`` of torchtitan's ``debugmodel_moe`` flavour (width 256, 16 heads, vocabulary 2048) with
``model.layers`` layers of ``model.experts`` experts (``model.hidden`` units, ``model.top_k`` per token), built on
the meta device, parallelized, then initialised by its own ``init_weights``. Expert ``G`` lives on rank
``G // (experts / ranks)``. torchtitan computes a layer's local experts in one grouped product; here each expert
is a module of its own, ``layers.N.moe.experts.G`` by its **global** index, running the same product on its rows
(`workload.titan_internals.expert_sites`), so a site names its expert, a fault rule can aim at it, and an expert
the router sent no token records an empty output. Its dispatch and combine all-to-alls are collective events
(``layers.N.moe.dispatch.all_to_all.in`` / ``.out``, forward and backward). The CPU changes of
examples/torchtitan_llama3.py apply, and two more (workload/titan_internals.py): torchtitan's SPMD backend set as
its ``Trainer`` sets it, and no load balancing (its ``Trainer``'s optimizer hook). No gradient clipping: the
experts' gradients live on the ``ep`` mesh, the others on ``fsdp``, and torch's ``clip_grad_norm_`` refuses to mix
meshes ("All operands in aten.stack.default must have the same mesh"). Each rank draws its own batches; FSDP2 and
the all-to-all's backward sum the ranks' gradients, so each microbatch's loss is divided by microbatches x ranks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from examples.torchrun_fsdp2 import with_defaults
from examples.torchtitan_llama3 import SETTINGS, TitanLM, titan_workload
from tracer import Layout, configure_determinism
from workload.titan_internals import (
    MoeShape,
    debug_qwen3_moe,
    expert_sites,
    parallel_dims_of,
    parallelize_moe,
    sum_gradients,
    use_cpu_meshes,
    use_spmd_backend,
)

SITES = r"layers\.\d+\.moe\.experts\.\d+"  # every expert this rank holds, by its global index
CONFIG: dict[str, dict[str, Any]] = {
    "model": {"vocab": 2048, "layers": 2, "experts": 4, "top_k": 2, "hidden": 64},  # vocab: the flavour's
    "train": {**SETTINGS, "lr": 1e-3, "batch": 2, "seq": 16, "microbatches": 2, "clip": 0.0},
    "run": {"steps": 6, "checkpoint_every": 2},
}


def build(config: Mapping[str, Any], device: torch.device) -> TitanLM:
    """The workload factory (`workload.protocol`): torchtitan's debug Qwen3-MoE under its ``parallelize_qwen3``,
    the experts over all the ranks (expert parallel), the rest FSDP2-sharded; unsharded without a process group
    (``--nproc 1``)."""
    config = with_defaults(config, CONFIG)
    m, t = config["model"], config["train"]
    world = dist.get_world_size() if dist.is_initialized() else 1
    if m["experts"] % world:
        raise ValueError(f"model.experts = {m['experts']} do not split over {world} ranks")
    configure_determinism(t["seed"], t["threads"])  # the same initial weights on every rank
    use_cpu_meshes()
    dims, parallelism = parallel_dims_of(world, 1, expert_parallel_degree=world)
    use_spmd_backend(parallelism)
    shape = MoeShape(layers=m["layers"], experts=m["experts"], top_k=m["top_k"], hidden=m["hidden"])
    with torch.device("meta"):
        model = debug_qwen3_moe(parallelism, shape).build()
    first = 0
    if dist.is_initialized():
        with tempfile.TemporaryDirectory() as scratch:
            model = parallelize_moe(model, dims, parallelism, scratch)
        sum_gradients(model)
        first = dims.get_mesh("ep").get_local_rank() * (m["experts"] // world) if world > 1 else 0
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    expert_sites(model, first)
    model.train()
    return titan_workload(model, config, Layout(dp=world))  # each rank its own batches
