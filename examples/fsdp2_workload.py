"""A sharded (FSDP2) user workload that sdc records, verifies and replays on N ranks: the factory ``build``.

From the repository root (``export PYTHONPATH=.`` so that ``--workload`` can import ``examples.fsdp2_workload``)::

    sdc verify-determinism --workload examples.fsdp2_workload:build --nproc 2
    sdc record --workload examples.fsdp2_workload:build --nproc 2 --checkpoint-every 2 --out runs/f-golden
    sdc record --workload examples.fsdp2_workload:build --nproc 2 --checkpoint-every 2 --out runs/f-sick \\
        --fault-profile rank1-fault.toml
    sdc replay --golden runs/f-golden --suspect runs/f-sick --workload examples.fsdp2_workload:build \\
        --steps 3:4 --mode lockstep --out runs/f-lockstep

`jobs.launch` starts every rank with the gloo process group already made; ``build`` runs in each rank, builds
the same model on every one (seeded), ``fully_shard``-s each block and the root (examples/torchrun_fsdp2.py's
small transformer), and says the layout: ``dp`` = the world size (FSDP2 is data parallel: each rank trains its
own shard of the data, ``microbatches`` draws it by rank). FSDP2 reduce-scatters the gradients itself, so
``finish_backward`` is the protocol's: clip (the global norm over DTensor gradients). Checkpoints are sharded
(`tracer.step_checkpoint`): each rank saves and restores its own shards. Without a process group (``--nproc
1``) the model stays unsharded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from examples.torchrun_fsdp2 import Transformer
from tracer.determinism import configure_determinism
from tracer.parallel import Layout
from workload.protocol import Workload

CONFIG: dict[str, Any] = {
    "model": {"vocab": 64, "width": 32, "blocks": 2},
    "train": {"seed": 0, "threads": 1, "lr": 1e-2, "batch": 4, "seq": 8, "microbatches": 2, "clip": 1.0},
    "run": {"steps": 6, "checkpoint_every": 2},
}


class ShardedLM(Workload):
    """Next-token prediction on random tokens; each rank its own batch of every step."""

    def microbatches(self, step: int) -> Sequence[torch.Tensor]:
        t, vocab = self.config["train"], self.config["model"]["vocab"]
        rank = dist.get_rank() if dist.is_initialized() else 0
        g = torch.Generator().manual_seed((t["seed"] * 1_000_003 + step) * 1024 + rank)
        tokens = torch.randint(vocab, (t["microbatches"] * t["batch"], t["seq"] + 1), generator=g)
        return list(tokens.split(t["batch"]))

    def loss(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        logits = self.model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        return loss / self.config["train"]["microbatches"]


def build(config: Mapping[str, Any], device: torch.device) -> ShardedLM:
    """The factory each launched rank calls with the run's config (the process group is already made)."""
    config = {section: {**CONFIG.get(section, {}), **config.get(section, {})} for section in CONFIG}
    m, t = config["model"], config["train"]
    configure_determinism(t["seed"], t["threads"])  # the same initial weights on every rank, before sharding
    model = Transformer(m["vocab"], m["width"], m["blocks"]).to(device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if dist.is_initialized():
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], foreach=False)
    return ShardedLM(model=model, optimizer=optimizer, config=config, seed=t["seed"], layout=Layout(dp=world),
                     data_order_fingerprint=f"random-tokens/seed={t['seed']}/ranks={world}", grad_clip=t["clip"])
