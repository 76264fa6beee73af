"""Golden state injected into the suspect's step: the parameter sync before it, and lockstep's
compare-and-overwrite at every site during it.

    sync_parameters(golden_w.model, suspect_w.model)           # both modes: start from the golden parameters
    clock = StepClock(step)                                    # what run_step and the fault emulator report to
    with observing(lockstep_receives(golden, clock, report)):   # lockstep, a pipeline stage's receives
        with lockstep_hooks(sites, golden, clock, report):     # lockstep; param-sync: passthrough_hooks(sites)
            run_step(suspect_w, step, clock, update=False)

``golden`` holds the golden re-execution's tensors by `replay.golden.Key`; each
site's output (forward) and input gradient (backward) is compared with its golden
tensor, reported, and replaced by it, so every site computes on golden inputs and
its own error is isolated (RQ1). Under pipeline parallelism what a stage receives from
another (its input activation forward, its output's gradient backward) is compared and
replaced the same way, so a stage computes on golden inputs whatever its neighbour sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from replay.golden import Key
from replay.metrics import Mismatch, mismatch
from tracer.collectives import OPS, Observer, Stage, record_name
from tracer.intercept import own_ops
from tracer.log.records import Phase
from tracer.site_hooks import SiteHooks, substitute


class StepClock:
    """The step/microbatch bookkeeping `run_step` and the fault emulator need, without a log."""

    def __init__(self, step: int) -> None:
        self.step_index = step
        self.microbatch_index = 0

    def microbatch(self, index: int, inputs: Any = None) -> None:
        self.microbatch_index = index

    def loss(self, value: torch.Tensor | float) -> None:
        pass  # `run_step` returns the step's loss


def sync_parameters(golden: nn.Module, suspect: nn.Module) -> None:
    """Give the suspect the golden parameters; it never updates, so no optimizer state is needed."""
    with own_ops(), torch.no_grad():
        for g, s in zip(golden.state_dict().values(), suspect.state_dict().values()):
            s.copy_(g)


def passthrough_hooks(sites: list[tuple[str, nn.Module]]) -> SiteHooks:
    """Site hooks that change nothing: the same hooks as lockstep's and the golden Tracer's, so a param-sync
    suspect sums its gradients in the same order."""
    return SiteHooks(sites, on_output=_unchanged, on_input_grad=_unchanged)


def _unchanged(site: str, tensor: torch.Tensor) -> None:
    return None


def lockstep_hooks(
    sites: list[tuple[str, nn.Module]],
    golden: dict[Key, torch.Tensor],
    clock: StepClock,
    report: Callable[[int, str, Phase, Mismatch], None],
) -> SiteHooks:
    """Compare each site's output and input gradient with the golden one, report it, and go on with the golden one."""

    def overwrite(phase: Phase) -> Callable[[str, torch.Tensor], torch.Tensor]:
        def callback(site: str, suspect: torch.Tensor) -> torch.Tensor:
            mb = clock.microbatch_index
            g = golden[(clock.step_index, mb, site, phase)]
            with own_ops():
                report(mb, site, phase, mismatch(suspect, g))
                return g.clone()

        return callback

    return SiteHooks(sites, on_output=overwrite(Phase.FORWARD), on_input_grad=overwrite(Phase.BACKWARD))


def lockstep_receives(
    golden: dict[Key, torch.Tensor], clock: StepClock, report: Callable[[int, str, Phase, Mismatch], None]
) -> Observer:
    """A collective observer (`tracer.collectives.observing`) that compares what a pipeline stage received
    (``pipeline.S-D.recv.out``, forward and backward) with the golden tensor, reports it under that name, and goes
    on with the golden one. Install it outside the suspect's fault emulator, so that a corrupted receive is
    compared before it is overwritten. Other collectives pass unchanged."""

    def observer(point: str, op: str, phase: Phase, stage: Stage, tensor: torch.Tensor) -> torch.Tensor | None:
        if op != "recv" or stage != "out":
            return None
        name, mb = record_name(point, op, stage), clock.microbatch_index
        g = golden[(clock.step_index, mb, name, phase)]
        with own_ops():
            report(mb, name, phase, mismatch(tensor, g))
            # Forward: the gradient must still reach the stage's receive buffer, to be sent back. Backward (a
            # tensor hook on the gradient): a plain tensor.
            return substitute(tensor, g) if tensor.requires_grad else g.clone()

    return observer


def compared_in_lockstep(name: str) -> bool:
    """Whether lockstep compares the record ``name``: a site's, or what a pipeline stage received
    (`lockstep_receives`); not another side of a collective, which flows unchanged."""
    point, _, stage = name.rpartition(".")
    op = point.rpartition(".")[2]
    return op not in OPS or stage not in ("in", "out") or (op, stage) == ("recv", "out")
