"""The workload protocol: how to rebuild a training run, step by step, on any node.

Replay re-runs recorded steps with golden state injected, so it must be able to
rebuild *the user's* training, not only sdctrace's reference model. A workload is
what a factory returns::

    def build(config: Mapping[str, Any], device: torch.device) -> Workload: ...

named on the command line as ``package.module:build`` (``sdc record --workload``,
``sdc replay --workload``). The factory receives the config the run header records
(the ``--config`` TOML file as a dict) and builds model, optimizer and scheduler
deterministically: it calls `tracer.determinism.configure_determinism` first and
seeds the model's initialisation from the config.

A workload's ``microbatches(step)`` is a pure function of the step (and the
config's seeds), so replay can jump to any step after restoring a checkpoint; the
rest of a step is split where sdctrace needs to see it (`run_step`):

    zero_grad -> start_step -> for each microbatch: loss -> backward -> finish_backward
              -> (the Tracer records gradients) -> update -> (the Tracer records parameters)

On ``N`` ranks (``--nproc N``) the factory runs in each rank `jobs.launch` starts, with the gloo process group
already made: it builds the same model on every rank, shards it as the training does (FSDP2's ``fully_shard``,
DTensor), and sets ``layout`` to the ranks' layout (``Layout(dp=N)`` for FSDP2 or DDP). ``microbatches(step)``
returns this rank's share of the data (draw it by ``torch.distributed.get_rank()``); gradient reduction is the
framework's (FSDP2, DDP) or the workload's own ``finish_backward``. A model with DTensor parameters is
checkpointed sharded (`tracer.checkpoint.step`); examples/torchrun_fsdp2.py's ``build`` is such a workload.
A pipeline-parallel workload (examples/torchrun_pipeline.py) builds one stage per rank and overrides
`Workload.run_microbatches`: its schedule runs the microbatches, reporting each stage's to the observer.

`Workload` gives defaults for everything but ``microbatches`` and ``loss``;
`workload.reference` is the reference LLaMA-style implementation and needs no
special case anywhere.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from tracer import typed_toml
from tracer.batch_inputs import batch_tensors
from tracer.device import mark_step, to_host
from tracer.errors import ConfigError
from tracer.log.records import MAX_STEP
from tracer.parallel import Layout
from tracer.tracing import Tracer

ENTRY_POINT = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")
REFERENCE = "workload.reference:build"


@dataclass(frozen=True)
class RunSettings:
    """How long a run trains and how often it checkpoints: the config's ``[run]`` section (the reference
    workload's `workload.reference_config.Config.run` too), which the config fingerprint leaves out
    (`tracer.config_fingerprint`)."""

    steps: int = 30
    checkpoint_every: int = 10  # optimizer steps between checkpoints; 0 = never

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("checkpoint_every", 0)):
            value = getattr(self, name)
            typed_toml.check(
                value >= low,
                name,
                lambda at, n=name, v=value, lo=low: (
                    f"{at}{n} = {v} must be an integer >= {lo}" + (" (0 = never)" if n == "checkpoint_every" else "")
                ),
            )
        typed_toml.check(
            self.steps <= MAX_STEP,
            "steps",
            lambda at: f"{at}steps = {self.steps} must be in 1..{MAX_STEP} (the largest step a log records)",
        )

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> RunSettings:
        return typed_toml.from_dict(_RunSection, {"run": config.get("run", {})}, "the workload config").run


@dataclass(frozen=True)
class _RunSection:
    run: RunSettings = RunSettings()


class StepObserver(Protocol):
    """What `run_step` reports to: a `tracer.tracing.Tracer`, or replay's lighter bookkeeping."""

    def microbatch(self, index: int, inputs: Any = None) -> None: ...
    def loss(self, value: torch.Tensor | float) -> None: ...


@dataclass
class Workload:
    """One training process's objects and the steps of its training.

    Subclass it and implement `microbatches` and `loss`; override the other methods
    where your training differs (gradient clipping, a learning-rate schedule set per
    step, multi-rank gradient reduction).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    config: Mapping[str, Any]
    scheduler: Any = None  # a torch LR scheduler (anything with state_dict/load_state_dict and step)
    seed: int = 0
    data_order_fingerprint: str = ""  # changes whenever the data or its order would
    layout: Layout = field(default_factory=Layout)
    grad_clip: float = 0.0  # max global gradient norm; 0 = off

    def __post_init__(self) -> None:
        """Runs after the fields are set. Override it to finish building (a subclass need not be a dataclass
        itself: this one being here is what makes the generated ``__init__`` call a subclass's)."""

    @property
    def run(self) -> RunSettings:
        return RunSettings.of(self.config)

    def microbatches(self, step: int) -> Sequence[Any]:
        """This rank's microbatches of optimizer step ``step``: a pure function of the step."""
        raise NotImplementedError

    def loss(self, step: int, batch: Any) -> torch.Tensor:
        """Forward ``batch`` and return its loss as it contributes to the step (already divided
        by the number of microbatches), ready for ``backward()``."""
        raise NotImplementedError

    def inputs(self, batch: Any) -> torch.Tensor | tuple[torch.Tensor, ...] | None:
        """The tensors of ``batch`` the Tracer fingerprints as the step's input."""
        return batch_tensors(batch)

    def start_step(self, step: int) -> None:
        """Before the step's first forward, after ``zero_grad``."""

    def run_microbatches(self, step: int, observer: StepObserver | None = None) -> list[torch.Tensor]:
        """Every microbatch's forward and backward, each begun with ``observer.microbatch`` and its loss reported
        to ``observer.loss``; returns the losses (detached). A pipeline-parallel workload overrides it: its
        schedule runs the microbatches through the stages (examples/torchrun_pipeline.py)."""
        losses: list[torch.Tensor] = []
        for index, batch in enumerate(self.microbatches(step)):
            if observer is not None:
                observer.microbatch(index, inputs=self.inputs(batch))
            loss = self.loss(step, batch)
            loss.backward()
            if observer is not None:
                observer.loss(loss)
            losses.append(loss.detach())
        return losses

    def finish_backward(self, step: int) -> torch.Tensor | float | None:
        """After the last backward, before the optimizer sees the gradients: reduce, clip. Returns the global
        gradient norm before clipping if it clipped (the guard's `GradNormSpike` watches it: the clipped
        gradients the Tracer records hide a spike), else None."""
        if self.grad_clip > 0:
            return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip, foreach=False)
        return None

    def update(self, step: int) -> None:
        """The optimizer step, then the scheduler's."""
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def step_loss(self, losses: Sequence[float]) -> float:
        """The whole step's loss from this rank's microbatch losses."""
        return float(sum(losses))

    def states(self) -> dict[str, Any]:
        """Stateful objects a checkpoint saves beside model and optimizer (``state_dict`` /
        ``load_state_dict``), by name."""
        return {"scheduler": self.scheduler} if self.scheduler is not None else {}


Factory = Callable[[Mapping[str, Any], torch.device], Workload]


def run_step(w: Workload, step: int, observer: StepObserver | None = None, *, update: bool = True) -> float:
    """One optimizer step of ``w``; returns the step's loss.

    With ``update=False`` the step stops before the optimizer, leaving the final
    gradients in ``.grad`` (replay compares them and discards the step). Traced by a
    guarded `Tracer`, the step's forward and backward (`forward_backward`) is what the
    guard runs again when a detector fires; the loss returned is then the accepted run's.
    """
    losses: list[torch.Tensor] = []

    def again() -> None:
        losses[:] = forward_backward(w, step, observer)

    if isinstance(observer, Tracer):
        observer.rerun_with(again)
    again()
    if update:
        w.update(step)
    # The step's end: a lazy device (XLA) runs the step's graph here, so reading the losses runs nothing more.
    mark_step(next(w.model.parameters()).device)
    return w.step_loss([v.item() for v in to_host(losses)])


def forward_backward(w: Workload, step: int, observer: StepObserver | None = None) -> list[torch.Tensor]:
    """Everything of a step before the optimizer: zero the gradients, every microbatch's forward and backward,
    then `Workload.finish_backward`. Returns the microbatch losses (detached)."""
    w.optimizer.zero_grad(set_to_none=True)
    w.start_step(step)
    losses = w.run_microbatches(step, observer)
    norm = w.finish_backward(step)
    if norm is not None and isinstance(observer, Tracer):
        observer.gradient_norm(norm)
    return losses


def load_workload_config(path: str | Path | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A TOML file as the dict a factory receives (empty without a file), with ``section.key=value``
    overrides applied (the value parsed as TOML, a bare word as a string)."""
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"--config {path}: no such file; pass the TOML file your workload reads")
    config = typed_toml.read(Path(path)) if path is not None else {}
    typed_toml.apply_overrides(config, overrides)
    return config


def factory_modules(entry: str) -> tuple[str, ...]:
    """The module ``entry`` (``package.module:function``) imports: what a job's process preloads before it forks the
    ranks (`jobs.launch.launch`); none for a malformed entry, which each rank's `load_factory` refuses."""
    return (entry.partition(":")[0],) if ENTRY_POINT.fullmatch(entry) else ()


def load_factory(entry: str) -> Factory:
    """Import ``package.module:function``: only ever an entry point the user named, never one read from a log."""
    if not ENTRY_POINT.fullmatch(entry):
        raise ConfigError(f"--workload {entry!r}: expected package.module:factory, e.g. {REFERENCE}")
    module_name, _, name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--workload {entry}: cannot import {module_name} ({exc}); is it on PYTHONPATH?") from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ConfigError(f"--workload {entry}: {module_name} has no function {name!r}")
    return factory


def build_workload(entry: str, config: Mapping[str, Any], device: torch.device) -> Workload:
    """Call the factory ``entry`` names and check that it returned a `Workload`."""
    w = load_factory(entry)(config, device)
    if not isinstance(w, Workload):
        raise ConfigError(
            f"--workload {entry}: returned {type(w).__name__}, not a workload.protocol.Workload; "
            "subclass Workload and implement microbatches() and loss()"
        )
    return w
