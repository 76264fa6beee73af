"""Trace a PyTorch Lightning fit with sdctrace, then diff and replay it: a runnable example.

A small residual-MLP classifier learns which of three random directions a point lies along: 8 optimizer steps
of two accumulated batches over 3 epochs of a seeded dataset, on the CPU, in seconds. From the repository root,
with it on the import path (``export PYTHONPATH=.``, so that replay can import ``examples.lightning_module``)::

    python examples/lightning_module.py --out runs/pl-golden --node-label node-a
    python examples/lightning_module.py --out runs/pl-sick --node-label node-b \
        --fault-profile bursty-mismatch --fault-seed 1

    sdc diff --golden runs/pl-golden --suspect runs/pl-sick --db study.duckdb
    sdc query summary --db study.duckdb
    sdc replay --golden runs/pl-golden --suspect runs/pl-sick --workload examples.lightning_module:build \\
        --at-first-divergence --mode lockstep --out runs/pl-lockstep
    sdc replay --golden runs/pl-golden --suspect runs/pl-sick --workload examples.lightning_module:build \\
        --steps 3:5 --mode param-sync --out runs/pl-param-sync

Recording is Lightning's own ``fit`` with `SdcTraceCallback` among the callbacks (the default sites: every
``layers.N.mlp``). Replay imports ``build``, which makes the same module and Trainer settings and wraps them in
`LightningWorkload`: ``training_step``, the clipping, optimizer and scheduler Lightning would run, step by step.
What makes it replayable: ``train_dataloader()`` shuffles with its own seeded generator, made afresh on each
call (docs/integrations.md); dropout would replay too (the Tracer logs the torch RNG at each step's start).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from faults import load_profile, node_options
from tracer import configure_determinism
from tracer.integrations.lightning import SdcTraceCallback
from workload.lightning import LightningWorkload

SEED, CHECKPOINT_EVERY = 0, 2


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))  # (B, W)


class Classifier(pl.LightningModule):
    def __init__(self, features: int = 8, width: int = 32, depth: int = 2, classes: int = 3, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()  # the run header records them
        self.embed = nn.Linear(features, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)  # (B, classes)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(40, self.hparams.features, generator=g)
        directions = torch.randn(self.hparams.features, self.hparams.classes, generator=g)
        data = TensorDataset(x, (x @ directions).argmax(dim=1))
        # Shuffled by its own seeded generator, made afresh on every call: replay can walk the same epochs.
        return DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(SEED))


def make(root_dir: str | Path, callbacks: Sequence[pl.Callback] = ()) -> tuple[Classifier, pl.Trainer]:
    configure_determinism(SEED, threads=1)  # bits depend on the thread count; the header records it
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=8,
        accumulate_grad_batches=2,
        gradient_clip_val=1.0,
        deterministic=True,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root_dir),
        callbacks=list(callbacks),
    )
    return Classifier(), trainer


def build(config: Mapping[str, Any], device: torch.device) -> LightningWorkload:
    """The factory ``sdc replay --workload examples.lightning_module:build`` calls: the same module, unfitted."""
    module, trainer = make(Path(tempfile.gettempdir()) / "sdctrace-example-lightning")
    return LightningWorkload.of(module, trainer, checkpoint_every=CHECKPOINT_EVERY)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="run directory to record into")
    p.add_argument("--node-label", default="node-a", help="this node's name in the run header")
    p.add_argument("--fault-profile", help="play an unhealthy node with this fault profile (sdc faults list)")
    p.add_argument("--fault-seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    args = p.parse_args(argv)
    node = node_options(load_profile(args.fault_profile), args.fault_seed) if args.fault_profile else {}
    callback = SdcTraceCallback(
        args.out, args.node_label, seed=SEED, checkpoint_every=CHECKPOINT_EVERY, overwrite=args.overwrite, **node
    )
    with tempfile.TemporaryDirectory(prefix="lightning-") as root_dir:
        module, trainer = make(root_dir, [callback])
        trainer.fit(module)
    print(f"recorded {args.out}; next: sdc inspect {args.out}")


if __name__ == "__main__":
    main()
