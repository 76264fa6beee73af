"""`tracer.pipeline` on one process: what a stage receives and sends is shown to the collective observers, forward
and backward, once per pass, and `TracedStage` tells the Tracer each chunk's microbatch (tests/parallel/
test_pipeline.py runs it on gloo ranks)."""

from __future__ import annotations

import torch

from tracer.collectives import observing
from tracer.log.records import Phase
from tracer.pipeline import link, received, sent


def test_a_stage_shows_what_it_received_and_sent_and_their_gradients_once_per_pass() -> None:
    seen: list[tuple[str, str, Phase, str, float]] = []

    def observer(point: str, op: str, phase: Phase, stage: str, tensor: torch.Tensor) -> torch.Tensor | None:
        seen.append((point, op, phase, stage, float(tensor.sum())))
        return tensor * 2 if (op, phase) == ("recv", Phase.BACKWARD) else None  # what came back, corrupted

    buffer = torch.ones(3, requires_grad=True)  # a stage's receive buffer, reused by every pass
    weight = torch.full((3,), 3.0, requires_grad=True)
    with observing(observer):
        for _ in range(2):
            seen.clear()
            buffer.grad = None
            y = sent(received(buffer, stage=1) * weight, stage=1)
            y.sum().backward()
            assert seen == [
                (link(0, 1), "recv", Phase.FORWARD, "out", 3.0),
                (link(1, 2), "send", Phase.FORWARD, "in", 9.0),
                (link(2, 1), "recv", Phase.BACKWARD, "out", 3.0),
                (link(1, 0), "send", Phase.BACKWARD, "in", 18.0),  # the corrupted gradient, once: no stale hook
            ], seen
            assert buffer.grad.tolist() == [6.0, 6.0, 6.0]
    assert link(3, 2) == "pipeline.3-2"
