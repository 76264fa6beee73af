"""A model with a deliberately nondeterministic site, rebuilt through the workload protocol.

``layers.N.mix`` adds to each row the sum of its features taken in a random order, drawn from a generator the
model seeds from the clock on every call (``model.seeded = false``, the default): float addition is not
associative, so the site's bits change from run to run, as an atomics-based GPU reduction's do. With
``model.seeded = true`` the generator gets the same seed on every call instead, and the model is deterministic
although it draws from a generator of its own; a list (``[true, false]``) sets it layer by layer. Random init,
no download.

    record_run({"model": {}, "run": {...}}, out, node_label="a", workload=WORKLOAD, trace=TraceOptions(sites=SITES))
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tracer.determinism import configure_determinism
from workload.protocol import Workload

WORKLOAD = "tests.replay.unordered_sum:build"
SITES = r"layers\.\d+\.(mix|mlp)"
# Two orders give a row the same sum about half the time (127 of 256 elements differed between two runs of 4 rows):
# with 32 rows, two runs give the site the same bits with a chance of about 2**-32, not 1 in 16.
DEFAULTS = {"dim": 64, "layers": 2, "batch": 32, "seed": 0, "lr": 1e-2, "seeded": False}


class UnorderedSum(nn.Module):
    """``proj(x)`` plus the sum of its features in a random order (one order per call)."""

    def __init__(self, dim: int, seeded: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.seeded = seeded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        seed = 1234 if self.seeded else time.time_ns()
        order = torch.randperm(y.shape[-1], generator=torch.Generator().manual_seed(seed))
        return y + y.index_select(-1, order).sum(-1, keepdim=True)


class Block(nn.Module):
    def __init__(self, dim: int, seeded: bool) -> None:
        super().__init__()
        self.mix = UnorderedSum(dim, seeded)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(x)
        return x + self.mlp(x)


class Model(nn.Module):
    def __init__(self, dim: int, layers: int, seeded: bool | list[bool]) -> None:
        super().__init__()
        per_layer = seeded if isinstance(seeded, list) else [seeded] * layers  # a list: each layer's own
        self.layers = nn.ModuleList(Block(dim, s) for s in per_layer)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x)
        return self.head(x).squeeze(-1)


class UnorderedWorkload(Workload):
    """Regress a fixed random projection of random inputs drawn from the step and the seed."""

    def microbatches(self, step: int) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        c = settings(self.config)
        g = torch.Generator().manual_seed(c["seed"] * 1_000_003 + step)
        x = torch.randn(c["batch"], c["dim"], generator=g)
        return [(x, x.sum(-1).tanh())]

    def loss(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, target = batch
        return F.mse_loss(self.model(x), target)


def settings(config: Mapping[str, Any]) -> dict[str, Any]:
    return {**DEFAULTS, **config.get("model", {})}


def build(config: Mapping[str, Any], device: torch.device) -> UnorderedWorkload:
    c = settings(config)
    configure_determinism(c["seed"], 1)
    torch.manual_seed(c["seed"])
    model = Model(c["dim"], c["layers"], c["seeded"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=c["lr"], foreach=False)
    return UnorderedWorkload(
        model=model,
        optimizer=optimizer,
        config=dict(config),
        seed=c["seed"],
        data_order_fingerprint=f"random-inputs/seed={c['seed']}",
    )
