"""An emulated unhealthy node around a traced training loop: the fault emulator and/or the ABFT
checker, logging their events through the run's Tracer at its current step and microbatch.

Around a loop of your own, enter `emulated_node` inside the Tracer; a framework callback
(`tracer.integrations`) takes `node_options` instead, since it opens the Tracer itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from torch import nn

from faults.abft import AbftChecker
from faults.emulator import FaultEmulator
from faults.profile import FaultProfile
from tracer.tracing import Tracer


def node_header(fault_profile: FaultProfile | None, fault_seed: int, abft: bool) -> dict[str, Any]:
    """What a run header's ``extra`` says about the node's emulated faults and ABFT checks."""
    extra: dict[str, Any] = {}
    if fault_profile is not None:
        extra["fault_profile"] = fault_profile.header(fault_seed)
    if abft:
        extra["abft"] = True
    return extra


def emulated_node(
    tracer: Tracer,
    model: nn.Module,
    *,
    fault_profile: FaultProfile | None = None,
    fault_seed: int = 0,
    abft: bool = False,
) -> AbstractContextManager[None]:
    """A context in which this node plays an unhealthy one and/or checks every matmul, logging
    ``fault`` and ``abft`` events through ``tracer`` (enter the tracer first). Both know the sites ``tracer``
    traces (`Tracer.site_names`, matched once, however they were chosen), so a hit names the site it is in.

    Built now, entered later: a profile that does not fit the model fails before anything is recorded.
    Rules that name ``roles`` fire only if the tracer's run role (``"train"``, ``"finetune"``) is one of them.
    """

    def clock() -> tuple[int, int, int]:
        return tracer.step_index, tracer.microbatch_index, tracer.attempt  # attempt: the guard's re-runs

    def sink(kind: str, fields: dict[str, Any]) -> None:
        tracer.event(kind, **fields)

    # Emulator first, checker second: the checker then sees the corrupted results.
    modes: list[FaultEmulator | AbftChecker] = []
    if fault_profile is not None:
        modes.append(
            FaultEmulator(
                fault_profile,
                model,
                clock=clock,
                sink=sink,
                seed=fault_seed,
                sites=tracer.site_names,
                role=tracer.run_info.role,
            )
        )
    if abft:
        modes.append(AbftChecker(model, clock=clock, sink=sink, sites=tracer.site_names))
    return _entered(modes)


def node_options(
    fault_profile: FaultProfile | None,
    fault_seed: int = 0,
    *,
    abft: bool = False,
) -> dict[str, Any]:
    """The ``around`` and ``extra`` keyword arguments of a framework callback (`tracer.integrations`) that make
    its run play this node: ``SdcTraceCallback(out, label, options=TraceOptions(sites=...), **node_options(profile,
    3))``. The node knows the sites the callback's Tracer traces (`emulated_node`)."""

    def around(tracer: Tracer, model: nn.Module) -> AbstractContextManager[None]:
        return emulated_node(tracer, model, fault_profile=fault_profile, fault_seed=fault_seed, abft=abft)

    return {"around": around, "extra": node_header(fault_profile, fault_seed, abft)}


@contextmanager
def _entered(modes: list[FaultEmulator | AbftChecker]) -> Iterator[None]:
    with ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode)
        yield
