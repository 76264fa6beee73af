"""What the framework callbacks share: the Tracer's settings, and one traced run driven by training events.

A callback translates its framework's events into these calls and adds no tracing logic of its own::

    open (train begin) -> checkpoint -> begin_step -> (microbatch, loss) ... next_microbatch ... -> end_step
                       -> ... -> close (train end, or the exception that ended training)

Everything on the Tracer is the Tracer's: site hooks, optimizer hooks (gradients before the update, after
any clipping; parameters after it), checkpoints, the log, and the guard (``guard=``: `tracer.guard.Guard`),
which re-runs a flagged step through the optimizer's closure where the framework's closure is the whole step.
Under ``torch.distributed`` every rank traces its own log (``rank-NNNNN``) and rank 0 claims ``out`` for all
(`claim_for_ranks`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import torch
from torch import nn

from tracer.batch_inputs import batch_tensors
from tracer.checkpoint import Stateful
from tracer.errors import CaptureError, ConfigError, TraceWarning, UsageError
from tracer.guard import Guard
from tracer.guard.ranks import group_device
from tracer.log import claim_out_dir
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer

# Builds the context a traced run trains in, from its open Tracer and model: e.g. an emulated unhealthy node,
# ``lambda tracer, model: faults.node.emulated_node(tracer, model, fault_profile=...)``.
Around = Callable[[Tracer, nn.Module], AbstractContextManager[Any]]


@dataclass(frozen=True)
class CallbackSettings:
    """Where a callback records and what: the `Tracer`'s options, plus what the framework cannot tell it."""

    out: Path
    node_label: str
    trace: TraceOptions = TraceOptions()  # sites, captured tensors, ...: the Tracer's own options
    config: Mapping[str, Any] = field(default_factory=dict)  # your own sections of the header config (dataset, ...)
    data_order_fingerprint: str = ""  # set it to something that changes whenever the data or its order would
    extra: Mapping[str, Any] = field(default_factory=dict)  # header extra, e.g. faults.node.node_header(...)
    around: Around | None = None
    overwrite: bool = False  # replace a run already in ``out``
    guard: Guard | None = None  # check each step before the optimizer uses it (tracer.guard)


class TracedRun:
    """One Tracer opened when training begins and closed when it ends, bracketed into steps and microbatches
    by a framework's events."""

    def __init__(self, settings: CallbackSettings) -> None:
        self.settings = settings
        self.tracer: Tracer | None = None
        self._stack: ExitStack | None = None
        self._step: AbstractContextManager[None] | None = None
        self._states: Mapping[str, Stateful] = {}
        self._announced = False
        self.microbatch_index = 0

    @property
    def in_step(self) -> bool:
        return self._step is not None

    def open(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        config: Mapping[str, Any],
        seed: int,
        states: Mapping[str, Stateful],
        extra: Mapping[str, Any],
    ) -> Tracer:
        """Start the log in ``settings.out`` (refusing to mix runs) and enter the Tracer, then ``around``."""
        if self.tracer is not None:
            raise CaptureError(f"{self.settings.out}: this callback is already tracing a run; use one callback per run")
        o = self.settings
        clash = sorted(set(o.config) & set(config))
        if clash:
            raise ConfigError(f"config section {clash[0]!r} is the framework's; name your own sections otherwise")
        stack = ExitStack()
        claim_for_ranks(stack, o.out, o.overwrite)  # released last, at close
        try:
            run = RunInfo(
                o.node_label,
                config={**config, **o.config},
                seed=seed,
                data_order_fingerprint=o.data_order_fingerprint,
                extra={**extra, **o.extra},
            )
            tracer = Tracer(model, optimizer, out=o.out, run=run, options=o.trace, guard=o.guard)
            stack.enter_context(tracer)
            if o.around is not None:
                stack.enter_context(o.around(tracer, model))
        except BaseException as exc:
            stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.tracer, self._stack, self._states = tracer, stack, dict(states)
        return tracer

    def on_close(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` when the run closes, before the Tracer closes (remove a callback's own hooks)."""
        assert self._stack is not None
        self._stack.callback(fn)

    def checkpoint(self, step: int) -> None:
        """Save the state before ``step`` (model, optimizer, RNG and the named states, e.g. the LR scheduler)."""
        self._active.checkpoint(step, data={"step": step}, states=self._states)

    def begin_step(self, step: int, *, closure_reruns: bool = True) -> None:
        """Open Tracer step ``step``; ``closure_reruns``: whether the optimizer's closure is the whole step, so
        that the guard may re-run the step through it."""
        if self._step is not None:
            raise CaptureError(
                f"step {self._active.step_index} is still open when step {step} begins; "
                "the framework's step events are out of order"
            )
        self._step = self._active.step(step, closure_reruns=closure_reruns)
        self._step.__enter__()
        self.microbatch_index, self._announced = 0, False

    def microbatch(self, batch: Any) -> None:
        """Announce the current microbatch and fingerprint its input tensors, once per microbatch."""
        if not self._announced:
            self._announced = True
            self._active.microbatch(self.microbatch_index, inputs=batch_tensors(batch))

    def next_microbatch(self) -> None:
        self.microbatch_index, self._announced = self.microbatch_index + 1, False

    def loss(self, value: torch.Tensor | float) -> None:
        """This microbatch's loss as it went into ``backward()``."""
        self._active.loss(value)

    def end_step(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(None, None, None)

    def close(self, exc: BaseException | None = None) -> None:
        """Close the log: complete, or failed with ``exc``. Closing a closed run does nothing."""
        stack = self._stack
        self.tracer, self._stack, self._step = None, None, None  # an unfinished step is not logged
        if stack is None:
            return
        if exc is None:
            stack.close()
        else:
            stack.__exit__(type(exc), exc, exc.__traceback__)

    @property
    def _active(self) -> Tracer:
        if self.tracer is None:
            raise CaptureError("no traced run is open: training has not begun, or it has ended")
        return self.tracer


class TracingCallback:
    """What each framework's callback is besides its framework's callback class: its settings
    (`CallbackSettings`), one `TracedRun`, and ``with callback:`` closing the log as failed if training raises."""

    # Why the framework gives the guard no way to run a step again, or "" if it can (through the closure).
    cannot_rerun = ""

    def __init__(
        self,
        out: str | Path,
        node_label: str,
        *,
        options: TraceOptions | None = None,
        config: Mapping[str, Any] | None = None,
        data_order_fingerprint: str = "",
        extra: Mapping[str, Any] | None = None,
        around: Around | None = None,
        overwrite: bool = False,
        guard: Guard | None = None,
    ) -> None:
        self.settings = CallbackSettings(
            out=Path(out),
            node_label=node_label,
            trace=options or TraceOptions(),
            config=dict(config or {}),
            data_order_fingerprint=data_order_fingerprint,
            extra=dict(extra or {}),
            around=around,
            overwrite=overwrite,
            guard=guard,
        )
        self.run = TracedRun(self.settings)
        if guard is not None and self.cannot_rerun:
            warn_no_rerun(self.cannot_rerun)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.run.close(exc)


def claim_for_ranks(stack: ExitStack, out: Path, overwrite: bool) -> None:
    """Claim ``out`` for a recording into ``stack`` (`claim_out_dir`): in a multi-rank job rank 0 claims it for all
    ranks (each writes its own ``rank-NNNNN``), and no rank starts writing before the claim, nor after it failed."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        stack.enter_context(claim_out_dir(out, role="train", overwrite=overwrite))
        return
    error: Exception | None = None
    if torch.distributed.get_rank() == 0:
        try:
            stack.enter_context(claim_out_dir(out, role="train", overwrite=overwrite))
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, then rank 0 raises it as it is
            error = exc
    failure = _rank_0_says(None if error is None else str(error))  # also the barrier: the claim is done
    if error is not None:
        raise error
    if failure is not None:
        raise UsageError(f"rank 0 could not claim the run directory: {failure}")


MAX_MESSAGE = 4096  # bytes of rank 0's message the other ranks receive


def _rank_0_says(text: str | None) -> str | None:
    """Rank 0's ``text`` on every rank (None: it has none), sent as bytes in a tensor: nothing is pickled."""
    device = group_device()
    data = (text or "").encode()[:MAX_MESSAGE]
    size = torch.tensor([-1 if text is None else len(data)], dtype=torch.int64, device=device)
    torch.distributed.broadcast(size, src=0)
    n = int(size.item())
    if n < 0:
        return None
    buffer = (
        torch.tensor(list(data), dtype=torch.uint8, device=device)
        if torch.distributed.get_rank() == 0
        else torch.empty(n, dtype=torch.uint8, device=device)
    )
    torch.distributed.broadcast(buffer, src=0)
    return bytes(buffer.cpu().tolist()).decode(errors="replace")


def warn_no_rerun(why: str) -> None:
    """Say once, when a guard is given, that its detectors run but no step can be re-run (docs/guard.md)."""
    warnings.warn(
        f"the guard cannot re-run steps here: {why}. Its detectors still check every step; an alarm is logged "
        "as unclassified and the guard's on_deterministic policy (continue, skip, stop) applies to it",
        TraceWarning,
        stacklevel=3,
    )
