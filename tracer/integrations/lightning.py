"""Trace a PyTorch Lightning run with the same events as a hand-written loop.

    from tracer.integrations.lightning import SdcTraceCallback

    callback = SdcTraceCallback("runs/golden", "node-a", seed=0, checkpoint_every=10)
    trainer = pl.Trainer(max_steps=100, accumulate_grad_batches=2, callbacks=[callback], ...)
    trainer.fit(module)          # an exception closes the log as failed (on_exception)

What each Lightning event does (docs/integrations.md has the whole story):

- ``on_train_start``: opens a `Tracer` over the LightningModule and its optimizer (``trainer.optimizers[0]``,
  which Lightning steps with a closure: the Tracer records the gradients when the closure returns, i.e.
  after Lightning's gradient clipping, and the parameters after the update), enters ``around``;
- ``on_train_batch_start``: the first batch of an optimizer step opens a Tracer step (``trainer.global_step``,
  checkpointing first every ``checkpoint_every`` steps); every batch is a microbatch (``accumulate_grad_batches``
  of them a step, fewer at the end of an epoch) whose input tensors are fingerprinted;
- ``on_train_batch_end``: logs the microbatch's loss as ``backward()`` got it (the ``loss`` Lightning passes
  here: ``training_step``'s divided by ``accumulate_grad_batches``) and closes the step once the optimizer
  has stepped;
- ``on_train_end``: a checkpoint of the final state, then closes the log; ``on_exception``: closes it as failed.

``on_after_backward`` and ``on_before_optimizer_step`` are not needed: the latter comes before Lightning's
clipping, so the Tracer's optimizer hook is where the gradients the update reads can be seen.

With ``guard=`` the guard re-runs a flagged step through the optimizer's closure (forward, backward, clipping)
when ``accumulate_grad_batches`` is 1; with more, the closure holds only the last microbatch, so the detectors
run and the policy applies without a re-run, and a warning says so when training starts.
`workload.lightning.LightningWorkload` rebuilds such a run for replay.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import GradClipAlgorithmType
from pytorch_lightning.utilities.types import LRSchedulerConfig

from tracer.checkpoint import Stateful
from tracer.errors import ConfigError
from tracer.integrations.common import TracingCallback, warn_no_rerun

__all__ = ["SdcTraceCallback"]


def module_config(
    module: pl.LightningModule, trainer: pl.Trainer, batches_per_epoch: float, checkpoint_every: int
) -> dict[str, Any]:
    """The header config of a Lightning run: ``module`` (class and hyperparameters), the ``trainer`` settings
    that decide the bits, and ``run``."""
    steps = trainer.max_steps
    if steps is None or steps < 0:
        per_epoch = max(math.ceil(batches_per_epoch / trainer.accumulate_grad_batches), 1)
        steps = (trainer.max_epochs or 0) * per_epoch
    return {
        "module": {"class": f"{type(module).__module__}.{type(module).__qualname__}", "hparams": dict(module.hparams)},
        "trainer": {
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "gradient_clip_val": trainer.gradient_clip_val,
            "gradient_clip_algorithm": GradClipAlgorithmType(trainer.gradient_clip_algorithm or "norm").value,
            "precision": str(trainer.precision),
            "max_steps": trainer.max_steps,
            "max_epochs": trainer.max_epochs,
            "limit_train_batches": trainer.limit_train_batches,
        },
        "run": {"steps": int(steps), "checkpoint_every": checkpoint_every},
    }


def scheduler_states(configs: Sequence[LRSchedulerConfig]) -> dict[str, Stateful]:
    """The LR schedulers a checkpoint saves, by name: ``scheduler``, or ``scheduler.0``, ``scheduler.1``, ..."""
    if len(configs) == 1:
        return {"scheduler": configs[0].scheduler}
    return {f"scheduler.{i}": c.scheduler for i, c in enumerate(configs)}


class SdcTraceCallback(TracingCallback, pl.Callback):
    """Records a ``pytorch_lightning.Trainer`` fit into ``out`` (a run directory); see the module docstring."""

    def __init__(
        self,
        out: str | Path,
        node_label: str,
        *,
        checkpoint_every: int = 10,  # optimizer steps between checkpoints; 0: none (nothing can be replayed)
        seed: int | None = None,  # the run's seed for the header; default: seed_everything's (PL_GLOBAL_SEED) or 0
        **options: Any,  # options, config, data_order_fingerprint, extra, around, overwrite: TracingCallback's
    ) -> None:
        if checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every = {checkpoint_every} must be >= 0 (0: no checkpoints)")
        super().__init__(out, node_label, **options)
        self.checkpoint_every = checkpoint_every
        self.seed = seed
        self._closure_reruns = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not pl_module.automatic_optimization or len(trainer.optimizers) != 1:
            raise ConfigError(
                "SdcTraceCallback traces automatic optimization with one optimizer; "
                f"this module has automatic_optimization={pl_module.automatic_optimization} and "
                f"{len(trainer.optimizers)} optimizers"
            )
        seed = self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", "0"))
        self._closure_reruns = trainer.accumulate_grad_batches == 1
        if self.settings.guard is not None and not self._closure_reruns:
            warn_no_rerun(
                f"with accumulate_grad_batches={trainer.accumulate_grad_batches} Lightning's optimizer "
                "closure runs only a step's last microbatch"
            )
        self.run.open(
            pl_module,
            trainer.optimizers[0],
            seed=seed,
            states=scheduler_states(trainer.lr_scheduler_configs),
            config=module_config(pl_module, trainer, trainer.num_training_batches, self.checkpoint_every),
            extra={"integration": {"library": "pytorch_lightning", "version": pl.__version__}},
        )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.run.in_step:
            self.run.next_microbatch()
        else:
            step = trainer.global_step
            if self.checkpoint_every and step % self.checkpoint_every == 0:
                self.run.checkpoint(step)
            self.run.begin_step(step, closure_reruns=self._closure_reruns)
        self.run.microbatch(batch)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self.run.loss(loss)
        assert self.run.tracer is not None
        if trainer.global_step > self.run.tracer.step_index:  # the optimizer stepped: the step is complete
            self.run.end_step()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run.end_step()
        if self.checkpoint_every:
            self.run.checkpoint(trainer.global_step)
        self.run.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.run.close(exception)
