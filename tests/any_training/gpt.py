"""A GPT-2-style model and training of the tests' own, rebuilt through the workload protocol.

Unlike the reference model it fuses q, k and v into one Linear, keeps its blocks in
``h``, calls attention with a keyword argument and returns a tuple from it (the
output and the attention probabilities), uses an LR scheduler and clips gradients:
the calling conventions the Tracer and replay must handle for a user's model.

    sdc record --workload tests.any_training.gpt:build --config FILE --out runs/a
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tracer.determinism import configure_determinism
from workload.protocol import Workload

DEFAULTS = {
    "dim": 32,
    "layers": 2,
    "heads": 4,
    "vocab": 64,
    "seq": 16,
    "batch": 4,
    "microbatches": 2,
    "seed": 0,
    "lr": 3e-3,
    "threads": 1,
}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)  # fused q, k, v
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(d, dim=-1)  # 3 x (B, T, D)
        q, k, v = (x.view(b, t, self.heads, d // self.heads).transpose(1, 2) for x in (q, k, v))  # (B, H, T, Dh)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)  # (B, H, T, T)
        mask = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        out = (probs @ v).transpose(1, 2).reshape(b, t, d)  # (B, T, D)
        return self.c_proj(out), probs


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attn(hidden_states=self.ln_1(x))
        x = x + attended
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))  # (B, T, D)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


class GPTWorkload(Workload):
    """Next-token prediction on sequences generated from the step and the seed."""

    def microbatches(self, step: int) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        c = {**DEFAULTS, **self.config.get("model", {})}
        g = torch.Generator().manual_seed(c["seed"] * 1_000_003 + step)
        tokens = torch.randint(0, c["vocab"], (c["microbatches"], c["batch"], c["seq"] + 1), generator=g)
        return [(t[:, :-1], t[:, 1:]) for t in tokens]

    def loss(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        logits = self.model(inputs)
        n = {**DEFAULTS, **self.config.get("model", {})}["microbatches"]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) / n


def build(config: Mapping[str, Any], device: torch.device) -> GPTWorkload:
    c = {**DEFAULTS, **config.get("model", {})}
    configure_determinism(c["seed"], c["threads"])
    torch.manual_seed(c["seed"])
    model = GPT(c["vocab"], c["dim"], c["layers"], c["heads"], c["seq"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=c["lr"], foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return GPTWorkload(
        model=model,
        optimizer=optimizer,
        config=dict(config),
        scheduler=scheduler,
        seed=c["seed"],
        data_order_fingerprint=f"gpt-random-tokens/seed={c['seed']}",
        grad_clip=1.0,
    )
