"""A third-party model under torch's DistributedDataParallel as a workload factory: transformers' GPT-2, built
from a tiny config with random init (no download), wrapped in DDP, each rank its own random-token batches.

    sdc record --workload tests.parallel.ddp_gpt2:build --nproc 2 --checkpoint-every 2 --out runs/ddp-gpt2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tracer.determinism import configure_determinism
from tracer.parallel import Layout
from workload.protocol import Workload

CONFIG: dict[str, dict[str, Any]] = {
    "model": {"vocab": 64, "width": 16, "layers": 2, "heads": 2, "seq": 8},
    "train": {"seed": 0, "threads": 1, "lr": 1e-2, "batch": 2, "microbatches": 2},
    "run": {"steps": 4, "checkpoint_every": 2},
}


class RandomTokensGPT2(Workload):
    """Next-token prediction on random tokens, a pure function of the step and the replica."""

    def microbatches(self, step: int) -> Sequence[torch.Tensor]:
        m, t = self.config["model"], self.config["train"]
        rank = dist.get_rank() if dist.is_initialized() else 0
        g = torch.Generator().manual_seed((t["seed"] * 1_000_003 + step) * 1024 + rank)
        tokens = torch.randint(m["vocab"], (t["microbatches"] * t["batch"], m["seq"]), generator=g)  # (B, T)
        return list(tokens.split(t["batch"]))

    def loss(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch).loss / self.config["train"]["microbatches"]


def build(config: Mapping[str, Any], device: torch.device) -> RandomTokensGPT2:
    """GPT-2 with the same random init on every rank, under DDP when a process group exists, and AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = {**config, **{k: {**v, **config.get(k, {})} for k, v in CONFIG.items()}}
    m, t = config["model"], config["train"]
    configure_determinism(t["seed"], t["threads"])
    model: torch.nn.Module = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=m["vocab"],
            n_positions=m["seq"],
            n_embd=m["width"],
            n_layer=m["layers"],
            n_head=m["heads"],
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    ).to(device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if dist.is_initialized():
        model = DistributedDataParallel(model)
    return RandomTokensGPT2(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=t["lr"], foreach=False),
        config=config,
        seed=t["seed"],
        layout=Layout(dp=world),
        data_order_fingerprint=f"random-tokens/seed={t['seed']}/replicas={world}",
    )
