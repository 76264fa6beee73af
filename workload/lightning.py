"""Rebuild a PyTorch Lightning run for replay: `LightningWorkload`.

A run recorded with `tracer.integrations.lightning.SdcTraceCallback` is replayed through a factory of yours
that builds the same LightningModule (same seed) and a ``pl.Trainer`` with the same settings, unfitted::

    def build(config, device):
        configure_determinism(seed=0, threads=1)
        module = MyModule(**HPARAMS)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=100, accumulate_grad_batches=2,
                             gradient_clip_val=1.0, logger=False, enable_checkpointing=False)
        return LightningWorkload.of(module, trainer)

Each part of a step is what Lightning's automatic optimization runs:

- ``microbatches(step)``: batches ``k * accumulate_grad_batches ...`` of the epoch (the last step of an
  epoch takes what is left) from ``train_dataloader()``, iterated epoch by epoch from a fresh loader with
  the sampler's epoch set, then the module's batch-transfer hooks; each with its ``batch_idx``;
- ``loss``: ``training_step(batch, batch_idx)`` in the precision plugin's context, divided by
  ``accumulate_grad_batches`` (as Lightning's closure does, also for a short last step);
- ``finish_backward``: the precision plugin's ``clip_gradients`` with the Trainer's value and algorithm;
- ``update``: the optimizer, then each scheduler at its interval and frequency, as Lightning steps them.

Replayable: the train dataloader draws its order from its own seeded generator (``DataLoader(...,
generator=torch.Generator().manual_seed(s))`` built in ``train_dataloader()``), not from the global RNG.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import GradClipAlgorithmType
from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature
from pytorch_lightning.utilities.types import LRSchedulerConfig
from torch.utils.data import DataLoader

from tracer.batch_inputs import batch_tensors
from tracer.checkpoint import Stateful
from tracer.errors import ConfigError
from tracer.integrations.lightning import module_config, scheduler_states
from workload.epochs import EpochBatches
from workload.lightning_internals import configure_optimizers, set_sampler_epoch, transfer_batch
from workload.protocol import Workload

__all__ = ["LightningWorkload"]


@dataclass(frozen=True)
class LightningMicrobatch:
    """One batch as ``training_step`` receives it."""

    batch: Any  # after the module's batch-transfer hooks
    batch_idx: int  # within its epoch


@dataclass
class LightningWorkload(Workload):
    """A LightningModule's optimizer, schedulers and data, stepped the way Lightning's fit loop steps them."""

    trainer: pl.Trainer | None = None
    batches: EpochBatches | None = None
    schedulers: list[LRSchedulerConfig] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        module: pl.LightningModule,
        trainer: pl.Trainer,
        *,
        datamodule: pl.LightningDataModule | None = None,
        checkpoint_every: int = 10,
    ) -> LightningWorkload:
        """Configure the module's optimizers and its train dataloader as ``trainer.fit`` would, without fitting."""
        optimizers, configs = configure_optimizers(module)
        if not module.automatic_optimization or len(optimizers) != 1:
            raise ConfigError("LightningWorkload replays automatic optimization with one optimizer")
        if any(c.reduce_on_plateau for c in configs):
            raise ConfigError("ReduceLROnPlateau steps on a validation metric, which replay does not compute")
        if trainer.limit_train_batches not in (1.0, None):
            raise ConfigError(f"limit_train_batches = {trainer.limit_train_batches}: only whole epochs are replayable")
        source = datamodule if datamodule is not None else module
        loaders: list[DataLoader] = []

        def open_epoch(epoch: int) -> Iterator[Any]:
            if epoch == 0 or not loaders:  # a fresh loader: its generator starts where the fit's did
                loaders[:] = [source.train_dataloader()]
            set_sampler_epoch(loaders[0], epoch)
            return iter(loaders[0])

        batches_per_epoch = len(source.train_dataloader())
        return cls(
            model=module,
            optimizer=optimizers[0],
            scheduler=configs[0].scheduler if configs else None,
            config=module_config(module, trainer, batches_per_epoch, checkpoint_every),
            trainer=trainer,
            batches=EpochBatches(open_epoch, batches_per_epoch, trainer.accumulate_grad_batches, history=True),
            schedulers=configs,
        )

    @property
    def _parts(self) -> tuple[pl.Trainer, EpochBatches]:
        assert self.trainer is not None and self.batches is not None, "build it with LightningWorkload.of(...)"
        return self.trainer, self.batches

    def microbatches(self, step: int) -> Sequence[LightningMicrobatch]:
        trainer, batches = self._parts
        module = self.model
        assert isinstance(module, pl.LightningModule)
        first = step % batches.steps_per_epoch * batches.per_step
        out = []
        for i, batch in enumerate(batches.step(step)):
            batch = transfer_batch(module, trainer.precision_plugin.convert_input(batch))
            out.append(LightningMicrobatch(batch, first + i))
        return out

    def inputs(self, batch: LightningMicrobatch) -> torch.Tensor | tuple[torch.Tensor, ...] | None:
        return batch_tensors(batch.batch)

    def start_step(self, step: int) -> None:
        self.model.train()

    def loss(self, step: int, batch: LightningMicrobatch) -> torch.Tensor:
        trainer, _ = self._parts
        module = self.model
        assert isinstance(module, pl.LightningModule)
        args = (
            (batch.batch, batch.batch_idx)
            if is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)
            else (batch.batch,)
        )
        with trainer.precision_plugin.train_step_context(), torch.enable_grad(), warnings.catch_warnings():
            # No fit loop is running, so self.log() has nowhere to log: that is expected here.
            warnings.filterwarnings("ignore", message=r"You are trying to `self\.log\(\)`")
            out = module.training_step(*args)
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if not isinstance(loss, torch.Tensor):
            raise ConfigError(
                f"training_step returned {type(out).__name__} at step {step}, batch {batch.batch_idx}: "
                "a skipped batch (None) is not replayable"
            )
        return loss / trainer.accumulate_grad_batches

    def finish_backward(self, step: int) -> None:
        trainer, _ = self._parts
        if trainer.gradient_clip_val:  # the algorithm defaults as LightningModule.clip_gradients defaults it
            algorithm = GradClipAlgorithmType(trainer.gradient_clip_algorithm or "norm")
            trainer.precision_plugin.clip_gradients(self.optimizer, trainer.gradient_clip_val, algorithm)

    def update(self, step: int) -> None:
        _, batches = self._parts
        self.optimizer.step()
        epoch, index = divmod(step, batches.steps_per_epoch)
        last_batch = min((index + 1) * batches.per_step, batches.batches_per_epoch) - 1
        # Lightning's fit loop: step-interval schedulers by the epoch's batch index, then epoch-interval ones
        # after an epoch's last batch.
        for c in self.schedulers:
            if c.interval == "step" and (last_batch + 1) % c.frequency == 0:
                c.scheduler.step()
        if index == batches.steps_per_epoch - 1:
            for c in self.schedulers:
                if c.interval == "epoch" and (epoch + 1) % c.frequency == 0:
                    c.scheduler.step()

    def states(self) -> dict[str, Stateful]:
        return scheduler_states(self.schedulers) if self.schedulers else {}
