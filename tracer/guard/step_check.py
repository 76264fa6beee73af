"""The guard's decision on one step, made in the Tracer's optimizer pre-hook before the optimizer uses it.

`tracer.tracing.Tracer` calls it with the step's first run and what it needs from the Tracer::

    state = step_guard(guard, optimizer, options, device, layout, rank)   # once, when the Tracer is made
    result = check_step(state, step, optimizer, Attempt(0, loss, grads, result, norm), rerun,
                        use_sink=..., run_again=..., checkpoint=...)

No alarm: the first run's records go to the log. An alarm: the step is run again (``run_again``) until
`classify` tells transient from deterministic, the policy (`verdict`) applies, and the decided run's
records and the ``guard`` event go to the log; ``stop`` checkpoints and raises `GuardStop`.

Under torch.distributed every rank decides together (`tracer.guard.ranks`): one all-reduce of the alarm flag
per step, so an alarm on any rank re-runs the step on all of them; a re-run while any rank is undecided; and
the most severe rank's outcome, so all of them continue, skip or stop alike.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tracer.device import is_lazy
from tracer.errors import ConfigError, GuardStop, TraceWarning
from tracer.fingerprint import TensorDigest
from tracer.guard.evidence import Evidence
from tracer.guard.guard import Guard, Outcome, classify, verdict
from tracer.guard.runtime import StepGuard
from tracer.options import TraceOptions
from tracer.parallel import Layout
from tracer.record_buffer import RecordSink


@dataclass(frozen=True)
class Attempt:
    """One run of a guarded step as the Tracer recorded it: its index (0, then the re-runs 1, 2, ...), its loss,
    its gradient digests in log order, what its closure or re-run returned, and the gradient norm the loop
    reported before clipping."""

    index: int
    loss: float | None
    grads: list[tuple[str, TensorDigest]]
    result: Any = None
    grad_norm: torch.Tensor | float | None = None


def step_guard(
    guard: Guard | None,
    optimizer: torch.optim.Optimizer | None,
    options: TraceOptions,
    device: torch.device,
    layout: Layout,
    rank: int,
) -> StepGuard | None:
    """The guard's state for a Tracer, after checking that this Tracer can guard at all."""
    if guard is None:
        return None
    if not isinstance(guard, Guard):
        raise ConfigError(f"Tracer(guard=...) takes a tracer.guard.Guard, found {type(guard).__name__}")
    if optimizer is None or not options.gradients:
        raise ConfigError(
            "the guard checks each step in the optimizer's pre-hook, from the recorded gradients: "
            "give the Tracer the optimizer and keep TraceOptions(gradients=True)"
        )
    if is_lazy(device):
        raise ConfigError(
            f"the guard reads each step's evidence before the optimizer step, which a lazy device "
            f"({device}) only computes at the step's end: guard on an eager device (cpu, cuda)"
        )
    return StepGuard(guard, optimizer, layout, rank)


def step_loss(losses: list[float], result: Any) -> float | None:
    """A run's loss: its logged microbatch losses, or else what its closure returned."""
    if losses:
        return sum(losses)
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        return float(result.detach())
    return float(result) if isinstance(result, int | float) else None


def check_step(
    g: StepGuard,
    step: int,
    optimizer: torch.optim.Optimizer,
    first: Attempt,
    rerun: Callable[[], Any] | None,
    *,
    use_sink: Callable[[RecordSink], None],
    run_again: Callable[[Callable[[], Any]], Attempt],
    checkpoint: Callable[[], str | None],
) -> Any:
    """Decide step ``step`` from its ``first`` run; returns what the accepted run's closure returned.

    ``use_sink`` points the Tracer's records at the sink the guard gives, ``run_again`` runs the step again
    with ``rerun`` (None: the step cannot be re-run) and records its gradients, ``checkpoint`` saves the state
    a ``stop`` leaves (its path, or None for a Tracer without a run directory)."""
    g.pending = False
    alarms = g.guard.check(_evidence(g, step, optimizer, first))
    alarmed, cannot_rerun = g.ranks.any_of(bool(alarms), rerun is None)  # one all-reduce a step, on every rank
    if not alarmed:
        use_sink(g.accept())
        return first.result
    last = first
    if cannot_rerun or rerun is None:
        _warn_no_rerun(g, step)
        outcome: Outcome = "unclassified"
    else:
        mine: Outcome | None = None  # this rank's outcome, kept once decided: another rank may need more runs
        while g.ranks.any_of((mine := mine or classify(g.fingerprints, g.guard.max_runs)) is None)[0]:
            use_sink(g.next_run())
            last = run_again(rerun)
            _evidence(g, step, optimizer, last)
        assert mine is not None, "the loop ends once every rank decided"
        outcome = g.ranks.worst(mine)
    decided = verdict(outcome, g.guard.on_deterministic, last.index)
    if decided.action != "continue":
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
    result = g.result
    use_sink(g.settle(step, decided, alarms))
    if decided.action == "stop":
        g.restore_rng()  # the checkpoint holds the state the step began from, as every checkpoint does
        path = checkpoint()
        said = "; ".join(f"{a.detector} {a.measured:.4g} > {a.threshold:.4g}" for a in alarms)
        raise GuardStop(step, outcome, said, path)
    return result


def _evidence(g: StepGuard, step: int, optimizer: torch.optim.Optimizer, run: Attempt) -> Evidence:
    return g.evidence(step, run.index, run.loss, run.grads, optimizer, run.result, run.grad_norm)


def _warn_no_rerun(g: StepGuard, step: int) -> None:
    if not g.warned_no_rerun:
        g.warned_no_rerun = True
        warnings.warn(
            f"step {step}: a guard detector fired but the step cannot be run again (no "
            "tracer.step(..., rerun=fn) and no re-runnable optimizer closure): its alarm is logged as "
            f"unclassified and the policy on_deterministic={g.guard.on_deterministic!r} applies",
            TraceWarning,
            stacklevel=4,
        )
