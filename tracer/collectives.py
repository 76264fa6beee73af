"""Observation points around collectives, so communication can be told apart from compute.

A model's collective (all-reduce, reduce-scatter, all-gather, all-to-all, a pipeline stage's send
and recv) calls `observe` with its input before and its output after the communication; the `Tracer` records both
fingerprints and the fault emulator may corrupt the output. A rank whose compute
is healthy but whose received data differ has a communication fault; a rank whose
collective input already differs was corrupted before it communicated.

Observers run innermost first (the last one installed sees a tensor first), as
dispatch modes do: an emulator entered inside a Tracer corrupts, then the Tracer
records what flows on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import torch

from tracer.log.records import Phase

__all__ = ["OPS", "Observer", "Stage", "observe", "observing", "record_name", "unobserved"]

Stage = Literal["in", "out"]
# (point name, op, phase, stage, tensor) -> a replacement tensor, or None to leave it.
Observer = Callable[[str, str, Phase, Stage, torch.Tensor], "torch.Tensor | None"]
OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send", "recv")

_observers: list[Observer] = []


def record_name(point: str, op: str, stage: Stage) -> str:
    """The traced name of one side of one collective, e.g. ``layers.0.attention_out.reduce_scatter.in``."""
    return f"{point}.{op}.{stage}"


def observe(point: str, op: str, phase: Phase, stage: Stage, tensor: torch.Tensor) -> torch.Tensor:
    """Show ``tensor`` to every observer; returns what the collective continues with."""
    for observer in reversed(_observers):
        replaced = observer(point, op, phase, stage, tensor)
        if replaced is not None:
            tensor = replaced
    return tensor


@contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Install ``observer`` for the duration of the block."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


@contextmanager
def unobserved() -> Iterator[None]:
    """Hide every installed observer (replay runs the suspect inside the golden Tracer's block)."""
    saved = _observers[:]
    _observers.clear()
    try:
        yield
    finally:
        _observers[:] = saved
