"""Trace a Hugging Face ``transformers.Trainer`` run with the same events as a hand-written loop.

    from tracer.integrations.hf import SdcTraceCallback

    callback = SdcTraceCallback("runs/golden", "node-a", options=TraceOptions(sites=r"model\\.layers\\.\\d+\\.mlp"))
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    with callback:              # closes the log as failed if training raises
        trainer.train()

What each Trainer event does (docs/integrations.md has the whole story):

- ``on_train_begin``: opens a `Tracer` over the Trainer's model and its torch optimizer (unwrapped from
  accelerate's ``AcceleratedOptimizer``, whose ``step`` calls the inner one, so the Tracer's optimizer hooks
  record every gradient after the Trainer's clipping and every parameter after the update), enters
  ``around`` (e.g. an emulated unhealthy node), and checkpoints the state before the first step;
- ``on_step_begin`` / ``on_substep_end`` / ``on_step_end``: one Tracer step per optimizer step
  (``state.global_step``), one microbatch per gradient-accumulation sub-step;
- a forward pre-hook on the model fingerprints each microbatch's inputs, and a forward hook logs its loss:
  ``outputs.loss`` as the Trainer scales it before ``backward()`` (as is when the Trainer passed
  ``num_items_in_batch``, which makes the model normalise over the whole accumulated batch; otherwise divided
  by the step's number of microbatches);
- ``on_save``: a checkpoint at each of the Trainer's save steps, the LR scheduler included;
- ``on_train_end``: closes the log.

The header config is the model's config, the `TrainingArguments` that decide the bits (`TRAINING_FIELDS`),
and ``run = {steps, checkpoint_every}``; `workload.hf.TrainerWorkload` rebuilds such a run for replay.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import torch
import transformers
from accelerate.optimizer import AcceleratedOptimizer
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from tracer.integrations.common import TracingCallback

__all__ = ["SdcTraceCallback"]

# The TrainingArguments that can change the bits of a step: data order and batching, optimizer and schedule,
# clipping, precision, loss scaling, compilation. (Logging, saving and hub fields cannot.)
TRAINING_FIELDS = (
    "seed",
    "data_seed",
    "full_determinism",
    "use_cpu",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "dataloader_drop_last",
    "train_sampling_strategy",
    "length_column_name",
    "remove_unused_columns",
    "label_names",
    "accelerator_config",
    "optim",
    "optim_args",
    "optim_target_modules",
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "max_grad_norm",
    "label_smoothing_factor",
    "average_tokens_across_devices",
    "bf16",
    "fp16",
    "tf32",
    "activation_checkpointing",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing",
    "torch_compile",
    "torch_compile_backend",
    "torch_compile_mode",
    "use_liger_kernel",
    "neftune_noise_alpha",
)


def trainer_config(model: nn.Module, args: TrainingArguments, max_steps: int) -> dict[str, Any]:
    """The header config of a Trainer run: ``model`` (its config), ``training`` and ``run``."""
    training = {name: getattr(args, name) for name in TRAINING_FIELDS if hasattr(args, name)}
    if hasattr(training.get("accelerator_config"), "to_dict"):
        training["accelerator_config"] = training["accelerator_config"].to_dict()
    # Enums and other objects as the plain values JSON gives them, so the log and the fingerprint agree.
    training = json.loads(json.dumps(training, default=str))
    config = getattr(model, "config", None)  # a transformers model's PretrainedConfig
    model_config = config.to_dict() if config is not None else {"class": type(model).__qualname__}
    return {"model": model_config, "training": training, "run": run_section(args, max_steps)}


def run_section(args: TrainingArguments, max_steps: int) -> dict[str, int]:
    """``steps`` the run trains and ``checkpoint_every``, the Trainer's save interval in steps (0: none)."""
    every = 0
    if args.save_strategy == "steps":
        every = math.ceil(max_steps * args.save_steps) if args.save_steps < 1 else int(args.save_steps)
    return {"steps": max_steps, "checkpoint_every": every}


def model_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The batch a model call was given: the Trainer passes it as keywords, plus ``num_items_in_batch``,
    which is the accumulated batch's token count and no input of this microbatch."""
    return {k: v for k, v in kwargs.items() if k != "num_items_in_batch"} if kwargs else args


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside accelerate's wrappers: the one whose step hooks fire."""
    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer


class SdcTraceCallback(TracingCallback, TrainerCallback):
    """Records a ``transformers.Trainer`` run into ``out`` (a run directory); see the module docstring.

    ``SdcTraceCallback(out, node_label, *, options, config, data_order_fingerprint, extra, around,
    overwrite, guard)``, as `tracer.integrations.common.TracingCallback` takes them. With a guard, its detectors
    check each step before the optimizer and its policy applies, but no step is re-run (`cannot_rerun`)."""

    cannot_rerun = (
        "a Hugging Face Trainer runs each step's forward and backward itself and gives callbacks no "
        "way to run them again"
    )

    _accumulation = 1  # gradient_accumulation_steps
    _batches_per_epoch: int | None = None
    _microbatches = 1  # in the current optimizer step

    # -- Trainer events -------------------------------------------------------------------
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        assert model is not None, "the Trainer passes its model to callbacks"
        self.run.open(
            model,
            torch_optimizer(optimizer),
            config=trainer_config(model, args, state.max_steps),
            seed=args.seed,
            states={"scheduler": lr_scheduler} if lr_scheduler is not None else {},
            extra={"integration": {"library": "transformers", "version": transformers.__version__}},
        )
        handles = [
            model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            model.register_forward_hook(self._after_forward, with_kwargs=True),
        ]
        for h in handles:
            self.run.on_close(h.remove)
        self._accumulation = args.gradient_accumulation_steps
        self._batches_per_epoch = len(train_dataloader) if hasattr(train_dataloader, "__len__") else None
        self.run.checkpoint(state.global_step)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run.begin_step(state.global_step)
        self._microbatches = self._microbatches_in(state.global_step)

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run.next_microbatch()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.run.end_step()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.run.checkpoint(state.global_step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run.close()

    # -- model hooks ----------------------------------------------------------------------
    def _before_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.run.in_step and module.training:  # evaluation forwards are no microbatch
            self.run.microbatch(model_inputs(args, kwargs))

    def _after_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not (self.run.in_step and module.training and isinstance(output, Mapping)):
            return
        loss = output.get("loss")
        if loss is None:
            return  # labels went to a compute_loss_func or label smoother instead: no loss to log
        # Trainer.training_step: a model given num_items_in_batch normalised over the accumulated batch already;
        # any other loss is divided by the step's number of microbatches. (Accelerate then divides by 1.)
        self.run.loss(loss if kwargs.get("num_items_in_batch") is not None else loss / self._microbatches)

    def _microbatches_in(self, step: int) -> int:
        """How many microbatches optimizer step ``step`` has: the last one of an epoch takes the remainder."""
        n, per_step = self._batches_per_epoch, self._accumulation
        if not n:
            return per_step
        steps = max(math.ceil(n / per_step), 1)
        return per_step if step % steps < steps - 1 else n - per_step * (steps - 1)
