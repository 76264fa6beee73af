"""torchtitan's own debug Llama3 (its model code, random init, no download), parallelized by torchtitan's own
``parallelize_llama`` (FSDP2, and tensor parallel with ``--tp``), trained under the workload protocol on gloo.

Needs the ``[torchtitan]`` extra. From the repository root (``--workload`` imports ``examples.torchtitan_llama3``)::

    sdc record --workload examples.torchtitan_llama3:build --nproc 2 --checkpoint-every 2 --out runs/titan
    sdc record --workload examples.torchtitan_llama3:build --nproc 2 --checkpoint-every 2 --out runs/titan-sick \\
        --fault-profile my-rank1-fault.toml
    sdc diff --golden runs/titan --suspect runs/titan-sick --db titan.duckdb && sdc query summary --db titan.duckdb
    sdc replay --golden runs/titan --suspect runs/titan-sick --workload examples.torchtitan_llama3:build \\
        --nproc 2 --steps 3:4 --mode lockstep --out runs/titan-lockstep
    sdc record --workload examples.torchtitan_llama3:build --nproc 4 --set parallel.tp=2 --out runs/titan-tp

The model is ``Llama3Model`` of torchtitan's ``debugmodel`` flavour (6 layers, width 256, vocabulary 2048), built on
the meta device, parallelized, then initialised by its own ``init_weights``, as torchtitan's ``Trainer`` does. Four
changes for CPU, gloo and DCP, each in workload/titan_internals.py with the error it avoids: meshes on CPU, causal
SDPA for flex attention (no backward on CPU), separate Q, K, V projections for the fused one (its state dict is not
DCP's), a plain-sum gradient reduction for ``PREMUL_SUM`` (not in gloo). FSDP2 sums
the ranks' gradients, so each microbatch's loss is divided by microbatches x data-parallel replicas: the gradient
of the global mean loss. Site names are torchtitan's own (``layers.1.feed_forward``). The data are random tokens, a
pure function of the step and the replica (`examples.torchrun_fsdp2.RandomTokensLM`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from examples.torchrun_fsdp2 import RandomTokensLM, with_defaults
from tracer import Layout, configure_determinism
from workload.titan_internals import debug_llama3, parallel_dims_of, parallelize, sum_gradients, use_cpu_meshes

SETTINGS = {"seed": 0, "threads": 1}  # the bits depend on the thread count
CONFIG: dict[str, dict[str, Any]] = {
    "model": {"vocab": 2048},  # the debug flavour's; its other dimensions are torchtitan's
    "train": {**SETTINGS, "lr": 1e-3, "batch": 2, "seq": 16, "microbatches": 2, "clip": 1.0},
    "parallel": {"tp": 1},  # tensor-parallel ranks per replica; the rest of the ranks shard (FSDP2)
    "run": {"steps": 6, "checkpoint_every": 2},
}


class TitanLM(RandomTokensLM):
    """`RandomTokensLM` on torchtitan's model: its forward takes no masks with SDPA, FSDP2 sums gradients, and
    under tensor parallel each rank of a group gathers the whole logits (torchtitan's loss parallel would not)."""

    def loss(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        logits = self.model(batch[:, :-1])  # (B, T, V)
        if isinstance(logits, DTensor):  # tensor parallel: the head's output is split over the vocabulary
            logits = logits.full_tensor()
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        return loss / (self.config["train"]["microbatches"] * self.layout.dp)


def build(config: Mapping[str, Any], device: torch.device) -> TitanLM:
    """The workload factory (`workload.protocol`): torchtitan's debug Llama3 under its ``parallelize_llama`` over
    world size / ``parallel.tp`` FSDP2 shards x ``parallel.tp`` tensor-parallel ranks; unsharded without a process
    group (``--nproc 1``)."""
    config = with_defaults(config, CONFIG)
    t, tp = config["train"], config["parallel"]["tp"]
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % tp:
        raise ValueError(f"parallel.tp = {tp} must divide the world size {world}")
    configure_determinism(t["seed"], t["threads"])  # the same initial weights on every rank
    use_cpu_meshes()
    dims, parallelism = parallel_dims_of(world // tp, tp)
    with torch.device("meta"):
        model = debug_llama3(parallelism).build()
    if dist.is_initialized():
        with tempfile.TemporaryDirectory() as scratch:
            model = parallelize(model, dims, parallelism, scratch)
        sum_gradients(model)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return titan_workload(model, config, Layout(dp=world // tp, tp=tp, sp=tp > 1))  # torchtitan's TP is SP


def titan_workload(model: torch.nn.Module, config: dict[str, Any], layout: Layout) -> TitanLM:
    """``model`` trained by AdamW on random tokens, ``layout.dp`` replicas drawing their own."""
    t = config["train"]
    return TitanLM(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=t["lr"], foreach=False),
        config=config,
        seed=t["seed"],
        layout=layout,
        data_order_fingerprint=f"random-tokens/seed={t['seed']}/replicas={layout.dp}",
        grad_clip=t["clip"],
    )
