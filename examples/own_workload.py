"""Your own model and training loop, recorded, diffed and replayed by sdctrace: a runnable example.

A small causal language model built from torch's own ``nn.TransformerEncoder`` learns sequences generated
from a seed, with gradient accumulation, clipping and an LR scheduler: 8 optimizer steps on the CPU in
seconds. ``build`` is the workload factory; the loop below is the one you would write anyway, with the
Tracer's calls added. From the repository root (``export PYTHONPATH=.`` so that ``--workload`` can import
``examples.own_workload``)::

    python examples/own_workload.py --out runs/own-golden --node-label node-a
    sdc record --workload examples.own_workload:build --out runs/own-sick --node-label node-b \\
        --fault-profile bursty-mismatch --fault-seed 1          # the same training, by sdc, on an emulated node
    sdc diff --golden runs/own-golden --suspect runs/own-sick --db study.duckdb
    sdc replay --golden runs/own-golden --suspect runs/own-sick --workload examples.own_workload:build \\
        --at-first-divergence --mode lockstep --out runs/own-lockstep

Both recordings pair: the header holds the same config, seed and data order, and `Workload.microbatches`
is a pure function of the step, which is what lets replay jump to any step from a checkpoint.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tracer import RunInfo, Tracer, configure_determinism
from workload import Workload

CONFIG: dict[str, Any] = {
    "model": {"vocab": 32, "dim": 32, "layers": 2, "heads": 4, "seq": 16},
    "train": {"seed": 0, "threads": 1, "lr": 3e-3, "batch": 4, "microbatches": 2, "clip": 1.0},
    "run": {"steps": 8, "checkpoint_every": 4},
}


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))  # (B, T, D)
        t = ids.shape[1]
        return self.head(self.encoder(x, mask=self.mask[:t, :t], is_causal=True))  # (B, T, V)


class CountingLM(Workload):
    """Next-token prediction on counting sequences (random start and stride), generated per step."""

    def microbatches(self, step: int) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        m, t = self.config["model"], self.config["train"]
        g = torch.Generator().manual_seed(t["seed"] * 1_000_003 + step)
        n = t["microbatches"] * t["batch"]
        start = torch.randint(0, m["vocab"], (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        ids = (start + stride * torch.arange(m["seq"] + 1)) % m["vocab"]  # (n, seq + 1)
        return [(mb[:, :-1], mb[:, 1:]) for mb in ids.split(t["batch"])]

    def loss(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, targets = batch
        logits = self.model(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return loss / self.config["train"]["microbatches"]


def build(config: Mapping[str, Any], device: torch.device) -> CountingLM:
    """The factory `sdc record --workload` and `sdc replay --workload` call with the run's config."""
    config = {section: {**CONFIG.get(section, {}), **config.get(section, {})} for section in CONFIG}
    t = config["train"]
    configure_determinism(t["seed"], t["threads"])  # before building: bits depend on both
    model = TinyLM(**config["model"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], foreach=False)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=100)
    return CountingLM(
        model=model,
        optimizer=optimizer,
        config=config,
        scheduler=scheduler,
        seed=t["seed"],
        data_order_fingerprint=f"counting/seed={t['seed']}",
        grad_clip=t["clip"],
    )


def train(out: Path, node_label: str) -> float:
    """Your loop, traced. `workload.protocol.run_step` does the same in one call."""
    w = build(CONFIG, torch.device("cpu"))
    run = RunInfo(
        node_label,
        config=w.config,
        seed=w.seed,
        data_order_fingerprint=w.data_order_fingerprint,
        extra={"workload": "examples.own_workload:build"},
    )  # says which --workload replays it
    loss = float("nan")
    with Tracer(w.model, w.optimizer, out=out, run=run) as tracer:
        for step in range(w.run.steps):
            if step % w.run.checkpoint_every == 0:
                tracer.checkpoint(step, states=w.states())  # model, optimizer, scheduler, RNG
            with tracer.step(step):
                w.optimizer.zero_grad(set_to_none=True)
                losses = []
                for mb, batch in enumerate(w.microbatches(step)):
                    tracer.microbatch(mb, inputs=w.inputs(batch))
                    loss_t = w.loss(step, batch)
                    loss_t.backward()
                    tracer.loss(loss_t)
                    losses.append(loss_t.item())
                torch.nn.utils.clip_grad_norm_(w.model.parameters(), w.grad_clip, foreach=False)
                w.optimizer.step()
                w.scheduler.step()
            loss = sum(losses)
        tracer.checkpoint(w.run.steps, states=w.states())
    return loss


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="run directory to create")
    p.add_argument("--node-label", default="node-a", help="this node's name in the run header")
    args = p.parse_args(argv)
    loss = train(args.out, args.node_label)
    print(f"recorded {args.out} (final loss {loss:.4f}); next: sdc inspect {args.out}")


if __name__ == "__main__":
    main()
