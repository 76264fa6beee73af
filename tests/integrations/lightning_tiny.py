"""A small LightningModule (a two-block token MLP) fitted by ``pytorch_lightning.Trainer``: the run the Lightning
end-to-end tests record, and its replay factory (``--workload tests.integrations.lightning_tiny:build``).

Ten sequences in batches of two are five batches an epoch; ``accumulate_grad_batches=2`` makes steps 0 and 1
of an epoch two microbatches each and step 2 the epoch's last batch alone, so a fault at step 2 names its
microbatch. Five steps cross into the second epoch; checkpoints every 2 steps and at the end (0, 2, 4, 5).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tracer.determinism import configure_determinism
from tracer.integrations.lightning import SdcTraceCallback
from tracer.options import CapturePolicy, TraceOptions
from workload.lightning import LightningWorkload

SEED, DATA_SEED = 0, 1234
SITES = r"blocks\.\d+\.mlp"
SITE_COUNT = 2
STEPS, CHECKPOINT_EVERY, CLIP = 5, 2, 0.5
FAULT_STEP, FAULT_SITE = 2, "blocks.1.mlp"  # step 2 has one microbatch
WORKLOAD = "tests.integrations.lightning_tiny:build"


class Block(nn.Module):
    def __init__(self, dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyLM(pl.LightningModule):
    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 2, lr: float = 1e-2, dropout: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, dropout) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # (B, T, V)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, targets = batch
        loss = F.cross_entropy(self(ids).reshape(-1, self.hparams.vocab), targets.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, foreach=False)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        tokens = torch.randint(0, self.hparams.vocab, (10, 17), generator=torch.Generator().manual_seed(DATA_SEED))
        data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
        # Its own seeded generator, made afresh on every call: the order is a function of the epoch alone.
        return DataLoader(data, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(SEED))


def make(
    root_dir: Path, callbacks: Sequence[pl.Callback] = (), *, bf16: bool = False, dropout: float = 0.0
) -> tuple[TinyLM, pl.Trainer]:
    """The module and Trainer; ``bf16``: Lightning's ``precision="bf16-mixed"`` (autocast), ``dropout``: in each
    block's MLP."""
    configure_determinism(SEED, threads=1)
    module = TinyLM(dropout=dropout)
    trainer = pl.Trainer(
        precision="bf16-mixed" if bf16 else "32-true",
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        accumulate_grad_batches=2,
        gradient_clip_val=CLIP,
        deterministic=True,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(root_dir),
        callbacks=list(callbacks),
    )
    return module, trainer


def record(out: Path, label: str, capture: CapturePolicy = CapturePolicy(), **callback: Any) -> Path:
    """Fit with the callback into ``out``; Lightning's own directory is a sibling. A ``config`` with a ``variant``
    section fits that variant."""
    cb = SdcTraceCallback(
        out,
        label,
        seed=SEED,
        options=TraceOptions(sites=SITES, capture=capture),
        checkpoint_every=CHECKPOINT_EVERY,
        **callback,
    )
    module, trainer = make(out.with_name(out.name + "-lightning"), [cb], **variant(callback.get("config", {})))
    trainer.fit(module)
    return out


def build(config: Mapping[str, Any], device: torch.device) -> LightningWorkload:
    """The replay factory: the same module and Trainer settings, never fitted."""
    module, trainer = make(Path(tempfile.gettempdir()) / "sdctrace-lightning-replay", **variant(config))
    return LightningWorkload.of(module, trainer, checkpoint_every=CHECKPOINT_EVERY)


def variant(config: Mapping[str, Any]) -> dict[str, Any]:
    """The test's own config section, which the header keeps: ``variant.bf16`` (default false) and
    ``variant.dropout`` (default 0), as `make`'s keywords."""
    section = config.get("variant", {})
    return {"bf16": bool(section.get("bf16", False)), "dropout": float(section.get("dropout", 0.0))}
