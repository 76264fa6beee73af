"""Models built around torch's ``nn.Transformer``, rebuilt through the workload protocol for lockstep tests.

``nn.MultiheadAttention`` takes the same tensor three times (``self_attn(x, x, x)``) and a decoder's
cross-attention two different ones (``multihead_attn(x, memory, memory)``): the calling conventions a
lockstep site must overwrite every input gradient of. ``model.kind`` picks the model: ``"torch"``, a
small sequence-to-sequence model of our own, or ``"lightning"``, Lightning's demo ``Transformer``; both
random init, no dropout.

    record_run({"model": {"kind": "torch"}, "run": {...}}, out, workload="tests.replay.torch_transformer:build")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tracer.determinism import configure_determinism
from workload.protocol import Workload

WORKLOAD = "tests.replay.torch_transformer:build"
DEFAULTS = {
    "kind": "torch",
    "dim": 16,
    "heads": 2,
    "layers": 2,
    "ffn": 32,
    "vocab": 32,
    "seq": 8,
    "batch": 2,
    "microbatches": 1,
    "seed": 0,
    "lr": 1e-2,
}
SELF_ATTENTION = r"transformer\.(encoder|decoder)\.layers\.\d+\.self_attn"  # self_attn(x, x, x)
ALL_ATTENTION = r"transformer\.(encoder|decoder)\.layers\.\d+\.(self_attn|multihead_attn)"  # and cross-attention


class Seq2Seq(nn.Module):
    """Token embedding, ``nn.Transformer`` (post-norm layers, a causal mask on the target), a linear head."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, ffn: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.transformer = nn.Transformer(dim, heads, layers, layers, ffn, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])  # (T, T), float: 0 and -inf
        out = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=mask)  # (B, T, D)
        return F.log_softmax(self.head(out), dim=-1).flatten(0, 1)  # (B * T, V)


class TransformerWorkload(Workload):
    """Predict a random sequence shifted by one; sequences drawn from the step and the seed."""

    def microbatches(self, step: int) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        c = settings(self.config)
        g = torch.Generator().manual_seed(c["seed"] * 1_000_003 + step)
        tokens = torch.randint(0, c["vocab"], (c["microbatches"], c["batch"], c["seq"] + 1), generator=g)
        return [(t[:, :-1], t[:, 1:]) for t in tokens]

    def loss(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        src, tgt = batch
        log_probs = self.model(src, tgt)  # (B * T, V); both models predict tgt from itself and src
        return F.nll_loss(log_probs, tgt.roll(-1, dims=1).flatten()) / settings(self.config)["microbatches"]


def settings(config: Mapping[str, Any]) -> dict[str, Any]:
    return {**DEFAULTS, **config.get("model", {})}


def build(config: Mapping[str, Any], device: torch.device) -> TransformerWorkload:
    c = settings(config)
    configure_determinism(c["seed"], 1)
    torch.manual_seed(c["seed"])
    if c["kind"] == "torch":
        model: nn.Module = Seq2Seq(c["vocab"], c["dim"], c["heads"], c["layers"], c["ffn"])
    elif c["kind"] == "lightning":
        from pytorch_lightning.demos import Transformer

        model = Transformer(
            vocab_size=c["vocab"], ninp=c["dim"], nhead=c["heads"], nhid=c["ffn"], nlayers=c["layers"], dropout=0.0
        )
    else:
        raise ValueError(f"model.kind = {c['kind']!r}: expected 'torch' or 'lightning'")
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=c["lr"], foreach=False)
    return TransformerWorkload(
        model=model,
        optimizer=optimizer,
        config=dict(config),
        seed=c["seed"],
        data_order_fingerprint=f"random-tokens/seed={c['seed']}",
    )
