"""Tracing a ``torch.distributed.pipelining`` stage: which microbatch it runs, and what crosses to the next stage.

    stage = TracedStage(stage_module, index, stages, device, input_args=..., output_args=...)
    schedule = Schedule1F1B(stage, microbatches, loss_fn=...)
    stage.observer = tracer                   # for the step: tracer.microbatch(i) before each chunk's pass
    schedule.step(...)

A schedule runs the microbatches' forwards and backwards in its own order (1F1B interleaves them), so the
Tracer cannot count them: `TracedStage` tells it the chunk's index before each forward (with the inputs, on the
first stage) and each backward, and the log's microbatch is the pipeline's.

Inside the stage's module, `received` (on the stage's input, from the stage before) and `sent` (on its output,
to the stage after) make what crosses ranks collective events (`tracer.collectives`) named after the link:
``pipeline.S-D.send.in`` on stage S and ``pipeline.S-D.recv.out`` on stage D, in the forward for activations
(S = D - 1) and in the backward for their gradients (S = D + 1). A stage that only received a corrupted tensor
first differs at its ``recv``; the diff ranks such a rank after the one that sent it (`analysis/schema.sql`,
``first_divergence_ranked``), by the link's destination stage.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.distributed.pipelining import PipelineStage

from tracer.collectives import observe
from tracer.log.records import Phase

__all__ = ["TracedStage", "link", "received", "sent"]


class MicrobatchObserver(Protocol):
    """What a stage reports to: a `tracer.tracing.Tracer` (its ``microbatch``)."""

    def microbatch(self, index: int, inputs: Any = None) -> None: ...


def link(source: int, destination: int) -> str:
    """The collective point of what stage ``source`` sends to stage ``destination``: ``pipeline.0-1``."""
    return f"pipeline.{source}-{destination}"


def received(x: torch.Tensor, stage: int) -> torch.Tensor:
    """Stage ``stage``'s input as received from the stage before (forward); its gradient is what goes back."""
    x = observe(link(stage - 1, stage), "recv", Phase.FORWARD, "out", x)
    if x.requires_grad:  # the stage's receive buffer lives on from step to step: a hook on a view of this pass
        x = x.view_as(x)
        x.register_hook(lambda g: observe(link(stage, stage - 1), "send", Phase.BACKWARD, "in", g))
    return x


def sent(y: torch.Tensor, stage: int) -> torch.Tensor:
    """Stage ``stage``'s output as sent to the stage after (forward); its gradient is what comes back."""
    y = observe(link(stage, stage + 1), "send", Phase.FORWARD, "in", y)
    if y.requires_grad:
        y.register_hook(lambda g: observe(link(stage + 1, stage), "recv", Phase.BACKWARD, "out", g))
    return y


class TracedStage(PipelineStage):
    """A `PipelineStage` that tells ``observer`` which pipeline microbatch it runs, before each chunk's forward
    (with its inputs, on the first stage) and before each chunk's backward. Set ``observer`` for a step and
    clear it after (None: nothing is told)."""

    observer: MicrobatchObserver | None = None

    def forward_one_chunk(self, fwd_chunk_id: int, args: tuple[Any, ...], *rest: Any, **kwargs: Any) -> Any:
        if self.observer is not None:
            self.observer.microbatch(fwd_chunk_id, inputs=args[0] if self.is_first and args else None)
        return super().forward_one_chunk(fwd_chunk_id, args, *rest, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id: int, *rest: Any, **kwargs: Any) -> Any:
        if self.observer is not None:
            self.observer.microbatch(bwd_chunk_id)
        return super().backward_one_chunk(bwd_chunk_id, *rest, **kwargs)
