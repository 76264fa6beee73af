"""Rebuild a ``transformers.Trainer`` run for replay: `TrainerWorkload`.

A run recorded with `tracer.integrations.hf.SdcTraceCallback` is replayed through a factory of yours that
builds the same Trainer (model from its config with the same seed, the same `TrainingArguments`, the same
dataset and collator) and wraps it::

    def build(config, device):
        configure_determinism(seed=0, threads=1)
        model = LlamaForCausalLM(LlamaConfig(**MODEL))
        trainer = Trainer(model=model, args=TrainingArguments(...), train_dataset=data)
        return TrainerWorkload.of(trainer)

    sdc replay --golden runs/a --fault-profile my.toml --workload my_train:build --steps 3:4 --out runs/r

Every part of a step is the Trainer's own code, so replay's fingerprint check passes bit for bit:

- ``microbatches(step)``: the batches the Trainer fed at optimizer step ``step``, from its own train
  dataloader (accelerate's seedable sampler, epoch ``e`` seeded ``seed + e``; its collator), grouped by
  ``gradient_accumulation_steps`` with the last group of an epoch taking the rest, and the group's
  ``num_items_in_batch`` from ``Trainer.get_batch_samples``;
- the forward: the model as accelerate prepares it for the Trainer, so under its autocast with
  ``TrainingArguments(bf16=True)`` (or fp16 without a scaler), as ``Trainer.train`` runs it;
- ``loss``: ``Trainer.training_step`` itself (so a ``compute_loss`` override, label smoothing or a
  ``compute_loss_func`` are the Trainer's), stopped where it would call ``accelerator.backward``, and divided
  as that does;
- ``finish_backward``: the Trainer's clipping call (``accelerator.clip_grad_norm_``, same function, same
  foreach default), and its unclipped norm when ``max_grad_norm`` is 0;
- ``update``: the optimizer and LR scheduler the Trainer creates, stepped in its order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import has_length

from tracer.batch_inputs import batch_tensors
from tracer.errors import ConfigError
from tracer.integrations.hf import trainer_config
from workload.epochs import EpochBatches
from workload.hf_internals import clip_grad_norm, take_grad_norm
from workload.protocol import Workload

__all__ = ["TrainerWorkload"]


@dataclass(frozen=True)
class HFMicrobatch:
    """One microbatch as the Trainer fed it to ``training_step``."""

    inputs: Mapping[str, Any]  # the collator's batch
    num_items_in_batch: torch.Tensor | int | None  # tokens in the step's accumulated batch (None: not counted)
    accumulation_steps: int  # microbatches in this optimizer step: the Trainer's current_gradient_accumulation_steps


@dataclass
class TrainerWorkload(Workload):
    """A Trainer's model, optimizer, scheduler and data, stepped the way ``Trainer.train`` steps them."""

    trainer: Trainer | None = None
    batches: EpochBatches | None = None

    @classmethod
    def of(cls, trainer: Trainer) -> TrainerWorkload:
        """Create the Trainer's train dataloader, optimizer and scheduler as ``train()`` would, without training."""
        if trainer.accelerator.scaler is not None:
            raise ConfigError(
                "fp16 with a gradient scaler is not replayable yet: the scale changes from step to "
                "step outside the checkpoint; train in fp32 or bf16"
            )
        if trainer.args.world_size > 1:
            raise ConfigError(
                f"the Trainer runs on {trainer.args.world_size} processes; TrainerWorkload rebuilds "
                "single-process runs only"
            )
        loader = trainer.get_train_dataloader()
        if not has_length(loader):
            raise ConfigError(
                "the train dataset has no length (an IterableDataset): its steps cannot be found "
                "from a step number, so TrainerWorkload cannot rebuild them"
            )
        _, _, _, _, _, batches_per_epoch, max_steps = trainer.set_initial_training_values(trainer.args, loader)
        trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
        # As Trainer._prepare_for_training on one process: accelerate wraps the model's forward in its autocast
        # (bf16 or fp16 mixed precision) and keeps the same module, so replay computes in the recording's dtypes.
        prepared = trainer.accelerator.prepare_model(trainer.model)
        assert prepared is trainer.model, "on one process accelerate prepares the model in place"
        if isinstance(trainer.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ConfigError("ReduceLROnPlateau steps on an evaluation metric, which replay does not compute")

        def open_epoch(epoch: int) -> Iterator[Any]:
            # As Trainer._run_epoch: the loader's epoch, and the batch sampler's inside accelerate's shard.
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            inner = getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)
            if hasattr(inner, "set_epoch"):
                inner.set_epoch(epoch)
            return iter(loader)

        return cls(
            model=trainer.model,
            optimizer=trainer.optimizer,
            scheduler=trainer.lr_scheduler,
            config=trainer_config(trainer.model, trainer.args, max_steps),
            seed=trainer.args.seed,
            trainer=trainer,
            batches=EpochBatches(open_epoch, batches_per_epoch, trainer.args.gradient_accumulation_steps),
        )

    @property
    def _trainer(self) -> Trainer:
        assert self.trainer is not None and self.batches is not None, "build it with TrainerWorkload.of(trainer)"
        return self.trainer

    def microbatches(self, step: int) -> Sequence[HFMicrobatch]:
        t = self._trainer
        assert self.batches is not None
        group, num_items = t.get_batch_samples(iter(self.batches.step(step)), self.batches.per_step, t.args.device)
        return [HFMicrobatch(batch, num_items, len(group)) for batch in group]

    def inputs(self, batch: HFMicrobatch) -> torch.Tensor | tuple[torch.Tensor, ...] | None:
        return batch_tensors(batch.inputs)

    def loss(self, step: int, batch: HFMicrobatch) -> torch.Tensor:
        t = self._trainer
        t.current_gradient_accumulation_steps = batch.accumulation_steps
        passed: list[torch.Tensor] = []
        # training_step ends in accelerator.backward(loss): take the loss there and leave backward to the caller.
        t.accelerator.backward = lambda loss, **kwargs: passed.append(loss)
        try:
            t.training_step(self.model, dict(batch.inputs), batch.num_items_in_batch)
        finally:
            del t.accelerator.backward  # the instance attribute goes; the method is back
        assert len(passed) == 1, f"training_step called accelerator.backward {len(passed)} times, expected once"
        return passed[0] / t.accelerator.gradient_accumulation_steps  # what Accelerator.backward divides by

    def finish_backward(self, step: int) -> None:
        t = self._trainer
        norm = clip_grad_norm(t, self.model) if t.args.max_grad_norm > 0 else None
        take_grad_norm(t, self.model, norm)  # without clipping, the Trainer still takes the norm this way
